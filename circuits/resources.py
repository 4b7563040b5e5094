"""Quantum-resource counters: the circuit executions, shots and jobs a VQC head would cost on a QPU.

A ``CircuitCounter`` is a forward hook on one ``VQC`` (``attach``); the numpy one-step path
(``circuits.twins.NumpyVQC``), which bypasses the module, reports to the same counter
(``counter_of``). The conventions (docs/hardware.md):

- **act** (forward) circuits: every row a forward evaluates is one circuit execution, whatever the
  forward is for (sampling an action, a value for a target, the loss's forward); the head counts
  them itself where the rows are evaluated (``VQC.resource_counts``). All readouts of a
  row are diagonal in the Z basis, so one circuit's measured bitstrings give all of them.
- **grad** circuits: a backward through a VQC costs, per row whose output gradient is not all zero,
  2 circuits per gate angle that depends on a trainable parameter (the parameter-shift rule of a
  Pauli rotation, R(w +- pi/2)): every ansatz weight, and every encoding angle when a trainable
  parameter (``scaling: trainable``, a ``preprocess: linear`` layer) feeds it. The analytic
  (state-vector) gradient the simulator computes counts as that parameter-shift equivalent.
- **shots**: circuits x ``shots`` of the head's config; a head without ``shots`` (analytic, the
  default) reports 0 shots and is marked exact.
- **jobs**: one job is one batch of circuits submitted together: one forward call of one head (all
  its rows), or the gradient circuits of one backward of one head.

A head whose gradient is computed as hardware would (``grad: parameter_shift | spsa``) keeps the
circuits it really ran in its own ``resource_counts`` (``circuits.gradients``); its ``grad_*``
counters are read from there (SPSA: 2 circuits per row, not 2 per angle).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import nn

# the counters every head reports (cumulative per head; deltas per worker step in Work.resources)
COUNTERS = ("act_circuits", "act_shots", "act_jobs", "grad_circuits", "grad_shots", "grad_jobs")
SHIFTS_PER_ANGLE = 2  # the two-term parameter-shift rule of a Pauli rotation


def head_shots(vqc: nn.Module) -> Optional[int]:
    """The head's shots per circuit, or None for an exact (analytic) head."""
    shots = getattr(vqc.cfg, "shots", None)
    return None if shots is None else int(shots)


def shift_angles(vqc: nn.Module) -> int:
    """Gate angles of one circuit that depend on a trainable parameter: each needs its two shifted
    circuits per row for a gradient. Every ansatz weight is one; encoding angles count when a trainable
    input scale or pre-layer feeds them (one per encoded feature and encoding block)."""
    angles = int(vqc.weights.numel()) if vqc.weights.requires_grad else 0
    trainable_input = ((vqc.input_scale is not None and vqc.input_scale.requires_grad)
                       or (vqc.pre is not None and any(p.requires_grad for p in vqc.pre.parameters())))
    if trainable_input:
        blocks = vqc.cfg.layers if vqc.cfg.reupload else 1
        encoded = vqc.cfg.n_qubits if vqc.pre is not None else vqc.n_features
        angles += blocks * encoded
    return angles


class CircuitCounter:
    """Counts one VQC's circuit executions (a forward hook; picklable, so sim snapshots keep it)."""

    def __init__(self, vqc: nn.Module) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.shots = head_shots(vqc)
        self.angles = shift_angles(vqc)

    def __call__(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.forward()
        if output.requires_grad:
            output.register_hook(self._on_grad)

    def _on_grad(self, grad: torch.Tensor) -> None:
        self.backward(int((grad != 0).any(dim=-1).sum()))

    def forward(self, calls: int = 1) -> None:
        """Forward calls: one job each. Their circuits and shots are the head's own ``resource_counts``
        (counted where the rows are evaluated, ``circuits.gradients.count``), not counted again here."""
        self.counts["act_jobs"] += calls

    def backward(self, rows: int) -> None:
        """One backward (one job) through ``rows`` rows with a nonzero output gradient (none: no job)."""
        if rows == 0:
            return
        self.backwards(rows, 1)

    def backwards(self, rows: int, jobs: int) -> None:
        """``jobs`` backwards (each with at least one row) through ``rows`` rows with a nonzero output
        gradient in all: what ``backward`` counts for each, added at once (``circuits.twins.SeedBatchedVQC``)."""
        circuits = rows * SHIFTS_PER_ANGLE * self.angles
        self.counts["grad_circuits"] += circuits
        self.counts["grad_shots"] += circuits * (self.shots or 0)
        self.counts["grad_jobs"] += jobs

    def backward_grad(self, grad: np.ndarray) -> None:
        """``backward`` from an output gradient (B, m) in numpy (the one-step numpy path)."""
        self.backward(int(np.any(grad != 0, axis=-1).sum()))


def circuit_heads(module: nn.Module) -> list[nn.Module]:
    """Every VQC inside ``module`` (a head may hold several)."""
    from circuits.vqc import VQC

    return [m for m in module.modules() if isinstance(m, VQC)]


def counter_of(vqc: nn.Module) -> Optional[CircuitCounter]:
    """The counter ``attach`` hooked onto ``vqc``, or None."""
    return next((h for h in vqc._forward_hooks.values() if isinstance(h, CircuitCounter)), None)


def attach(vqc: nn.Module) -> CircuitCounter:
    """Hook a counter onto ``vqc`` (once; a second call returns the first)."""
    counter = counter_of(vqc)
    if counter is None:
        counter = CircuitCounter(vqc)
        vqc.register_forward_hook(counter)
    return counter


def head_totals(vqc: nn.Module) -> dict[str, int]:
    """A head's cumulative counters. Forwards and jobs from this module's counter; gradient circuits
    from the head's own ``resource_counts`` when it computes its gradient as hardware would
    (``grad: parameter_shift | spsa``: the circuits it really ran), else the parameter-shift
    equivalent of its analytic gradient counted here."""
    counts = dict(attach(vqc).counts)
    own = vqc.resource_counts
    counts.update(act_circuits=int(own["act_circuits"]), act_shots=int(own["act_shots"]))
    if vqc.cfg.grad != "analytic":
        counts.update(grad_circuits=int(own["grad_circuits"]), grad_shots=int(own["grad_shots"]))
    return counts


class HeadResources:
    """A worker's circuit heads by role (``actor``, ``critic``): cumulative counts, and the counts since
    the last ``take`` (what the worker reports with each step, ``Work.resources``)."""

    def __init__(self, roles: dict[str, nn.Module]) -> None:
        self.heads = {role: circuit_heads(module) for role, module in roles.items()}
        self.heads = {role: heads for role, heads in self.heads.items() if heads}
        for heads in self.heads.values():
            for vqc in heads:
                attach(vqc)
        self.exact = {role: all(head_shots(v) is None for v in heads) for role, heads in self.heads.items()}
        self._reported = {role: dict.fromkeys(COUNTERS, 0) for role in self.heads}

    @classmethod
    def of(cls, roles: dict[str, nn.Module]) -> Optional["HeadResources"]:
        """Counters for the circuit heads among ``roles``, or None when there is none."""
        found = cls(roles)
        return found if found.heads else None

    def totals(self) -> dict[str, dict[str, int]]:
        out = {}
        for role, heads in self.heads.items():
            summed = dict.fromkeys(COUNTERS, 0)
            for vqc in heads:
                for key, value in head_totals(vqc).items():
                    summed[key] += value
            out[role] = summed
        return out

    def take(self) -> dict[str, Any]:
        """The counts since the previous ``take``: {role: {counter: int}, "exact": {role: bool}}."""
        totals = self.totals()
        delta = {role: {k: totals[role][k] - self._reported[role][k] for k in COUNTERS} for role in totals}
        self._reported = totals
        return {"counts": delta, "exact": dict(self.exact)}
