"""Gate matrices and the fixed (data- and weight-free) pieces of a circuit, as pure functions.

Conventions follow PennyLane: wire 0 is the most significant bit of a basis index, and a rotation
about Pauli P by angle t is exp(-i t P / 2) = cos(t/2) I - i sin(t/2) P.
"""
from __future__ import annotations

import numpy as np
import torch

from circuits.blocks import ENCODINGS, OBSERVABLES, lookup

PAULI_X = np.array([[0, 1], [1, 0]], dtype=np.complex128)
PAULI_Y = np.array([[0, -1j], [1j, 0]], dtype=np.complex128)
PAULI_Z = np.array([[1, 0], [0, -1]], dtype=np.complex128)
HADAMARD = np.array([[1, 1], [1, -1]], dtype=np.complex128) / np.sqrt(2.0)

ROTATION_AXES: dict[str, np.ndarray] = {"rx": PAULI_X, "ry": PAULI_Y, "rz": PAULI_Z}
ENTANGLING_GATES = ("cnot", "cz")
PENNYLANE_GATES = {"rx": "RX", "ry": "RY", "rz": "RZ"}  # names of qml gates, looked up when used


def basis_bits(n_qubits: int) -> np.ndarray:
    """(2^n, n) array of the bits of every basis index, wire 0 first (most significant)."""
    idx = np.arange(2**n_qubits)[:, None]
    return (idx >> (n_qubits - 1 - np.arange(n_qubits))[None, :]) & 1


def half_angle_vectors(angles, batch_last: bool = False):
    """Per-wire (cos(t/2), sin(t/2)) of encoding angles (..., n): (..., n, 2), or with ``batch_last``
    (angles (B, n), numpy) (n, 2, B); torch tensors or numpy arrays."""
    if batch_last:
        half = 0.5 * angles.T  # (n, B)
        return np.stack([np.cos(half), np.sin(half)], axis=1)
    half = angles * 0.5
    if isinstance(half, torch.Tensor):
        return torch.stack([torch.cos(half), torch.sin(half)], dim=-1)
    return np.stack([np.cos(half), np.sin(half)], axis=-1)


def kron_vectors(vectors, batch_last: bool = False):
    """The Kronecker product over wires of per-wire vectors, wire 0 first: (..., n, d) -> (..., d^n)
    wire by wire (torch or numpy), or with ``batch_last`` (numpy, (n, d, B) -> (d^n, B)) as neighbouring
    pairs multiplied as a balanced tree (wire by wire, the large products were built n - 1 times, and
    at a few rows each step's call was the cost: 1.6x faster at 8 qubits and 3 rows, 2.2x at 12 qubits
    and one row). The two orders round differently in the last bit; each executor keeps its own (the
    goldens hold the torch order)."""
    if batch_last:
        batch, half = vectors.shape[-1], len(vectors) // 2
        pairs = (vectors[0 : 2 * half : 2, :, None] * vectors[1 : 2 * half : 2, None]).reshape(half, vectors.shape[1] ** 2, batch)
        return _kron_tree(list(pairs) + ([vectors[-1]] if len(vectors) % 2 else []), batch)
    state = vectors[..., 0, :]
    if isinstance(state, torch.Tensor):
        for wire in range(1, vectors.shape[-2]):
            state = (state.unsqueeze(-1) * vectors[..., wire, None, :]).flatten(-2)
        return state
    for wire in range(1, vectors.shape[-2]):
        state = (state[..., :, None] * vectors[..., wire, None, :]).reshape(*state.shape[:-1], -1)
    return state


def _kron_tree(factors: list[np.ndarray], batch: int) -> np.ndarray:
    """The Kronecker product of factors (d_i, B) in order, as a balanced tree."""
    if len(factors) <= 2:
        out = factors[0]
        for factor in factors[1:]:
            out = (out[:, None] * factor[None]).reshape(-1, batch)
        return out
    middle = len(factors) // 2
    first, rest = _kron_tree(factors[:middle], batch), _kron_tree(factors[middle:], batch)
    return (first[:, None] * rest[None]).reshape(-1, batch)


def product_state(angles, bit_shifts=None, state_map=None, batch_last: bool = False):
    """The encoded product state of encoding angles (B, n): the one builder every executor calls (the
    compiled kernels build the same inside their loop nest).

    Without ``state_map``: the real product vector r (B, 2^n), r_k = prod_i cos(t_i/2 - bit_i(k) pi/2),
    i.e. the Kronecker product of the wires' (cos(t_i/2), sin(t_i/2)). With ``bit_shifts``
    (``basis_bits(n).T * pi/2``, (n, 2^n)) as one fused cos over (B, n, 2^n) and a product over the
    wires (the dense executor on the CPU up to 8 qubits: one expression; not on CUDA, where prod's
    backward syncs with the host); else by ``kron_vectors``. With ``state_map`` (the encoding's F),
    the complex state F^(x)n r. ``batch_last`` (numpy): r as (2^n, B) (the statevector executor's
    layout). Torch tensors or numpy arrays."""
    if bit_shifts is not None:
        if isinstance(angles, torch.Tensor):
            return torch.cos(angles.unsqueeze(-1) * 0.5 - bit_shifts).prod(-2)
        return np.cos(angles[..., :, None] * 0.5 - bit_shifts).prod(axis=-2)
    vectors = half_angle_vectors(angles, batch_last)
    if state_map is not None:
        if isinstance(vectors, torch.Tensor):
            vectors = vectors.to(state_map.dtype) @ state_map.T
        else:
            vectors = vectors.astype(state_map.dtype) @ state_map.T
    return kron_vectors(vectors, batch_last)


def encoding_state_map(encoding: str, hadamard: bool) -> np.ndarray:
    """2x2 complex F with R_P(t) h |0> = F @ (cos(t/2), sin(t/2)) for the encoding's Pauli P.

    h is the Hadamard when ``hadamard`` else the identity. Writing the encoded single-qubit state as
    a fixed matrix times a real vector lets the dense engine fold F into the cached circuit matrix.
    """
    pauli = ROTATION_AXES[ENCODINGS[encoding].axis]
    h = HADAMARD if hadamard else np.eye(2, dtype=np.complex128)
    start = h @ np.array([1.0, 0.0], dtype=np.complex128)
    return np.stack([start, -1j * (pauli @ start)], axis=1)  # encoding_gate_parts(...)[:, :, 0] (up to zeros' signs)


def encoding_gate_parts(encoding: str, hadamard: bool) -> np.ndarray:
    """(2, 2, 2) complex128 [h, -i P h]: the encoding's gate on one qubit is R_P(t) h = cos(t/2) h +
    sin(t/2) (-i P h), linear in (cos(t/2), sin(t/2)) (h the Hadamard when ``hadamard``, else the
    identity). Its first columns are F (``encoding_state_map``: the gate on |0>); a re-uploaded block
    applies the whole gate to a state (``encoding_gate_matrices`` in torch, the statevector executor's
    ``circuits.program.Program.upload_gate`` in numpy)."""
    pauli = ROTATION_AXES[ENCODINGS[encoding].axis]
    h = HADAMARD if hadamard else np.eye(2, dtype=np.complex128)
    return np.stack([h, -1j * (pauli @ h)])


def encoding_generator(encoding: str) -> np.ndarray:
    """(2, 2) complex128 -i P / 2 of the encoding's Pauli P: d/dt R_P(t) h = (-i P / 2) R_P(t) h, so an
    encoding angle's gradient is Re <lambda, (-i P / 2) psi> at the gate's output state psi."""
    return -0.5j * ROTATION_AXES[ENCODINGS[encoding].axis]


def rotation_matrices(axis: str, angles: torch.Tensor, complex_dtype: torch.dtype) -> torch.Tensor:
    """Batched R_axis(angles): (...,) real angles -> (..., 2, 2) complex matrices.

    Written entry by entry from cos and sin (no host-side constants, so it can be captured in a
    CUDA graph), with one complex op for autograd.
    """
    real_dtype = torch.float32 if complex_dtype == torch.complex64 else torch.float64
    half = angles.to(real_dtype) * 0.5
    cos, sin = torch.cos(half), torch.sin(half)
    zero = torch.zeros_like(cos)
    if axis == "rx":  # [[c, -i s], [-i s, c]]
        real, imag = (cos, zero, zero, cos), (zero, -sin, -sin, zero)
    elif axis == "ry":  # [[c, -s], [s, c]]
        real, imag = (cos, -sin, sin, cos), (zero, zero, zero, zero)
    elif axis == "rz":  # [[c - i s, 0], [0, c + i s]]
        real, imag = (cos, zero, zero, cos), (-sin, zero, zero, sin)
    else:
        raise AssertionError(f"unknown rotation axis {axis!r}")
    entries = torch.complex(torch.stack(real, dim=-1), torch.stack(imag, dim=-1))
    return entries.reshape(*angles.shape, 2, 2)


def encoding_gate_matrices(encoding: str, hadamard: bool, angles: torch.Tensor, complex_dtype: torch.dtype) -> torch.Tensor:
    """Batched matrices of one encoding block on one qubit, R_P(angle) h: (...,) -> (..., 2, 2)."""
    rot = rotation_matrices(ENCODINGS[encoding].axis, angles, complex_dtype)
    if not hadamard:
        return rot
    # R H: column 0 is (R[:, 0] + R[:, 1]) / sqrt 2, column 1 is (R[:, 0] - R[:, 1]) / sqrt 2
    first, second = rot[..., :, 0], rot[..., :, 1]
    return torch.stack([first + second, first - second], dim=-1) * (0.5**0.5)


def rot_matrices(weights: torch.Tensor, complex_dtype: torch.dtype) -> torch.Tensor:
    """Batched RZ(w2) RY(w1) RZ(w0) (PennyLane's Rot(phi=w0, theta=w1, omega=w2)): (..., 3) -> (..., 2, 2).

    Rot = [[c e^{-i a}, -s e^{i b}], [s e^{-i b}, c e^{i a}]], c, s = cos, sin(theta/2),
    a = (phi + omega)/2, b = (phi - omega)/2; built from real parts with one complex op.
    """
    real_dtype = torch.float32 if complex_dtype == torch.complex64 else torch.float64
    phi, theta, omega = weights.to(real_dtype).unbind(-1)
    cos, sin = torch.cos(theta * 0.5), torch.sin(theta * 0.5)
    plus, minus = (phi + omega) * 0.5, (phi - omega) * 0.5
    magnitude = torch.stack([cos, -sin, sin, cos], dim=-1)
    phase = torch.stack([-plus, minus, -minus, plus], dim=-1)
    entries = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    return entries.reshape(*weights.shape[:-1], 2, 2)


def rot_matrices_np(weights: np.ndarray) -> np.ndarray:
    """``rot_matrices`` in numpy complex128 (the analytic-gradient path builds small matrices, where
    numpy's per-call cost is a fraction of torch's): (..., 3) -> (..., 2, 2)."""
    half = np.exp(-0.5j * weights)  # e^{-i phi/2}, cos(theta/2) - i sin(theta/2), e^{-i omega/2}
    phi, theta, omega = half[..., 0], half[..., 1], half[..., 2]
    cos, sin = theta.real, -theta.imag
    plus, minus = phi * omega, phi.conj() * omega  # e^{-ia}, e^{ib}: a = (phi + omega)/2, b = (phi - omega)/2
    out = np.empty(weights.shape[:-1] + (2, 2), dtype=np.complex128)
    out[..., 0, 0] = cos * plus
    out[..., 0, 1] = -sin * minus
    out[..., 1, 0] = sin * minus.conj()
    out[..., 1, 1] = cos * plus.conj()
    return out


def rot_layer(weights: torch.Tensor, options: object, complex_dtype: torch.dtype) -> torch.Tensor:
    """``Ansatz.matrices`` of a family with a Rot (3 weights) per qubit: (..., n, 3) -> (..., n, 2, 2)."""
    return rot_matrices(weights, complex_dtype)


def rot_layer_np(weights: np.ndarray, options: object) -> np.ndarray:
    """``Ansatz.matrices_np`` of a family with a Rot (3 weights) per qubit."""
    return rot_matrices_np(weights)


def rotation_matrices_np(axis: str, angles: np.ndarray) -> np.ndarray:
    """``rotation_matrices`` in numpy complex128: (...,) -> (..., 2, 2)."""
    half = angles * 0.5
    identity = np.eye(2, dtype=np.complex128)
    pauli = ROTATION_AXES[axis]
    return np.cos(half)[..., None, None] * identity - 1j * np.sin(half)[..., None, None] * pauli


def signed_permutation(pairs: list[tuple[str, int, int]], n_qubits: int) -> tuple[np.ndarray, np.ndarray]:
    """A product of CNOT/CZ gates as E|k> = s_k |pi(k)>, returned as (pi^-1, s o pi^-1).

    A state vector transforms as psi'[j] = s[pi^-1(j)] psi[pi^-1(j)], i.e. ``psi[..., inv] * sign``.
    """
    dim = 2**n_qubits
    image = np.arange(dim)
    sign = np.ones(dim)
    for gate, control, target in pairs:
        control_bit = (image >> (n_qubits - 1 - control)) & 1
        target_mask = 1 << (n_qubits - 1 - target)
        if gate == "cnot":
            image = np.where(control_bit == 1, image ^ target_mask, image)
        elif gate == "cz":
            target_bit = (image & target_mask) > 0
            sign = np.where((control_bit == 1) & target_bit, -sign, sign)
        else:
            raise AssertionError(f"unknown entangling gate {gate!r}")
    inverse = np.empty(dim, dtype=np.int64)
    inverse[image] = np.arange(dim)
    return inverse, sign[inverse]


def readout_matrix(observable: str, n_qubits: int) -> np.ndarray:
    """(2^n, m) real matrix R with readouts = probabilities @ R (diagonal observables only)."""
    family = lookup(OBSERVABLES, "observable", observable)
    bits = basis_bits(n_qubits)
    z_values = 1.0 - 2.0 * bits  # <k|Z_i|k> for every basis state k and wire i
    columns = [family.value(np.prod(z_values[:, list(wires)], axis=1)) for wires in family.wires(n_qubits)]
    return np.stack(columns, axis=1)
