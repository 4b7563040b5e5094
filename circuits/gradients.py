"""A circuit head as hardware would run it: finite shots, noise channels, and the gradient rules a
QPU allows (parameter shift, SPSA), with counts of the circuit executions and shots spent
(docs/circuits.md, "Shots, noise and hardware gradients").

``Hardware`` is built by ``VQC`` when a spec sets ``shots``, ``noise`` or ``grad`` other than
analytic; ``VQC.readouts`` hands it the encoding angles. The exact outcome probabilities come from the
state-vector engine (dense or gate path) or, with gate channels, from ``circuits.density``; readout
error flips the measured bits; shots replace the probabilities by measured frequencies.

Gradients, by ``grad``:

- analytic: autograd through the exact probabilities. With shots the forward value is the sampled
  estimate and the gradient that of the exact expectation (a straight-through estimator:
  p + stop_gradient(frequencies - p)); a simulator's shortcut that no QPU has, and it spends no
  gradient circuits in the counts.
- parameter_shift: every weight and encoding angle is the angle of one Pauli rotation
  exp(-i t P / 2), so d<O>/dt = (<O>(t + pi/2) - <O>(t - pi/2)) / 2 exactly, noise or not. Two
  circuits per parameter (per batch row), each run with the head's shots.
- spsa: one random direction Delta of +-1 per parameter from the head's generator;
  g = (f(t + c Delta) - f(t - c Delta)) / (2 c) Delta, unbiased to first order in c (= ``spsa_step``).
  Two circuits per step (per batch row).

Encoding angles get gradients only where they need them (a trainable pre-layer or input scaling):
then parameter_shift shifts each angle slot (each occurrence with ``reupload``) and spsa perturbs the
angles in the same two circuits.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

import numpy as np

from circuits import kernels, statevector
from circuits.density import DensityCircuit, flip_readout
from circuits.program import Program
from circuits.shots import ShotSampler
from circuits.spec import VQCConfig

COUNTERS = ("act_circuits", "act_shots", "grad_circuits", "grad_shots")
SHIFT = math.pi / 2


def needs_hardware(cfg: VQCConfig) -> bool:
    """Whether a spec asks for anything but exact expectation values with analytic gradients."""
    noisy = cfg.noise is not None and (cfg.noise.channels or cfg.noise.readout)
    return cfg.shots is not None or noisy or cfg.grad != "analytic"


def new_counts() -> dict[str, int]:
    """Zeroed resource counters (``VQC.resource_counts``)."""
    return dict.fromkeys(COUNTERS, 0)


def count(module: nn.Module, kind: str, circuits: int, shots: Optional[int]) -> None:
    """Add ``circuits`` executions of ``shots`` shots each (0 for exact expectations) to a head's counters."""
    counts = module.resource_counts
    counts[f"{kind}_circuits"] += int(circuits)
    counts[f"{kind}_shots"] += int(circuits) * int(shots or 0)


class Hardware(nn.Module):
    """Shots, noise and gradient rules for one VQC (see the module docstring); holds the density path
    and the seeded generator, and no reference to its VQC (passed to each call)."""

    def __init__(self, cfg: VQCConfig, complex_dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        self.shots = cfg.shots
        self.mode = cfg.grad
        self.spsa_step = float(cfg.spsa_step)
        self.readout_error = float(cfg.noise.readout) if cfg.noise is not None else 0.0
        self.n_qubits = cfg.n_qubits
        self.reupload = cfg.reupload
        self.layers = cfg.layers
        self.density = DensityCircuit(cfg, complex_dtype) if cfg.noise is not None and cfg.noise.channels else None
        self.sampler = ShotSampler(seed)

    def probabilities(self, vqc: Any, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Exact outcome probabilities (B, 2^n), readout error included, differentiable by autograd."""
        executor = vqc.plan(angles.shape[0], False).executor
        if executor == "density":
            probs = self.density.probabilities(angles, weights)
        elif executor == "dense":
            circuit = vqc.circuit
            dense = vqc.dense_matrix() if weights is vqc.weights else circuit.dense_matrix(weights)
            amplitudes = circuit.dense_amplitudes(angles, dense)
            half = amplitudes.shape[-1] // 2
            probs = amplitudes[:, :half].square() + amplitudes[:, half:].square()
        else:
            probs = torch.view_as_real(vqc.circuit.final_state(angles, weights)).square().sum(-1)
        return flip_readout(probs, self.readout_error, self.n_qubits)

    def measure(self, probs: torch.Tensor) -> torch.Tensor:
        """Probabilities -> what the readouts are computed from: measured frequencies with shots
        (straight-through: the gradient is that of ``probs``), else ``probs``."""
        if self.shots is None:
            return probs
        frequencies = self.sampler.frequencies(probs, self.shots)
        return probs + (frequencies - probs).detach() if probs.requires_grad else frequencies

    def evaluate(self, vqc: Any, angles: torch.Tensor, weights: torch.Tensor, kind: Optional[str] = None) -> torch.Tensor:
        """Readouts (B, m) of one batch of circuit executions (sampled with shots); counted as ``kind``."""
        if kind is not None:
            count(vqc, kind, angles.shape[0], self.shots)
        return self.measure(self.probabilities(vqc, angles, weights)) @ vqc.circuit.readout

    def readouts(self, vqc: Any, angles: torch.Tensor) -> torch.Tensor:
        """The head's readouts (B, m); with grad parameter_shift or spsa, a node whose backward runs the rule."""
        weights = vqc.weights
        wanted = torch.is_grad_enabled() and (weights.requires_grad or angles.requires_grad)
        if self.mode == "analytic" or not wanted:
            return self.evaluate(vqc, angles, weights)
        return RuleReadouts.apply(self, vqc, angles, weights)

    # -- gradient rules: d loss / d (angles, weights) from d loss / d readouts (B, m) --------------
    def shift_gradients(self, vqc: Any, angles: torch.Tensor, weights: torch.Tensor, grad: torch.Tensor,
                        need_angles: bool, need_weights: bool) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The two-term parameter-shift rule, one parameter at a time (each shift a batch of circuits)."""
        def difference(a_plus, w_plus, a_minus, w_minus) -> torch.Tensor:
            plus = self.evaluate(vqc, a_plus, w_plus, "grad")
            minus = self.evaluate(vqc, a_minus, w_minus, "grad")
            return ((plus - minus) * grad).sum(-1) / 2.0  # (B,)

        grad_weights = None
        if need_weights:
            flat = weights.detach().reshape(-1)
            grad_weights = torch.zeros_like(flat)
            for j in range(flat.numel()):
                shift = torch.zeros_like(flat)
                shift[j] = SHIFT
                grad_weights[j] = difference(angles, (flat + shift).view_as(weights), angles, (flat - shift).view_as(weights)).sum()
            grad_weights = grad_weights.view_as(weights)
        grad_angles = None
        if need_angles:
            # with re-uploading, a shared angle enters every block: shift each occurrence on its own
            shared = self.reupload and angles.dim() == 2
            slots = angles.detach().unsqueeze(1).expand(-1, self.layers, -1).contiguous() if shared else angles.detach()
            flat = slots.reshape(slots.shape[0], -1)
            out = torch.zeros_like(flat)
            for j in range(flat.shape[1]):
                shift = torch.zeros_like(flat)
                shift[:, j] = SHIFT
                out[:, j] = difference((flat + shift).view_as(slots), weights, (flat - shift).view_as(slots), weights)
            grad_angles = out.view_as(slots).sum(1) if shared else out.view_as(slots)
        return grad_angles, grad_weights

    def spsa_gradients(self, vqc: Any, angles: torch.Tensor, weights: torch.Tensor, grad: torch.Tensor,
                       need_angles: bool, need_weights: bool) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """SPSA: one +-1 direction over every parameter that needs a gradient, two batches of circuits."""
        c = self.spsa_step
        delta_w = self.sampler.rademacher(weights.shape, weights) if need_weights else torch.zeros_like(weights)
        delta_a = self.sampler.rademacher(angles.shape, angles) if need_angles else torch.zeros_like(angles)
        plus = self.evaluate(vqc, angles + c * delta_a, weights + c * delta_w, "grad")
        minus = self.evaluate(vqc, angles - c * delta_a, weights - c * delta_w, "grad")
        slope = ((plus - minus) * grad).sum(-1) / (2.0 * c)  # (B,): directional derivative of the loss per row
        grad_weights = slope.sum() * delta_w if need_weights else None
        grad_angles = slope.view(-1, *([1] * (angles.dim() - 1))) * delta_a if need_angles else None
        return grad_angles, grad_weights


class RuleReadouts(torch.autograd.Function):
    """Readouts whose backward is the head's gradient rule (parameter shift or SPSA), not autograd.

    forward(hardware, vqc, angles, weights) -> readouts (B, m), sampled with shots.
    """

    @staticmethod
    def forward(ctx, hardware: Hardware, vqc: Any, angles: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        ctx.hardware, ctx.vqc = hardware, vqc
        ctx.save_for_backward(angles, weights)
        return hardware.evaluate(vqc, angles, weights)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        angles, weights = ctx.saved_tensors
        hardware = ctx.hardware
        rule = hardware.shift_gradients if hardware.mode == "parameter_shift" else hardware.spsa_gradients
        with torch.no_grad():
            grad_angles, grad_weights = rule(ctx.vqc, angles.detach(), weights.detach(), grad,
                                             ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        return None, None, grad_angles, grad_weights


def expectation_gradients(cfg: VQCConfig, weights: np.ndarray, angles: np.ndarray,
                          diagonal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f = <O> and d f / d weights for rows that each have their own weights, by the statevector
    executor's adjoint method (its compiled kernels, or its numpy blocks where numba is not here),
    complex128: the public gradient API of exact circuits outside a head (``marlq plateau``).

    cfg: the circuit (its observable is replaced by O; re-uploading: the angles in every block); weights
    (B, L, n, k); encoding angles (B, n);
    diagonal: O's diagonal in the computational basis (2^n,). Returns (f (B,), gradient (B, L, n, k)).
    """
    program = Program.from_spec(cfg, np.complex128, readout=np.asarray(diagonal, dtype=np.float64)[:, None])
    weights = np.asarray(weights, dtype=np.float64)
    angles = np.asarray(angles, dtype=np.float64)
    values, grads = np.empty(len(weights)), np.empty(weights.shape)
    one = np.ones((1, 1))
    for b in range(len(weights)):
        if kernels.available() and not program.reupload:
            rot, gen = kernels.rotations(program, weights[b], True)
            readouts, states = kernels.forward(program, angles[b : b + 1], rot, True)
            grads[b] = kernels.weight_grad(program, states, one, rot, gen)
        else:  # (re-uploading: the blocks, the compiled kernels take none)
            blocks = statevector.BlockMatrices(program, weights[b], True)
            first, uploads = statevector.reupload_inputs(program, angles[b : b + 1])
            psi = statevector.final_state(program, first, blocks, uploads=uploads)[0]
            readouts = statevector.readouts_of(psi, program)
            grads[b] = statevector.backward_sweep(program, psi, one, blocks, True, uploads=uploads)[1]
        values[b] = readouts[0, 0]
    return values, grads
