"""The executors' numpy entry points: a ``VQC`` head run outside torch, for the agents' hot loops.

Koelle's quantum A2C updates after every env step, on one observation, with heads of about 30
parameters, and COMA's actors act on three rows per step. At that size torch spends most of a call in
per-op dispatch and in the autograd engine, not in arithmetic. A twin runs the same head on float64
numpy rows, reading the parameters from (and writing the gradients into) the torch module's own
tensors:

- ``NumpyVQC``: forward and backward (``forward`` returns a ``ForwardCache`` that ``backward`` takes);
- ``NumpyVQCActing``: the forward alone, with an optional ``preprocess: linear`` pre-layer.

Which executor runs is the planner's (``circuits.planner``, entry ``numpy``): the statevector
executor's compiled kernels for few rows, its numpy blocks or the dense executor past them. The
public API the agents call: ``training_twin(module)`` / ``acting_twin(module)`` (None: the head has
no twin, keep torch), then ``forward(x)`` and ``backward(cache, grad)``.

A head with shots, noise or a gradient rule has no twin (the twins are exact and would draw no shots).
The twins agree with torch autograd to float rounding (tests/agents/test_numpy_heads.py,
test_numpy_acting.py) and with PennyLane (tests/circuits/test_kernels.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from circuits import gates, kernels, statevector
from circuits.gradients import count
from circuits.planner import ANALYTIC_MAX_BATCH, Plan, Planner
from circuits.program import program_of
from circuits.resources import counter_of


@dataclass
class ForwardCache:
    """What ``NumpyVQC.forward`` hands back to ``backward``: the readouts, the post-layer's input (None
    without one), the plan that ran, and that executor's saved state (``kernels``: final states, the
    wires' matrices and generators; ``blocks``: the final state and the blocks; dense: r, the amplitudes
    and the ``DenseGradient``)."""

    readouts: np.ndarray
    hidden: Optional[np.ndarray]
    plan: Plan
    saved: tuple


class NumpyVQC:
    """Forward and backward of a ``VQC`` in numpy (see the module docstring): fixed feature scaling
    (none | atan | bound), no pre-layer, any output but a trainable scale."""

    OUTPUTS = ("raw", "sum", "linear", "relu_linear")

    def __init__(self, vqc: Any) -> None:
        self.vqc = vqc
        circuit = vqc.circuit
        self.shifts = circuit.bit_shifts.numpy().astype(np.float64)[None]  # (1, n, 2^n)
        self.readout = circuit.readout_stacked.numpy().astype(np.float64)  # (2^(n+1), m)
        self.missing = vqc.cfg.n_qubits - vqc.n_features
        self.bounded = vqc.bounded.numpy() if vqc.cfg.scaling == "bound" else None
        self.bound_scale = vqc.bound_scale.numpy().astype(np.float64) if vqc.cfg.scaling == "bound" else None
        self.sum_groups = vqc.sum_groups.numpy().astype(np.float64) if vqc.cfg.output == "sum" else None
        self.use_blocks = True  # the planner may choose the statevector executor's numpy blocks
        self.use_kernels = True  # ... and its compiled kernels (where numba is here)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_planner", None)
        return state

    def plan(self, rows: int) -> Plan:
        """The planner's answer for ``rows`` rows (kept per row count)."""
        planner = self.__dict__.get("_planner")
        if planner is None:
            pinned = frozenset(name for name, allowed in (("blocks", self.use_blocks), ("kernels", self.use_kernels))
                               if not allowed)
            planner = self.__dict__["_planner"] = Planner(self.vqc.facts(), "numpy",
                                                          kernels.max_rows(self.vqc.cfg.n_qubits), pinned)
        return planner(rows, self.GRAD)

    GRAD = True

    @staticmethod
    def supports(module: nn.Module) -> bool:
        from circuits.vqc import VQC

        if not isinstance(module, VQC):
            return False
        cfg = module.cfg
        # (a head with shots, noise or a hardware gradient rule has analytic_grad off and is not on the
        # statevector executor: the torch path)
        return ((module.analytic_grad or module.plan(ANALYTIC_MAX_BATCH, True).executor == "statevector")
                and module.pre is None and module.input_scale is None and cfg.scaling in ("none", "atan", "bound")
                and cfg.output in NumpyVQC.OUTPUTS)

    def _angles(self, x: np.ndarray) -> np.ndarray:
        scaling = self.vqc.cfg.scaling
        if scaling == "atan":
            x = 2.0 * np.arctan(x)
        elif scaling == "bound":
            x = np.where(self.bounded, x * self.bound_scale, 2.0 * np.arctan(x))
        if self.missing:
            x = np.pad(x, ((0, 0), (0, self.missing)))
        return x

    def _count_forward(self, rows: int) -> None:
        """What ``VQC.forward`` counts, for a forward this path runs instead: ``rows`` circuits in the
        head's counters (circuits.gradients; exact: no shots) and one job in its forward hook's, which
        does not see this path."""
        count(self.vqc, "act", rows, self.vqc.cfg.shots)
        counter = counter_of(self.vqc)
        if counter is not None:
            counter.forward()

    def _circuit_and_weights(self) -> tuple[Any, torch.Tensor]:
        """The head's circuit and weights, read from nn.Module's registries (its attribute lookup costs
        about half a microsecond each, a visible part of a one-row act)."""
        return self.vqc._modules["circuit"], self.vqc._parameters["weights"]

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, ForwardCache]:
        self._count_forward(x.shape[0])
        plan = self.plan(x.shape[0])
        circuit, weights = self._circuit_and_weights()
        if plan.variant == "kernels":
            program = program_of(circuit)
            rot, gen = kernels.rotations(program, weights.detach().numpy().astype(np.float64), True)
            readouts, states = kernels.forward(program, self._angles(x), rot, True)
            out, hidden = self._head(readouts)
            return out, ForwardCache(readouts, hidden, plan, (program, states, rot, gen))
        if plan.variant == "blocks":
            statevector.single_thread_blas()
            statevector.keep_heap()
            program = program_of(circuit)
            w = weights.detach().numpy()
            blocks = statevector.BlockMatrices(program, w.astype(np.float64), True)
            angles = self._angles(x).astype(w.dtype)
            kept: list[np.ndarray] | None = [] if statevector.keeps_states(program, angles.shape[0]) else None
            psi = statevector.final_state(program, angles, blocks, kept)[0]
            readouts = statevector.readouts_of(psi, program).astype(np.float64)
            out, hidden = self._head(readouts)
            return out, ForwardCache(readouts, hidden, plan, (program, psi, blocks, kept))
        dense, gradient = self.vqc.dense_with_gradient()  # cached until the weights change
        r = self._product_state(x)
        out, amplitudes, readouts, hidden = self._outputs(r, dense.numpy().astype(np.float64))
        return out, ForwardCache(readouts, hidden, plan, (r, amplitudes, gradient))

    def _product_state(self, x: np.ndarray) -> np.ndarray:
        """The encoded product state (B, 2^n)."""
        return gates.product_state(self._angles(x), bit_shifts=self.shifts)

    def _outputs(self, r: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """From the product state and the circuit's float64 matrix: the outputs, the final state's
        amplitudes (B, 2^(n+1): [Re | Im]), the readouts, and the post-layer's input (None without one)."""
        amplitudes = r @ dense
        readouts = (amplitudes * amplitudes) @ self.readout
        out, hidden = self._head(readouts)
        return out, amplitudes, readouts, hidden

    def _head(self, readouts: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """The output layer on readouts (B, m): the outputs and the post-layer's input (None without one)."""
        kind = self.vqc.cfg.output
        if kind == "raw":
            return readouts[:, : self.vqc.out_dim], None
        if kind == "sum":
            return readouts @ self.sum_groups, None
        hidden = np.maximum(readouts, 0.0) if kind == "relu_linear" else readouts
        post = self.vqc._modules["post"]
        weight, bias = post._parameters["weight"], post._parameters["bias"]
        return hidden @ weight.detach().numpy().T.astype(np.float64) + bias.detach().numpy(), hidden

    def backward(self, cache: ForwardCache, grad: np.ndarray) -> None:
        """Write d loss / d parameters into the parameters' .grad (views of the flat gradient)."""
        readouts, hidden = cache.readouts, cache.hidden
        counter = counter_of(self.vqc)
        if counter is not None:
            counter.backward_grad(grad)
        kind = self.vqc.cfg.output
        if kind == "raw":
            grad_readouts = np.zeros_like(readouts)
            grad_readouts[:, : grad.shape[1]] = grad
        elif kind == "sum":
            grad_readouts = grad @ self.sum_groups.T
        else:
            post = self.vqc._modules["post"]
            weight, bias = post._parameters["weight"], post._parameters["bias"]
            weight.grad.numpy()[...] = grad.T @ hidden
            bias.grad.numpy()[...] = grad.sum(axis=0)
            grad_readouts = grad @ weight.detach().numpy().astype(np.float64)
            if kind == "relu_linear":
                grad_readouts = grad_readouts * (readouts > 0.0)
        variant = cache.plan.variant
        if variant == "kernels":
            program, states, rot, gen = cache.saved
            weight_grad = kernels.weight_grad(program, states, grad_readouts, rot, gen)
        elif variant == "blocks":
            program, psi, blocks, kept = cache.saved
            weight_grad = statevector.backward_sweep(program, psi, grad_readouts.astype(psi.real.dtype), blocks, True,
                                                     kept)[1]
        else:
            r, amplitudes, gradient = cache.saved
            weight_grad = gradient.weight_grad(r, 2.0 * amplitudes * (grad_readouts @ self.readout.T))
        self._circuit_and_weights()[1].grad.numpy()[...] = weight_grad


class NumpyVQCActing(NumpyVQC):
    """The forward pass alone of a ``VQC``, for acting (no backward): as ``NumpyVQC`` plus an optional
    ``preprocess: linear`` pre-layer. What the planner builds is cached per weights: the kernels' wire
    matrices, or the blocks; the dense executor's matrix is the head's own cache (a head given a twin is
    marked acting only, ``circuits.vqc.mark_acting_only``, so a weight change rebuilds just that
    matrix). An actor's weights change every few dozen acts, and rebuilding a 2^n x 2^n matrix from 5
    qubits cost more than all its acts together: the planner takes the blocks there."""

    GRAD = False

    def __init__(self, vqc: Any) -> None:
        from circuits.vqc import mark_acting_only

        super().__init__(vqc)
        mark_acting_only(vqc)
        self._dense: tuple[Any, np.ndarray] | None = None  # (the torch matrix, its float64 copy)
        # (the weights, what was built from them: "blocks" (statevector.BlockMatrices), "rotations" (kernels))
        self._per_weights: statevector.WeightsCache | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_per_weights"] = None  # a cache: rebuilt from the weights on the next act (the same matrices)
        return state

    def _built(self, key: str, make: Any) -> Any:
        """make(weights as float64 numpy) for the head's current weights, cached until they change."""
        self._per_weights, value = statevector.built_for_weights(self._per_weights, self._circuit_and_weights()[1].detach(),
                                                                 key, make)
        return value

    @staticmethod
    def supports(module: nn.Module) -> bool:
        from circuits.vqc import VQC

        if not isinstance(module, VQC):
            return False
        cfg = module.cfg
        # (a head with shots, noise or a hardware gradient rule runs through its Hardware, which this
        # exact twin would skip: the torch path)
        return ((module.use_dense or module.plan(ANALYTIC_MAX_BATCH, True).executor == "statevector")
                and cfg.backend == "torch" and module.weights.device.type == "cpu"
                and module.hardware is None and module.input_scale is None and cfg.scaling in ("none", "atan", "bound")
                and cfg.output in NumpyVQC.OUTPUTS)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, None]:
        self._count_forward(x.shape[0])
        pre = self.vqc.pre
        if pre is not None:
            x = x @ pre.weight.detach().numpy().T.astype(np.float64) + pre.bias.detach().numpy()
        variant = self.plan(x.shape[0]).variant
        if variant == "kernels":
            program = program_of(self._circuit_and_weights()[0])
            rot = self._built("rotations", lambda weights: kernels.rotations(program, weights, False)[0])
            return self._head(kernels.forward(program, self._angles(x), rot, False)[0])[0], None
        if variant == "blocks":
            program = program_of(self._circuit_and_weights()[0])
            blocks = self._built("blocks", lambda weights: statevector.BlockMatrices(program, weights, False))
            angles = self._angles(x).astype(self.vqc.weights.detach().numpy().dtype)
            readouts = statevector.readouts_np(program, angles, blocks).astype(np.float64)
            return self._head(readouts)[0], None
        with torch.no_grad():
            dense = self.vqc.dense_matrix()  # cached until the weights change
        if self._dense is None or self._dense[0] is not dense:
            self._dense = (dense, dense.numpy().astype(np.float64))
        return self._outputs(self._product_state(x), self._dense[1])[0], None

    def backward(self, cache: Any, grad: np.ndarray) -> None:
        raise TypeError("NumpyVQCActing is for acting only: it has no backward pass")


def training_twin(module: nn.Module) -> Optional[NumpyVQC]:
    """The forward-and-backward twin of a circuit head, or None (keep torch)."""
    return NumpyVQC(module) if NumpyVQC.supports(module) else None


def acting_twin(module: nn.Module) -> Optional[NumpyVQCActing]:
    """The acting twin of a circuit head that is never differentiated, or None (keep torch)."""
    return NumpyVQCActing(module) if NumpyVQCActing.supports(module) else None
