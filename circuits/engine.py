"""``CompiledCircuit``: a VQC spec's fixed structure as a torch module, and two executors on it.

The executors (named as ``circuits.planner`` names them; docs/circuits.md, "Executors and the planner"):

- ``dense``: when data enters only before the trainable part, the encoded state is a product of
  single-qubit states F (cos(t_i/2), sin(t_i/2)); with F folded in, the whole circuit is one
  2^n x 2^n complex matrix D(theta) acting on the real product vector r(x). Forward is
  r @ [Re D | Im D], squared, then one matmul with the readout matrix. D depends on the weights
  only, so rollouts (no grad) reuse it until the weights change. Its weight gradient is either
  autograd through the matrix or, on the CPU, the analytic contraction of the layers' prefix and
  suffix products with the output gradient (``DenseGradient``: a rotation's derivative is half the
  rotation with its angle shifted by pi).
- ``torch_autograd``: a (..., 2^n) complex state updated block by block with torch ops (the
  single-qubit matrices of up to 4 neighbouring wires as one Kronecker block, one GEMM; each
  layer's CNOT/CZ gates as a signed permutation), differentiated by autograd; CUDA (data
  re-uploading there included: on the CPU it runs on the statevector executor).

The ``statevector`` executor (numpy blocks and compiled kernels) is ``circuits.statevector`` and
``circuits.kernels``, reading the numpy ``Program`` of the same circuit (``CompiledCircuit.program``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from circuits import gates, kernels, statevector
from circuits.blocks import ANSATZE, LayerOptions
from circuits.program import Program, kron_matrices, numpy_dtype, program_of
from circuits.spec import VQCConfig
from marl_q.native import single_thread_blas

COMPLEX_TO_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
ROTATION_BLOCK = 4  # wires whose single-qubit matrices torch_autograd merges into one 16 x 16 block


def apply_block(psi: torch.Tensor, matrix: torch.Tensor, first: int, width: int, n_qubits: int) -> torch.Tensor:
    """Apply a 2^width-square matrix to wires first..first+width-1 of states psi (..., 2^n).

    A shared (2-D) matrix goes through einsum, which torch lowers to one large GEMM; a batched
    matrix (..., d, d) is applied per leading index.
    """
    lead = psi.shape[:-1]
    view = psi.reshape(*lead, 2**first, 2**width, 2 ** (n_qubits - first - width))
    if matrix.dim() == 2:
        out = torch.einsum("ij,...jr->...ir", matrix, view)
    else:
        out = matrix.unsqueeze(-3) @ view
    return out.reshape(*lead, 2**n_qubits)


def apply_signed_permutation(psi: torch.Tensor, inverse: torch.Tensor, sign: torch.Tensor | None) -> torch.Tensor:
    """Apply a product of CNOT/CZ gates given as (inverse permutation, sign) to states psi (..., 2^n)."""
    out = psi.gather(-1, inverse.expand(psi.shape))  # gather: its backward (scatter_add) never syncs
    return out if sign is None else out * sign


class DenseGradient:
    """What the dense executor's analytic weight gradient of r @ [Re D | Im D] needs, from
    ``CompiledCircuit.dense_with_gradient``.

    For an output gradient g = [g_re | g_im] (B, 2^(n+1)), the gradient in weight (l, i, k) is
    Re sum_b v_l^T dK_l u_l with u_l = r prefix_l and v_l = suffix_l conj(g_re + i g_im). Since
    dK_l = K_l G (G = R_i^dagger dR_i on wire i, the identity elsewhere), that is
    sum over wire i's bits (b, a) of G[b, a] E[b, a], where E[b, a] = sum over the other bits of
    y[.. b ..] u[.. a ..] and y = K_l^T v_l: one 2 x 2 contraction per wire, no Jacobian.
    """

    def __init__(self, prefixes: np.ndarray, suffix_kron: np.ndarray, generators: np.ndarray,
                 wire_first: np.ndarray, real_dtype: np.dtype) -> None:
        self.prefixes = prefixes  # (L, d, d): the state matrix entering each layer's K^T
        self.suffix_kron = suffix_kron  # (L, d, d): suffix_l^T K_l, so y (rows) = conj(g) suffix_l^T K_l
        self.generators = generators  # (L, n, k, 2, 2): R^dagger dR / d weight
        self.wire_first = wire_first  # (n, d)
        self.real_dtype = real_dtype

    def weight_grad(self, r: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """d loss / d weights (L, n, k) from r (B, d) and d loss / d [Re | Im] amplitudes (B, 2d)."""
        batch, dim = r.shape
        layers, n = self.generators.shape[:2]
        u = r @ self.prefixes  # (L, B, d)
        y = (grad[:, :dim] - 1j * grad[:, dim:]) @ self.suffix_kron  # (L, B, d)
        # wire i's bit first: (L, B, n, 2, d/2), then E[l, i] = Y (2, B d/2) @ U (B d/2, 2)
        y_first = y[..., self.wire_first].reshape(layers, batch, n, 2, dim // 2).transpose(0, 2, 3, 1, 4)
        u_first = u[..., self.wire_first].reshape(layers, batch, n, 2, dim // 2).transpose(0, 2, 1, 4, 3)
        env = y_first.reshape(layers, n, 2, -1) @ u_first.reshape(layers, n, -1, 2)  # (L, n, 2, 2): E[b, a]
        grad_w = (self.generators * env[:, :, None]).real.sum(axis=(-1, -2))
        return grad_w.astype(self.real_dtype)


DenseAdjoint = DenseGradient  # the name sim snapshots pickled (a VQC's cached dense matrix holds one)


class DenseAmplitudes(torch.autograd.Function):
    """r @ dense with the weight gradient from a ``DenseGradient`` (one node in the graph).

    forward(r (B, 2^n), weights (L, n, k), dense (2^n, 2^(n+1)), gradient) -> (B, 2^(n+1)).
    """

    @staticmethod
    def forward(ctx, r: torch.Tensor, weights: torch.Tensor, dense: torch.Tensor, gradient: DenseGradient) -> torch.Tensor:
        ctx.save_for_backward(r, dense)
        ctx.gradient = gradient
        return r @ dense

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        r, dense = ctx.saved_tensors
        grad_r = grad @ dense.T if ctx.needs_input_grad[0] else None
        grad_weights = None
        if ctx.needs_input_grad[1]:
            grad_weights = torch.from_numpy(ctx.gradient.weight_grad(r.detach().numpy().astype(np.float64),
                                                                    grad.detach().numpy().astype(np.float64)))
        return grad_r, grad_weights, None, None


class CompiledCircuit(nn.Module):
    """The fixed structure of one spec on n qubits (permutations, readout and encoding matrices).

    Holds no trainable parameters: weights and angles are passed in, so the structure can be tested
    on its own. Buffers are non-persistent (not in state_dict) and follow the module's device.
    """

    def __init__(self, cfg: VQCConfig, complex_dtype: torch.dtype = torch.complex64) -> None:
        super().__init__()
        self.n_qubits = cfg.n_qubits
        self.layers = cfg.layers
        self.encoding = cfg.encoding
        self.hadamard = cfg.hadamard
        self.ansatz = cfg.ansatz
        self.rotation = cfg.rotation
        self.options = LayerOptions(cfg.rotation, cfg.entangler)
        self.reupload = cfg.reupload
        self.entangle_first = ANSATZE[cfg.ansatz].entangle_first
        self.complex_dtype = complex_dtype
        self.real_dtype = COMPLEX_TO_REAL[complex_dtype]
        self.signs_trivial: list[bool] = []
        for layer in range(cfg.layers):
            pairs = ANSATZE[cfg.ansatz].pairs(cfg.n_qubits, layer, self.options)
            inverse, sign = gates.signed_permutation(pairs, cfg.n_qubits)
            self.register_buffer(f"inverse_{layer}", torch.as_tensor(inverse), persistent=False)
            self.register_buffer(f"sign_{layer}", torch.as_tensor(sign, dtype=self.real_dtype), persistent=False)
            self.signs_trivial.append(bool(np.all(sign == 1.0)))
        shifts = gates.basis_bits(cfg.n_qubits).T * (np.pi / 2)  # (n, 2^n): cos(t/2 - pi/2) = sin(t/2)
        self.register_buffer("bit_shifts", torch.as_tensor(shifts, dtype=self.real_dtype), persistent=False)
        readout = gates.readout_matrix(cfg.observable, cfg.n_qubits)
        self.register_buffer("readout", torch.as_tensor(readout, dtype=self.real_dtype), persistent=False)
        self.register_buffer("readout_stacked", torch.as_tensor(np.concatenate([readout, readout]), dtype=self.real_dtype), persistent=False)
        state_map = gates.encoding_state_map(cfg.encoding, cfg.hadamard)
        self.register_buffer("state_map", torch.as_tensor(state_map, dtype=complex_dtype), persistent=False)
        kron = np.ones((1, 1), dtype=np.complex128)
        for _ in range(cfg.n_qubits):
            kron = np.kron(kron, state_map)
        self.register_buffer("encoded_basis", torch.as_tensor(kron.T.copy(), dtype=complex_dtype), persistent=False)

    @property
    def program(self) -> Program:
        """The numpy ``circuits.program.Program`` of this circuit, compiled on first use and kept."""
        return program_of(self)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_program", None)  # compiled again from the buffers on first use
        state.pop("_adjoint_structure", None)  # (what earlier versions kept instead)
        state.pop("_kernel_program", None)
        state.pop("_pauli", None)  # (circuits.pauli's structure: compiled again on first use)
        return state

    def entangle(self, psi: torch.Tensor, layer: int) -> torch.Tensor:
        """Apply layer ``layer``'s entangling block."""
        sign = None if self.signs_trivial[layer] else getattr(self, f"sign_{layer}")
        return apply_signed_permutation(psi, getattr(self, f"inverse_{layer}"), sign)

    def forward_statevector(self, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Readouts (B, m) by the statevector executor's numpy blocks (``circuits.statevector``), as a
        torch node whose backward is the adjoint method; angles (B, n) or, with re-uploading and
        trainable scaling, (B, layers, n) per block (their gradient has the same shape)."""
        return statevector.StatevectorNode.apply(angles.to(self.real_dtype), weights, program_of(self))

    def rotate(self, psi: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
        """Apply per-qubit matrices (..., n, 2, 2): Kronecker products of up to 4 wires at a time."""
        for first in range(0, self.n_qubits, ROTATION_BLOCK):
            width = min(ROTATION_BLOCK, self.n_qubits - first)
            block = kron_matrices(matrices[..., first : first + width, :, :])
            psi = apply_block(psi, block, first, width, self.n_qubits)
        return psi

    def trainable_layer(self, psi: torch.Tensor, weights: torch.Tensor, layer: int) -> torch.Tensor:
        """Apply ansatz layer ``layer`` with weights (L, n, k) to states psi (..., 2^n)."""
        matrices = ANSATZE[self.ansatz].matrices(weights[layer], self.options, self.complex_dtype)
        if self.entangle_first:
            return self.rotate(self.entangle(psi, layer), matrices)
        return self.entangle(self.rotate(psi, matrices), layer)

    def encoded_state(self, angles: torch.Tensor) -> torch.Tensor:
        """The product state after the first encoding block: angles (B, n) -> (B, 2^n) complex."""
        return gates.product_state(angles.to(self.real_dtype), state_map=self.state_map)

    def dense_matrix(self, weights: torch.Tensor) -> torch.Tensor:
        """Real (2^n, 2^(n+1)) matrix [Re D | Im D] with r(x) @ D = final state (row) of the circuit.

        Each layer's single-qubit part is one Kronecker product K_l, applied to all basis rows at once.
        """
        rotations = ANSATZE[self.ansatz].matrices(weights, self.options, self.complex_dtype)
        kron_transposed = kron_matrices(rotations).transpose(-1, -2)  # (L, 2^n, 2^n)
        psi = self.encoded_basis
        for layer in range(self.layers):
            if self.entangle_first:
                psi = self.entangle(psi, layer) @ kron_transposed[layer]
            else:
                psi = self.entangle(psi @ kron_transposed[layer], layer)
        return torch.cat([psi.real, psi.imag], dim=-1)

    def dense_with_gradient(self, weights: torch.Tensor) -> tuple[torch.Tensor, DenseGradient]:
        """[Re D | Im D] as ``dense_matrix`` computes it (up to float rounding), with what the
        weight gradient needs (``DenseGradient.weight_grad``); built in numpy complex128, where the
        per-call cost on these small matrices is a fraction of torch's.

        With layer maps psi -> E_l(psi) @ K_l^T (or E_l(psi @ K_l^T)), D = B M_0 ... M_{L-1}, so the
        derivative in a weight of layer l is prefix_l dK_l^T suffix_l, where dK_l is the Kronecker
        product with that weight's wire's factor replaced by its derivative, 0.5 R(angle + pi) for
        every rotation used here. Contracted with the output gradient, only vectors meet these
        matrices (``DenseGradient``): no Jacobian is formed.
        """
        single_thread_blas()
        w = weights.detach().cpu().numpy().astype(np.float64)
        layers, n, k = w.shape
        rotations, generators = kernels.rotations_and_generators(program_of(self), w)  # R and R^dagger dR per weight
        kron = rotations[:, 0]
        for wire in range(1, n):
            size = kron.shape[-1] * 2
            kron = (kron[:, :, None, :, None] * rotations[:, wire, None, :, None, :]).reshape(layers, size, size)
        kron_transposed = np.swapaxes(kron, -1, -2)  # (L, 2^n, 2^n)
        # E_l(psi) = psi @ Pi_l with Pi_l[inverse[j], j] = sign[j]: columns gathered by inverse, signed;
        # Pi_l @ suffix: rows gathered by the forward permutation, signed by sign[forward]
        inverses, signs, forwards, row_signs = self._np_constant("permutations", self._permutations_np)
        psi = self._np_constant("encoded_basis", lambda: self.encoded_basis.cpu().numpy().astype(np.complex128))
        dim = psi.shape[-1]
        prefixes = np.empty((layers, dim, dim), dtype=np.complex128)
        for layer in range(layers):
            if self.entangle_first:
                psi = np.take(psi, inverses[layer], axis=1) * signs[layer]
                prefixes[layer] = psi
                psi = psi @ kron_transposed[layer]
            else:
                prefixes[layer] = psi
                psi = np.take(psi @ kron_transposed[layer], inverses[layer], axis=1) * signs[layer]
        dense = psi
        suffix = self._np_constant("identity", lambda: np.eye(dim, dtype=np.complex128))
        suffix_kron = np.empty((layers, dim, dim), dtype=np.complex128)
        for layer in reversed(range(layers)):
            if not self.entangle_first:
                suffix = np.take(suffix, forwards[layer], axis=0) * row_signs[layer]
            suffix_kron[layer] = suffix.T @ kron[layer]
            suffix = kron_transposed[layer] @ suffix
            if self.entangle_first:
                suffix = np.take(suffix, forwards[layer], axis=0) * row_signs[layer]
        real = self._np_constant("real", lambda: numpy_dtype(self.real_dtype))
        dense_real = torch.from_numpy(np.concatenate([dense.real, dense.imag], axis=-1).astype(real))
        gradient = DenseGradient(prefixes, suffix_kron, generators, self._np_constant("wire_first", self._wire_first_orders), real)
        return dense_real, gradient

    def _np_constant(self, key: object, make: Callable[[], object]) -> Any:
        """Structure-only numpy arrays of the analytic path, made on first use and kept."""
        cache = self.__dict__.setdefault("_np_constants", {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _permutations_np(self) -> tuple[list[np.ndarray], ...]:
        """Per layer: inverse permutation and sign (columns), forward permutation and its signs (rows)."""
        inverses = [getattr(self, f"inverse_{l}").cpu().numpy() for l in range(self.layers)]
        signs = [getattr(self, f"sign_{l}").cpu().numpy().astype(np.float64) for l in range(self.layers)]
        forwards = [np.argsort(inverse) for inverse in inverses]
        row_signs = [sign[forward][:, None] for sign, forward in zip(signs, forwards)]
        return inverses, signs, forwards, row_signs

    def _wire_first_orders(self) -> np.ndarray:
        """(n, 2^n): basis indices reordered so that wire i's bit is the most significant."""
        n = self.n_qubits
        bits = gates.basis_bits(n)  # (2^n, n), wire 0 first
        orders = []
        for wire in range(n):
            others = [m for m in range(n) if m != wire]
            key = bits[:, [wire] + others] @ (2 ** np.arange(n - 1, -1, -1))
            orders.append(np.argsort(key))
        return np.stack(orders)

    def product_state(self, angles: torch.Tensor) -> torch.Tensor:
        """The real product vector r(x) (B, 2^n) with r_k = prod_i cos(t_i/2 - bit_i(k) pi/2)."""
        # fused on the CPU (its (B, n, 2^n) intermediate stays small); not on CUDA (gates.product_state)
        fused = self.n_qubits <= 8 and angles.device.type == "cpu"
        return gates.product_state(angles, bit_shifts=self._buffers["bit_shifts"] if fused else None)

    def dense_amplitudes(self, angles: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """The final states (B, 2^(n+1): [Re | Im]) of angles (B, n) by a dense matrix from ``dense_matrix``:
        the dense executor's forward before its readout (the shots path reads probabilities from it)."""
        return self.product_state(angles.to(self.real_dtype)) @ dense

    def forward_dense(self, angles: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Readouts (B, m) from angles (B, n) and a dense matrix from ``dense_matrix``."""
        return self.dense_amplitudes(angles, dense).square() @ self.readout_stacked

    def forward_dense_analytic(self, angles: torch.Tensor, weights: torch.Tensor, dense: torch.Tensor,
                               gradient: DenseGradient) -> torch.Tensor:
        """``forward_dense`` whose gradient in ``weights`` comes from ``gradient`` (one node in the graph)."""
        amplitudes = DenseAmplitudes.apply(self.product_state(angles.to(self.real_dtype)), weights, dense, gradient)
        return amplitudes.square() @ self.readout_stacked

    def forward_gates(self, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Readouts (B, m) by the torch_autograd executor, gate by gate; angles (B, n) or, with reupload,
        (B, layers, n) per block."""
        return torch.view_as_real(self.final_state(angles, weights)).square().sum(-1) @ self.readout

    def final_state(self, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The state (B, 2^n) gate by gate (``forward_gates`` before its readout)."""
        per_block = angles.dim() == 3
        first = angles[:, 0] if per_block else angles
        psi = self.encoded_state(first)
        for layer in range(self.layers):
            if layer > 0 and self.reupload:
                block = angles[:, layer] if per_block else angles
                encoders = gates.encoding_gate_matrices(self.encoding, self.hadamard, block.to(self.real_dtype), self.complex_dtype)
                psi = self.rotate(psi, encoders)
            psi = self.trainable_layer(psi, weights, layer)
        return psi
