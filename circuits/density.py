"""The noisy density-matrix path: a batch of density matrices (B, 2^n, 2^n), gate by gate, with the
channels of a ``noise`` section after every gate (docs/circuits.md, "Shots, noise and hardware
gradients").

A density matrix rho is held as a vector of 4^n entries whose index interleaves row and column bits
wire by wire, (a_0 b_0)(a_1 b_1)..., wire 0 first (most significant), for rho[a, b]. Each wire is then
one base-4 digit, and a single-qubit map on wire w, unitary or not, is one 4 x 4 superoperator S
(rho'[a, b] = sum S[(a, b), (c, d)] rho[c, d]) applied to that digit: one batched matmul, as the
state-vector engine applies a 2 x 2 gate. A unitary U has S = U (x) conj(U), a channel with Kraus
operators K_k has S = sum_k K_k (x) conj(K_k). A CNOT or CZ (a signed permutation E of basis states)
maps rho to E rho E^T: one gather of the 4^n entries with a sign.

Where the noise acts (matching ``circuits.reference.build_qnode``, which uses PennyLane's
``qml.noise.insert(position="all")``): after every gate, on every wire the gate acts on, amplitude
damping, then phase damping, then depolarizing. The gates are those of the PennyLane circuit after
templates are decomposed: per encoded qubit a Hadamard (with ``hadamard: true``) and the encoding
rotation; per ansatz layer the single-qubit gates of ``Ansatz.gates`` (Rot is one gate, RZ RY RZ are
three) and each CNOT / CZ of ``Ansatz.pairs`` (noise on its control and its target). Readout error is
a bit flip of every measured bit, applied to the outcome probabilities (``flip_readout``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from circuits import gates
from circuits.blocks import ANSATZE, ENCODINGS, LayerOptions
from circuits.engine import COMPLEX_TO_REAL, real_product_state
from circuits.spec import NoiseConfig, VQCConfig

IDENTITY = np.eye(2, dtype=np.complex128)


def kraus_operators(noise: NoiseConfig) -> list[list[np.ndarray]]:
    """The gate channels of a noise section in the order they act: each a list of Kraus operators
    (PennyLane's AmplitudeDamping, PhaseDamping, DepolarizingChannel); channels at 0 are left out."""
    channels = []
    gamma = float(noise.amplitude_damping)
    if gamma:
        channels.append([np.array([[1, 0], [0, np.sqrt(1 - gamma)]], dtype=np.complex128),
                         np.array([[0, np.sqrt(gamma)], [0, 0]], dtype=np.complex128)])
    gamma = float(noise.phase_damping)
    if gamma:
        channels.append([np.array([[1, 0], [0, np.sqrt(1 - gamma)]], dtype=np.complex128),
                         np.array([[0, 0], [0, np.sqrt(gamma)]], dtype=np.complex128)])
    p = float(noise.depolarizing)
    if p:
        channels.append([np.sqrt(1 - p) * IDENTITY] + [np.sqrt(p / 3) * pauli for pauli in (gates.PAULI_X, gates.PAULI_Y, gates.PAULI_Z)])
    return channels


def channel_superoperator(kraus: list[np.ndarray]) -> np.ndarray:
    """4 x 4 superoperator sum_k K_k (x) conj(K_k) of a single-qubit channel (interleaved (row, column) bits)."""
    return sum(np.kron(k, k.conj()) for k in kraus)


def noise_superoperator(noise: NoiseConfig) -> np.ndarray:
    """The superoperator of all gate channels of ``noise`` in their order (the identity when none is on)."""
    out = np.eye(4, dtype=np.complex128)
    for kraus in kraus_operators(noise):
        out = channel_superoperator(kraus) @ out
    return out


def unitary_superoperators(u: torch.Tensor) -> torch.Tensor:
    """U (x) conj(U) for a batch of 2 x 2 unitaries: (..., 2, 2) -> (..., 4, 4)."""
    return torch.einsum("...ac,...bd->...abcd", u, u.conj()).reshape(*u.shape[:-2], 4, 4)


def interleaved_index(rows: np.ndarray, cols: np.ndarray, n_qubits: int) -> np.ndarray:
    """The vector index of rho[rows, cols] (broadcast): wire w's digit is 2 row_bit + column_bit."""
    index = np.zeros(np.broadcast(rows, cols).shape, dtype=np.int64)
    for wire in range(n_qubits):
        shift = n_qubits - 1 - wire
        digit = 2 * ((rows >> shift) & 1) + ((cols >> shift) & 1)
        index = index * 4 + digit
    return index


def flip_readout(probabilities: torch.Tensor, p: float, n_qubits: int) -> torch.Tensor:
    """Outcome probabilities (B, 2^n) after each measured bit is flipped with probability p."""
    if not p:
        return probabilities
    batch = probabilities.shape[0]
    for wire in range(n_qubits):
        view = probabilities.reshape(batch, 2**wire, 2, 2 ** (n_qubits - wire - 1))
        probabilities = ((1.0 - p) * view + p * view.flip(-2)).reshape(batch, -1)
    return probabilities


class DensityCircuit(nn.Module):
    """The noisy circuit of one spec as a batched density-matrix simulation (see the module docstring).

    ``probabilities(angles, weights)`` returns the Z-basis outcome probabilities (B, 2^n) before
    readout error, differentiable by autograd in both arguments. angles are (B, n), or (B, layers, n)
    per encoding block with ``reupload``.
    """

    def __init__(self, cfg: VQCConfig, complex_dtype: torch.dtype = torch.complex64) -> None:
        super().__init__()
        n = cfg.n_qubits
        self.n_qubits = n
        self.layers = cfg.layers
        self.ansatz = cfg.ansatz
        self.options = LayerOptions(cfg.rotation, cfg.entangler)
        self.reupload = cfg.reupload
        self.hadamard = cfg.hadamard
        self.axis = ENCODINGS[cfg.encoding].axis
        self.entangle_first = ANSATZE[cfg.ansatz].entangle_first
        self.complex_dtype = complex_dtype
        self.real_dtype = COMPLEX_TO_REAL[complex_dtype]
        noise = cfg.noise if cfg.noise is not None else NoiseConfig()
        self.register_buffer("noise", torch.as_tensor(noise_superoperator(noise), dtype=complex_dtype), persistent=False)
        hadamard = noise_superoperator(noise) @ np.kron(gates.HADAMARD, gates.HADAMARD.conj())
        self.register_buffer("hadamard_noisy", torch.as_tensor(hadamard, dtype=complex_dtype), persistent=False)
        basis = np.arange(2**n)
        self.pairs: list[list[tuple[int, int]]] = []  # per layer: (control, target) of each gate, in order
        for layer in range(cfg.layers):
            wires = []
            for k, pair in enumerate(ANSATZE[cfg.ansatz].pairs(n, layer, self.options)):
                inverse, sign = gates.signed_permutation([pair], n)  # psi'[j] = sign[j] psi[inverse[j]]
                index = interleaved_index(inverse[:, None], inverse[None, :], n)
                signs = sign[:, None] * sign[None, :]
                order = np.argsort(interleaved_index(basis[:, None], basis[None, :], n).reshape(-1))
                self.register_buffer(f"gather_{layer}_{k}", torch.as_tensor(index.reshape(-1)[order]), persistent=False)
                self.register_buffer(f"sign_{layer}_{k}", torch.as_tensor(signs.reshape(-1)[order], dtype=self.real_dtype), persistent=False)
                wires.append((pair[1], pair[2]))
            self.pairs.append(wires)
        self.register_buffer("diagonal", torch.as_tensor(interleaved_index(basis, basis, n)), persistent=False)

    def apply_wire(self, rho: torch.Tensor, superop: torch.Tensor, wire: int) -> torch.Tensor:
        """Apply a 4 x 4 superoperator (shared, or one per batch row (B, 4, 4)) to wire ``wire`` of rho (B, 4^n)."""
        batch = rho.shape[0]
        view = rho.reshape(batch, 4**wire, 4, 4 ** (self.n_qubits - wire - 1))
        if superop.dim() == 2:
            out = torch.einsum("ij,bljr->blir", superop, view)
        else:
            out = superop.unsqueeze(1) @ view
        return out.reshape(batch, -1)

    def encoding_superoperators(self, angles: torch.Tensor) -> torch.Tensor:
        """Noise after the encoding rotation, per sample and wire: (B, n) -> (B, n, 4, 4)."""
        rotation = gates.rotation_matrices(self.axis, angles.to(self.real_dtype), self.complex_dtype)
        return self.noise @ unitary_superoperators(rotation)

    def encoded(self, angles: torch.Tensor) -> torch.Tensor:
        """rho after the first encoding block: a product of single-qubit density matrices (B, 4^n)."""
        start = torch.zeros(4, dtype=self.complex_dtype, device=angles.device)
        start[0] = 1.0  # |0><0|
        if self.hadamard:
            start = self.hadamard_noisy @ start
        vectors = self.encoding_superoperators(angles) @ start  # (B, n, 4)
        return real_product_state(vectors)

    def reencode(self, rho: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """A later encoding block (``reupload``) on every wire."""
        superops = self.encoding_superoperators(angles)  # (B, n, 4, 4)
        if self.hadamard:
            superops = superops @ self.hadamard_noisy
        for wire in range(self.n_qubits):
            rho = self.apply_wire(rho, superops[:, wire], wire)
        return rho

    def entangle(self, rho: torch.Tensor, layer: int) -> torch.Tensor:
        """Layer ``layer``'s CNOT / CZ gates in order, each followed by the noise on its two wires."""
        for k, (control, target) in enumerate(self.pairs[layer]):
            index = getattr(self, f"gather_{layer}_{k}")
            rho = rho.gather(-1, index.expand(rho.shape)) * getattr(self, f"sign_{layer}_{k}")
            rho = self.apply_wire(self.apply_wire(rho, self.noise, control), self.noise, target)
        return rho

    def rotate(self, rho: torch.Tensor, weights: torch.Tensor, layer: int) -> torch.Tensor:
        """Layer ``layer``'s single-qubit gates, each followed by the noise on its wire: a wire's gates
        and channels compose into one 4 x 4 superoperator, applied once per wire."""
        superops = None
        for matrices in ANSATZE[self.ansatz].gates(weights[layer], self.options, self.complex_dtype):
            step = self.noise @ unitary_superoperators(matrices)  # (n, 4, 4)
            superops = step if superops is None else step @ superops
        for wire in range(self.n_qubits):
            rho = self.apply_wire(rho, superops[wire], wire)
        return rho

    def probabilities(self, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Z-basis outcome probabilities (B, 2^n) of the noisy circuit (before readout error)."""
        per_block = angles.dim() == 3
        rho = self.encoded(angles[:, 0] if per_block else angles)
        for layer in range(self.layers):
            if layer > 0 and self.reupload:
                rho = self.reencode(rho, angles[:, layer] if per_block else angles)
            if self.entangle_first:
                rho = self.rotate(self.entangle(rho, layer), weights, layer)
            else:
                rho = self.entangle(self.rotate(rho, weights, layer), layer)
        return rho[:, self.diagonal].real
