"""The adjoint state-vector path of the native engine: one forward sweep, one backward sweep, no graph.

A circuit without re-uploading is: an encoded product state psi_0 = F^{(x)n} r(x) (r real, F the
encoding's fixed 2x2, ``gates.encoding_state_map``), then per layer a signed permutation E_l
(the CNOT/CZ gates) and a Kronecker product K_l of per-wire 2x2 matrices, read out as
probabilities |psi_L|^2. ``StatevectorAdjoint`` runs that on a (B, 2^n) complex state:

- forward: K_l is applied as a few Kronecker *blocks* of up to ``BLOCK_WIDTH`` neighbouring wires
  (one 2^w x 2^w matrix each, one GEMM on the state viewed as (B 2^first, 2^w, 2^rest)); E_l is
  one gather. Only the final state is kept: memory O(B 2^n), whatever the depth.
- backward (the adjoint method): with lambda = dL/dpsi_L (torch's convention, 2 g psi_L for
  L = sum g |psi|^2), walk the layers from the end, un-applying every block to the state
  (psi_in = K^dagger psi_out: unitary, nothing stored) and to lambda, and contracting
  G = sum_batch lambda_out psi_in^dagger (a 2^w x 2^w matrix per block). A weight's gradient is
  Re sum conj(G) dK/dw, where dK/dw is the block with that wire's matrix replaced by its
  derivative, 0.5 R(w + pi) for a Pauli-rotation angle (the rule the dense path's analytic
  gradient uses). lambda at the start gives the gradient of r, through which autograd reaches
  the encoding angles (and a ``preprocess: linear`` layer).

The block matrices and their derivatives (a few 16 x 16 matrices) are built in numpy complex128 on
each call from the weights, so a training step pays no autograd bookkeeping for them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuits.blocks import ANSATZE

if TYPE_CHECKING:
    from circuits.engine import CompiledCircuit

BLOCK_WIDTH = 4  # wires per Kronecker block: a 16 x 16 GEMM per block


def block_layout(n_qubits: int, width: int = BLOCK_WIDTH) -> list[tuple[int, int]]:
    """(first wire, width) of each block: ceil(n / width) blocks of near-equal width, wire 0 first."""
    count = -(-n_qubits // width)
    base, extra = divmod(n_qubits, count)
    layout, first = [], 0
    for b in range(count):
        w = base + (1 if b < extra else 0)
        layout.append((first, w))
        first += w
    return layout


def kron_matrices(matrices: Any) -> Any:
    """Kronecker product over wires of per-wire matrices: (..., n, 2, 2) -> (..., 2^n, 2^n), wire 0 first;
    torch tensors or numpy arrays (``circuits.engine`` re-exports it)."""
    out = matrices[..., 0, :, :]
    for wire in range(1, matrices.shape[-3]):
        size = out.shape[-1] * 2
        out = (out[..., :, None, :, None] * matrices[..., wire, None, :, None, :]).reshape(*out.shape[:-2], size, size)
    return out


def apply_block(psi: torch.Tensor, matrix: torch.Tensor, first: int, width: int, n_qubits: int) -> torch.Tensor:
    """matrix (2^w, 2^w) on wires first..first+w-1 of states psi (..., 2^n, B), batch last: one GEMM
    (the first wires) or 2^first GEMMs of (2^w, 2^w) x (2^w, 2^rest B)."""
    shape = psi.shape
    return (matrix @ psi.reshape(*shape[:-2], 2**first, 2**width, -1)).reshape(shape)


def block_gradient(lam: torch.Tensor, psi: torch.Tensor, first: int, width: int) -> torch.Tensor:
    """G[i, j] = sum over every other index of lam[.., i, ..] conj(psi[.., j, ..]) on the block's wires;
    lam, psi (2^n, B)."""
    lam = lam.reshape(2**first, 2**width, -1)
    psi = psi.reshape(2**first, 2**width, -1)
    if first == 0:
        return lam[0] @ psi[0].mH
    return (lam @ psi.mH).sum(0)


class BlockMatrices:
    """The blocks of every layer at given weights, and their derivatives in each weight."""

    def __init__(self, circuit: "CompiledCircuit", weights: np.ndarray, with_derivatives: bool,
                 complex_dtype: torch.dtype) -> None:
        layers, n, k = weights.shape
        ansatz = ANSATZE[circuit.ansatz]
        if with_derivatives:
            shifts = np.concatenate([np.zeros((1, k)), np.pi * np.eye(k)])  # the weights, then each shifted by pi
            matrices = ansatz.matrices_np(weights[:, :, None, :] + shifts, circuit.options)  # (L, n, 1 + k, 2, 2)
            rotations = matrices[:, :, 0]
            derivatives = 0.5 * matrices[:, :, 1:]  # (L, n, k, 2, 2): d R / d w = R(w + pi) / 2
        else:
            rotations = ansatz.matrices_np(weights, circuit.options)  # (L, n, 2, 2)
        self.layout = circuit.adjoint_layout
        self.k = k
        self.blocks: list[torch.Tensor] = []  # per block: (L, 2^w, 2^w) torch
        self.derivatives: list[np.ndarray] = []  # per block: (L, w, k, 2^w, 2^w) numpy
        for first, width in self.layout:
            factors = rotations[:, first : first + width]  # (L, w, 2, 2)
            if with_derivatives:
                # (L, w * k, w, 2, 2): the factors with wire i's matrix replaced by d R_i / d w_ik
                variants = np.repeat(factors[:, None], width * k, axis=1).reshape(layers, width, k, width, 2, 2)
                for i in range(width):
                    variants[:, i, :, i] = derivatives[:, first + i]
                self.derivatives.append(kron_matrices(variants))
            self.blocks.append(torch.from_numpy(kron_matrices(factors)).to(complex_dtype))
        self.shape = weights.shape

    def weight_gradient(self, grads: list[torch.Tensor]) -> np.ndarray:
        """d loss / d weights (L, n, k) from each block's G (L, 2^w, 2^w), torch's convention for complex grads."""
        out = np.empty(self.shape)
        for (first, width), grad, derivative in zip(self.layout, grads, self.derivatives):
            g = grad.numpy().astype(np.complex128).conj()  # (L, d, d)
            out[:, first : first + width] = (derivative * g[:, None, None]).real.sum(axis=(-1, -2))
        return out


def evolve(circuit: "CompiledCircuit", psi: torch.Tensor, blocks: BlockMatrices) -> torch.Tensor:
    """The state after every layer, from psi (2^n, B); no autograd."""
    n = circuit.n_qubits
    for layer in range(circuit.layers):
        if circuit.entangle_first:
            psi = circuit.entangle_rows(psi, layer)
        for (first, width), matrix in zip(blocks.layout, blocks.blocks):
            psi = apply_block(psi, matrix[layer], first, width, n)
        if not circuit.entangle_first:
            psi = circuit.entangle_rows(psi, layer)
    return psi


class StatevectorAdjoint(torch.autograd.Function):
    """readouts (B, m) from r (2^n, B) real (the product state, batch last) and weights (L, n, k);
    see the module docstring."""

    @staticmethod
    def forward(ctx, r: torch.Tensor, weights: torch.Tensor, circuit: "CompiledCircuit") -> torch.Tensor:
        blocks = BlockMatrices(circuit, weights.detach().numpy().astype(np.float64),
                               ctx.needs_input_grad[1], circuit.complex_dtype)
        psi = evolve(circuit, circuit.encode_rows(r), blocks)
        amplitudes = torch.view_as_real(psi)  # (2^n, B, 2)
        ctx.save_for_backward(psi)
        ctx.blocks, ctx.circuit = blocks, circuit
        return (circuit.readout.T @ (amplitudes.square().sum(-1))).T

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (psi,) = ctx.saved_tensors
        circuit, blocks = ctx.circuit, ctx.blocks
        n = circuit.n_qubits
        # state and adjoint stacked (2, 2^n, B): every un-apply is one GEMM on both.
        # lambda = d loss / d conj(psi) in torch's convention: 2 (R g) psi
        both = torch.empty((2,) + psi.shape, dtype=psi.dtype)
        both[0] = psi
        torch.mul(psi, (circuit.readout @ grad.T).mul_(2.0), out=both[1])
        grads: list[list[torch.Tensor]] = [[None] * circuit.layers for _ in blocks.layout]  # type: ignore[list-item]
        for layer in reversed(range(circuit.layers)):
            if not circuit.entangle_first:
                both = circuit.unentangle_rows(both, layer)
            for b in reversed(range(len(blocks.layout))):
                first, width = blocks.layout[b]
                adjoint_out = both[1]
                both = apply_block(both, blocks.blocks[b][layer].mH, first, width, n)
                if ctx.needs_input_grad[1]:  # G = lambda_out psi_in^dagger
                    grads[b][layer] = block_gradient(adjoint_out, both[0], first, width)
            if circuit.entangle_first:
                both = circuit.unentangle_rows(both, layer)
        grad_r = circuit.encode_rows_backward(both[1]) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.from_numpy(blocks.weight_gradient([torch.stack(g) for g in grads])).to(psi.real.dtype)
        return grad_r, grad_w, None
