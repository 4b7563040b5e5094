"""The noisy density-matrix path: a batch of density matrices, gate by gate, with the channels of a
``noise`` section after every gate (docs/circuits.md, "Shots, noise and hardware gradients").

A density matrix is held by its Pauli components r_P = Tr(P rho), P running over the 4^n Pauli
strings (the Pauli transfer, or Pauli-Liouville, representation): a real vector of 4^n entries per
batch row, one base-4 digit per wire (I, X, Y, Z = 0..3), wire 0 first (most significant). Every
map is then real:

- a single-qubit map on wire w, unitary or a channel, is a real 4 x 4 Pauli transfer matrix (PTM)
  applied to that digit (one batched matmul), obtained from its superoperator S (sum_k K_k (x)
  conj(K_k) over Kraus operators, on interleaved (row, column) bits) as T S T^-1;
- a CNOT or CZ, a Clifford gate, maps Pauli strings to Pauli strings with a sign: one gather;
- depolarizing and phase damping only scale Pauli components (diagonal PTMs), so a layer's CNOT /
  CZ gates with the noise after each fold into one gather and one scaling at construction time;
  amplitude damping (not diagonal: it pulls Z towards +1) is applied wire by wire after each gate.

The outcome probabilities come from the Z-only components: p(z) = 2^-n sum_S (-1)^(z . S) r_(Z_S).

Where the noise acts (matching ``circuits.reference.build_qnode``, which uses PennyLane's
``qml.noise.insert(position="all")``): after every gate, on every wire the gate acts on, amplitude
damping, then phase damping, then depolarizing. The gates are those of the PennyLane circuit after
templates are decomposed: per encoded qubit a Hadamard (with ``hadamard: true``) and the encoding
rotation; per ansatz layer the single-qubit gates of ``Ansatz.gates`` (Rot is one gate, RZ RY RZ are
three) and each CNOT / CZ of ``Ansatz.pairs`` (noise on its control and its target). Readout error is
a bit flip of every measured bit, applied to the outcome probabilities (``flip_readout``).
"""
from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from circuits import gates
from circuits.blocks import ANSATZE, ENCODINGS, LayerOptions
from circuits.engine import COMPLEX_TO_REAL
from circuits.spec import NoiseConfig, VQCConfig

IDENTITY = np.eye(2, dtype=np.complex128)
PAULIS = (IDENTITY, gates.PAULI_X, gates.PAULI_Y, gates.PAULI_Z)
# r_i = Tr(P_i rho) = sum_ab P_i[b, a] rho[a, b]: T maps vec(rho) (index 2a + b) to Pauli components
TO_PAULI = np.stack([p.T.reshape(-1) for p in PAULIS])
FROM_PAULI = np.stack([p.reshape(-1) for p in PAULIS], axis=1) / 2.0  # rho = sum_i r_i P_i / 2


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
    return (u[..., :, None, :, None] * u.conj()[..., None, :, None, :]).reshape(*u.shape[:-2], 4, 4)


def pauli_transfer(superop: np.ndarray) -> np.ndarray:
    """The real 4 x 4 PTM R[i, j] = Tr(P_i S(P_j)) / 2 of a single-qubit superoperator (numpy)."""
    return (TO_PAULI @ superop @ FROM_PAULI).real


def clifford_pauli_map(gate: str) -> tuple[np.ndarray, np.ndarray]:
    """A CNOT or CZ on (control, target) as a map of two-qubit Pauli strings (index 4 d_c + d_t):
    U P_j U^dagger = sign[i] P_i for i = image[j]; returned as (preimage, sign) per output string."""
    inverse, sign = gates.signed_permutation([(gate, 0, 1)], 2)
    unitary = np.zeros((4, 4))
    unitary[np.arange(4), inverse] = sign  # psi'[j] = sign[j] psi[inverse[j]]
    strings = [np.kron(a, b) for a, b in itertools.product(PAULIS, PAULIS)]
    transfer = np.array([[np.trace(p @ unitary @ q @ unitary.T).real / 4 for q in strings] for p in strings])
    preimage = np.abs(transfer).argmax(axis=1)
    signs = transfer[np.arange(16), preimage]
    assert np.allclose(np.abs(transfer).sum(axis=1), 1.0) and np.allclose(np.abs(signs), 1.0)
    return preimage, signs


def pauli_digits(n_qubits: int) -> np.ndarray:
    """(4^n, n) the Pauli digit of every wire for every string index, wire 0 first."""
    index = np.arange(4**n_qubits)
    return np.stack([(index >> (2 * (n_qubits - 1 - wire))) & 3 for wire in range(n_qubits)], axis=1)


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
        self.real_dtype = real = COMPLEX_TO_REAL[complex_dtype]
        noise = cfg.noise if cfg.noise is not None else NoiseConfig()
        liouville = noise_superoperator(noise)
        noise_ptm = pauli_transfer(liouville)
        self.register_buffer("noise", torch.as_tensor(liouville, dtype=complex_dtype), persistent=False)
        self.register_buffer("noise_ptm", torch.as_tensor(noise_ptm, dtype=real), persistent=False)
        self.register_buffer("to_pauli", torch.as_tensor(TO_PAULI, dtype=complex_dtype), persistent=False)
        self.register_buffer("from_pauli", torch.as_tensor(FROM_PAULI, dtype=complex_dtype), persistent=False)
        hadamard = pauli_transfer(liouville @ np.kron(gates.HADAMARD, gates.HADAMARD.conj()))
        self.register_buffer("hadamard_noisy", torch.as_tensor(hadamard, dtype=real), persistent=False)
        start = np.array([1.0, 0.0, 0.0, 1.0])  # |0><0| = (I + Z) / 2
        self.register_buffer("start", torch.as_tensor(hadamard @ start if cfg.hadamard else start, dtype=real), persistent=False)
        # entangling gates: with a diagonal noise PTM a whole layer is one gather and one scaling
        self.diagonal_noise = bool(np.allclose(noise_ptm, np.diag(np.diag(noise_ptm)), atol=0.0))
        digits = pauli_digits(n)
        strings = np.arange(4**n)
        self.pairs: list[list[tuple[int, int]]] = []  # per layer: (control, target) of each gate, in order
        for layer in range(cfg.layers):
            wires = []
            index, scale = strings.copy(), np.ones(4**n)
            for k, (gate, control, target) in enumerate(ANSATZE[cfg.ansatz].pairs(n, layer, self.options)):
                preimage, signs = clifford_pauli_map(gate)
                pair = 4 * digits[:, control] + digits[:, target]
                source = preimage[pair]  # r'[j] = sign r[j with its (control, target) digits replaced]
                shift_c, shift_t = 2 * (n - 1 - control), 2 * (n - 1 - target)
                gather = strings - (digits[:, control] << shift_c) - (digits[:, target] << shift_t) \
                    + ((source >> 2) << shift_c) + ((source & 3) << shift_t)
                step = signs[pair]
                if self.diagonal_noise:
                    diag = np.diag(noise_ptm)
                    step = step * diag[digits[:, control]] * diag[digits[:, target]]
                    index, scale = index[gather], step * scale[gather]
                else:
                    self.register_buffer(f"gather_{layer}_{k}", torch.as_tensor(gather), persistent=False)
                    self.register_buffer(f"sign_{layer}_{k}", torch.as_tensor(step, dtype=real), persistent=False)
                wires.append((control, target))
            if self.diagonal_noise:
                self.register_buffer(f"gather_{layer}", torch.as_tensor(index), persistent=False)
                self.register_buffer(f"scale_{layer}", torch.as_tensor(scale, dtype=real), persistent=False)
            self.pairs.append(wires)
        # p(z) = 2^-n sum_S (-1)^popcount(S & z) r_(Z_S): the Z-only strings and the Walsh-Hadamard matrix
        masks = np.arange(2**n)
        bits = (masks[:, None] >> (n - 1 - np.arange(n))) & 1  # (2^n, n), wire 0 first
        z_strings = (3 * bits) @ (4 ** (n - 1 - np.arange(n)))
        parity = (bits @ bits.T) & 1
        self.register_buffer("z_strings", torch.as_tensor(z_strings), persistent=False)
        self.register_buffer("walsh", torch.as_tensor((1.0 - 2.0 * parity) / 2**n, dtype=real), persistent=False)

    def ptm(self, superops: torch.Tensor) -> torch.Tensor:
        """Real PTMs of a batch of single-qubit superoperators (..., 4, 4)."""
        return (self.to_pauli @ superops @ self.from_pauli).real

    def apply_wire(self, rho: torch.Tensor, transfer: torch.Tensor, wire: int) -> torch.Tensor:
        """Apply a 4 x 4 PTM (shared, or one per batch row (B, 4, 4)) to wire ``wire`` of rho (B, 4^n)."""
        batch = rho.shape[0]
        view = rho.reshape(batch, 4**wire, 4, 4 ** (self.n_qubits - wire - 1))
        if transfer.dim() == 2:
            out = torch.einsum("ij,bljr->blir", transfer, view)
        else:
            out = transfer.unsqueeze(1) @ view
        return out.reshape(batch, -1)

    def encoding_transfers(self, angles: torch.Tensor) -> torch.Tensor:
        """Noise after the encoding rotation, per sample and wire, as PTMs: (B, n) -> (B, n, 4, 4)."""
        rotation = gates.rotation_matrices(self.axis, angles.to(self.real_dtype), self.complex_dtype)
        return self.ptm(self.noise @ unitary_superoperators(rotation))

    def encoded(self, angles: torch.Tensor) -> torch.Tensor:
        """rho after the first encoding block: a product of single-qubit Pauli vectors (B, 4^n)."""
        return gates.kron_vectors(self.encoding_transfers(angles) @ self.start)

    def reencode(self, rho: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """A later encoding block (``reupload``) on every wire."""
        transfers = self.encoding_transfers(angles)  # (B, n, 4, 4)
        if self.hadamard:
            transfers = transfers @ self.hadamard_noisy
        for wire in range(self.n_qubits):
            rho = self.apply_wire(rho, transfers[:, wire], wire)
        return rho

    def entangle(self, rho: torch.Tensor, layer: int) -> torch.Tensor:
        """Layer ``layer``'s CNOT / CZ gates in order, each followed by the noise on its two wires."""
        if self.diagonal_noise:
            return rho[:, getattr(self, f"gather_{layer}")] * getattr(self, f"scale_{layer}")
        for k, (control, target) in enumerate(self.pairs[layer]):
            rho = rho[:, getattr(self, f"gather_{layer}_{k}")] * getattr(self, f"sign_{layer}_{k}")
            rho = self.apply_wire(self.apply_wire(rho, self.noise_ptm, control), self.noise_ptm, target)
        return rho

    def rotations(self, weights: torch.Tensor) -> torch.Tensor:
        """Every layer's single-qubit gates, each followed by the noise on its wire, as one PTM per
        layer and wire (layers, n, 4, 4): a wire's gates and channels compose into one map."""
        superops = None
        for matrices in ANSATZE[self.ansatz].gates(weights, self.options, self.complex_dtype):
            step = self.noise @ unitary_superoperators(matrices)  # (layers, n, 4, 4)
            superops = step if superops is None else step @ superops
        return self.ptm(superops)

    def rotate(self, rho: torch.Tensor, transfers: torch.Tensor) -> torch.Tensor:
        """One layer's rotations (``rotations(weights)[layer]``, (n, 4, 4)), wire by wire."""
        for wire in range(self.n_qubits):
            rho = self.apply_wire(rho, transfers[wire], wire)
        return rho

    def probabilities(self, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Z-basis outcome probabilities (B, 2^n) of the noisy circuit (before readout error)."""
        per_block = angles.dim() == 3
        rho = self.encoded(angles[:, 0] if per_block else angles)
        rotations = self.rotations(weights)
        for layer in range(self.layers):
            if layer > 0 and self.reupload:
                rho = self.reencode(rho, angles[:, layer] if per_block else angles)
            if self.entangle_first:
                rho = self.rotate(self.entangle(rho, layer), rotations[layer])
            else:
                rho = self.entangle(self.rotate(rho, rotations[layer]), layer)
        return rho[:, self.z_strings] @ self.walsh
