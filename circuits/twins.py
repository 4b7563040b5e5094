"""The executors' numpy entry points: a ``VQC`` head run outside torch, for the agents' hot loops.

Koelle's quantum A2C updates after every env step, on one observation, with heads of about 30
parameters, and COMA's actors act on three rows per step. At that size torch spends most of a call in
per-op dispatch and in the autograd engine, not in arithmetic. A twin runs the same head on float64
numpy rows, reading the parameters from (and writing the gradients into) the torch module's own
tensors:

- ``NumpyVQC``: forward and backward (``forward`` returns a ``ForwardCache`` that ``backward`` takes);
- ``NumpyVQCActing``: the forward alone, with an optional ``preprocess: linear`` pre-layer;
- ``SeedBatchedVQC``: forward and backward of one head per seed, the parameters with a leading seed
  axis (batched seeds, ``agents.batched_a2c``), each seed's bits its own ``NumpyVQC``'s.

Which executor runs is the planner's (``circuits.planner``, entry ``numpy``): the statevector
executor's compiled kernels for few rows, past them (training and acting, 5-8 qubits) the same kernels
over a batch-last state (``columns``), else its numpy blocks or the dense executor. The
public API the agents call: ``training_twin(module)`` / ``acting_twin(module)`` (None: the head has
no twin, keep torch), then ``forward(x)`` and ``backward(cache, grad)``; ``seed_batched_twin(modules)``.

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
from circuits.planner import ANALYTIC_MAX_BATCH, Plan, Planner, without_pauli
from circuits.planner import plan as planned
from circuits.program import program_of
from circuits.resources import counter_of
from marl_q.native import single_thread_blas


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


def head_forward(kind: str, readouts: np.ndarray, out_dim: int, sum_groups: Optional[np.ndarray],
                 weight: Optional[np.ndarray], bias: Optional[np.ndarray]) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A twin's output layer (``output`` key ``kind``) on readouts (..., B, m): the outputs and the
    post-layer's input (None without one). ``weight`` (..., out, m) and ``bias`` (..., out) are the
    post-layer's, float32 as stored, with the same leading axes as the readouts (a seed axis: each
    seed's slice is the 2-D product of its single call)."""
    if kind == "raw":
        return readouts[..., : out_dim], None
    if kind == "sum":
        return readouts @ sum_groups, None
    if kind == "scaled":  # ``weight``: the output scale (out,); the product rounded to its dtype, as torch's
        return (readouts[..., : out_dim] * weight).astype(weight.dtype), None
    hidden = np.maximum(readouts, 0.0) if kind == "relu_linear" else readouts
    if weight.ndim == 2:  # one head (the hot path of a one-row act: no axis juggling, ~3 us of ~25)
        return hidden @ weight.T.astype(np.float64) + bias, hidden
    return hidden @ np.swapaxes(weight, -1, -2).astype(np.float64) + bias[..., None, :], hidden


def head_backward(kind: str, readouts: np.ndarray, hidden: Optional[np.ndarray], grad: np.ndarray,
                  sum_groups: Optional[np.ndarray], weight: Optional[np.ndarray]
                  ) -> tuple[np.ndarray, Optional[tuple[np.ndarray, np.ndarray]]]:
    """``head_forward``'s backward from d loss / d outputs (..., B, out): d loss / d readouts, and the
    post-layer's (weight, bias) gradients (None without one)."""
    if kind == "raw":
        grad_readouts = np.zeros_like(readouts)
        grad_readouts[..., : grad.shape[-1]] = grad
        return grad_readouts, None
    if kind == "sum":
        return grad @ sum_groups.T, None
    post_grads = ((grad.T if grad.ndim == 2 else np.swapaxes(grad, -1, -2)) @ hidden, grad.sum(axis=-2))
    grad_readouts = grad @ weight.astype(np.float64)
    if kind == "relu_linear":
        grad_readouts = grad_readouts * (readouts > 0.0)
    return grad_readouts, post_grads


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
        self.use_columns = True  # ... and, for calls of more rows, those kernels over a batch-last state

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_planner", None)
        return state

    def plan(self, rows: int) -> Plan:
        """The planner's answer for ``rows`` rows (kept per row count)."""
        planner = self.__dict__.get("_planner")
        if planner is None:
            pinned = frozenset(name for name, allowed in (("blocks", self.use_blocks), ("kernels", self.use_kernels),
                                                          ("columns", self.use_columns)) if not allowed)
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
        return ((module.analytic_grad or planned(without_pauli(module.facts()), ANALYTIC_MAX_BATCH, True).executor == "statevector")
                and module.pre is None and module.input_scale is None and cfg.scaling in ("none", "atan", "bound")
                and cfg.output in NumpyVQC.OUTPUTS)

    def _angles(self, x: np.ndarray) -> np.ndarray:
        """Encoding angles (B, n) of inputs (B, features), or (B, L, n) with trainable scaling and
        re-uploading (``VQC.angles``): a trainable scale's product is rounded to its dtype, as torch's."""
        scaling = self.vqc.cfg.scaling
        if scaling == "atan":
            x = 2.0 * np.arctan(x)
        elif scaling == "bound":
            x = np.where(self.bounded, x * self.bound_scale, 2.0 * np.arctan(x))
        elif scaling == "trainable":
            scale = self.vqc._parameters["input_scale"].detach().numpy()
            x = (x[:, None, :] * scale).astype(scale.dtype)
            if not self.vqc.cfg.reupload:
                x = x[:, 0]
        if self.missing:
            x = np.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, self.missing),))
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
        if plan.variant in ("kernels", "columns"):
            program = program_of(circuit)
            rot, gen = kernels.rotations(program, weights.detach().numpy().astype(np.float64), True)
            run = kernels.forward if plan.variant == "kernels" else kernels.columns_forward
            readouts, states = run(program, self._angles(x), rot, True)
            out, hidden = self._head(readouts)
            return out, ForwardCache(readouts, hidden, plan, (program, states, rot, gen))
        if plan.variant == "blocks":
            single_thread_blas()
            statevector.keep_heap()
            program = program_of(circuit)
            w = weights.detach().numpy()
            blocks = statevector.BlockMatrices(program, w.astype(np.float64), True)
            angles, uploads = statevector.reupload_inputs(program, self._angles(x).astype(w.dtype))
            kept: list[np.ndarray] | None = [] if statevector.keeps_states(program, angles.shape[0]) else None
            psi = statevector.final_state(program, angles, blocks, kept, uploads)[0]
            readouts = statevector.readouts_of(psi, program).astype(np.float64)
            out, hidden = self._head(readouts)
            return out, ForwardCache(readouts, hidden, plan, (program, psi, blocks, kept, uploads))
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
        post = self.vqc._modules.get("post")
        weight, bias = (None, None) if post is None else (post._parameters["weight"].detach().numpy(),
                                                          post._parameters["bias"].detach().numpy())
        if self.vqc.cfg.output == "scaled":
            weight = self.vqc._parameters["output_scale"].detach().numpy()
        return head_forward(self.vqc.cfg.output, readouts, self.vqc.out_dim, self.sum_groups, weight, bias)

    def backward(self, cache: ForwardCache, grad: np.ndarray) -> None:
        """Write d loss / d parameters into the parameters' .grad (views of the flat gradient)."""
        readouts, hidden = cache.readouts, cache.hidden
        counter = counter_of(self.vqc)
        if counter is not None:
            counter.backward_grad(grad)
        post = self.vqc._modules.get("post")
        weight = None if post is None else post._parameters["weight"]
        grad_readouts, post_grads = head_backward(self.vqc.cfg.output, readouts, hidden, grad, self.sum_groups,
                                                  None if weight is None else weight.detach().numpy())
        if post_grads is not None:
            weight.grad.numpy()[...], post._parameters["bias"].grad.numpy()[...] = post_grads
        variant = cache.plan.variant
        if variant in ("kernels", "columns"):
            program, states, rot, gen = cache.saved
            run = kernels.weight_grad if variant == "kernels" else kernels.columns_weight_grad
            weight_grad = run(program, states, grad_readouts, rot, gen)
        elif variant == "blocks":
            program, psi, blocks, kept, uploads = cache.saved
            weight_grad = statevector.backward_sweep(program, psi, grad_readouts.astype(psi.real.dtype), blocks, True,
                                                     kept, uploads)[1]
        else:
            r, amplitudes, gradient = cache.saved
            weight_grad = gradient.weight_grad(r, 2.0 * amplitudes * (grad_readouts @ self.readout.T))
        self._circuit_and_weights()[1].grad.numpy()[...] = weight_grad


class NumpyVQCActing(NumpyVQC):
    """The forward pass alone of a ``VQC``, for acting (no backward): as ``NumpyVQC`` plus an optional
    ``preprocess: linear`` pre-layer. What the planner builds is cached per weights: the kernels' wire
    matrices (per-row and columns kernels alike), or the blocks; the dense executor's matrix is the head's own cache (a head given a twin is
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
        return ((module.use_dense or planned(without_pauli(module.facts()), ANALYTIC_MAX_BATCH, True).executor == "statevector")
                and cfg.backend == "torch" and module.weights.device.type == "cpu"
                and module.hardware is None and cfg.output in NumpyVQCActing.OUTPUTS)

    OUTPUTS = NumpyVQC.OUTPUTS + ("scaled",)  # and every scaling, trainable included (``_angles``)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, None]:
        self._count_forward(x.shape[0])
        pre = self.vqc.pre
        if pre is not None:
            x = x @ pre.weight.detach().numpy().T.astype(np.float64) + pre.bias.detach().numpy()
        variant = self.plan(x.shape[0]).variant
        if variant in ("kernels", "columns"):
            program = program_of(self._circuit_and_weights()[0])
            rot = self._built("rotations", lambda weights: kernels.rotations(program, weights, False)[0])
            run = kernels.forward if variant == "kernels" else kernels.columns_forward
            return self._head(run(program, np.asarray(self._angles(x), dtype=np.float64), rot, False)[0])[0], None
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


class SeedBatchedVQC:
    """One ``VQC`` head per seed (the same spec, each seed its own weights), forward and backward for all
    seeds at once: the parameters with a leading seed axis (S, P), in ``module.parameters()`` order,
    and the inputs (S, B, in). What batched seeds (``agents.batched_a2c``) call instead of S twins.

    The plan is the one planner's, for one seed's call (B rows, numpy entry, as ``NumpyVQC.plan``): S
    weight sets cannot share a matrix, so a seed's rows are what the executor's cost depends on. On the
    statevector executor's compiled kernels (every shipped one-step A2C head: 1 or 2 rows) all seeds
    run in one compiled call per pass (``kernels.forward_seeds``, ``rotations_seeds``,
    ``weight_grad_seeds``), in which each seed runs the single call's loops on its own slices, and the
    output layer is a stacked product whose slices are the single call's 2-D products: each seed's
    outputs and gradients have the bits of its own twin. Any other plan (more rows than the kernels
    take, numba not here) runs each seed's own twin in turn (``NumpyVQC``) on its row of parameters.

    The circuits counted (``circuits.resources``) are kept per seed and added to a seed's head counters
    by ``report_counts``, before its counts are read: the totals its twin would have counted call by call."""

    PENDING = ("act_rows", "act_calls", "grad_rows", "grad_calls")  # per seed, since its last report_counts

    def __init__(self, modules: list[nn.Module]) -> None:
        self.twins = [NumpyVQC(m) for m in modules]
        self.vqc = modules[0]
        self.layout: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # name -> (offset in a seed's row, size, shape)
        offset = 0
        for name, p in self.vqc.named_parameters():
            self.layout[name] = (offset, p.numel(), tuple(p.shape))
            offset += p.numel()
        self.size = offset
        self.pending = np.zeros((len(modules), len(self.PENDING)), dtype=np.int64)

    @staticmethod
    def supports(modules: list[nn.Module]) -> bool:
        return (bool(modules) and all(NumpyVQC.supports(m) and m.cfg == modules[0].cfg for m in modules)
                and all(p.requires_grad for p in modules[0].parameters()))

    def _param(self, params: np.ndarray, name: str) -> np.ndarray:
        """The parameter ``name`` of every seed: (S, *shape), as stored (float32)."""
        offset, size, shape = self.layout[name]
        return params[:, offset:offset + size].reshape((params.shape[0],) + shape)

    def _post(self, params: np.ndarray) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        if "post.weight" not in self.layout:
            return None, None
        return self._param(params, "post.weight"), self._param(params, "post.bias")

    def forward(self, params: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ForwardCache]:
        """Outputs (S, B, out) of inputs x (S, B, in) float64 at every seed's parameters (S, P)."""
        S, rows = x.shape[:2]
        first = self.twins[0]
        plan = first.plan(rows)
        if plan.variant != "kernels":
            outs, caches = [], []
            for s, twin in enumerate(self.twins):
                self._load(twin.vqc, params[s])
                out, cache = twin.forward(x[s])
                outs.append(out)
                caches.append(cache)
            return np.stack(outs), ForwardCache(np.empty(0), None, plan, tuple(caches))
        self.pending[:, 0] += rows
        self.pending[:, 1] += 1
        program = program_of(self.vqc._modules["circuit"])
        rot, gen = kernels.rotations_seeds(program, self._param(params, "weights").astype(np.float64), True)
        angles = first._angles(x.reshape(S * rows, x.shape[2])).reshape(S, rows, -1)
        readouts, states = kernels.forward_seeds(program, angles, rot, True)
        weight, bias = self._post(params)
        out, hidden = head_forward(self.vqc.cfg.output, readouts, self.vqc.out_dim, first.sum_groups, weight, bias)
        return out, ForwardCache(readouts, hidden, plan, (program, states, rot, gen, weight))

    def backward(self, cache: ForwardCache, grad: np.ndarray, out: np.ndarray) -> None:
        """d loss / d parameters of every seed into ``out`` (S, P) from d loss / d outputs (S, B, out)."""
        if cache.plan.variant != "kernels":
            for s, (twin, seed_cache) in enumerate(zip(self.twins, cache.saved)):
                params = list(twin.vqc.parameters())
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                twin.backward(seed_cache, grad[s])
                out[s] = np.concatenate([p.grad.numpy().reshape(-1) for p in params])
            return
        rows = np.count_nonzero(np.any(grad != 0.0, axis=-1), axis=1)
        self.pending[:, 2] += rows
        self.pending[:, 3] += rows > 0
        program, states, rot, gen, weight = cache.saved
        grad_readouts, post_grads = head_backward(self.vqc.cfg.output, cache.readouts, cache.hidden, grad,
                                                  self.twins[0].sum_groups, weight)
        S = grad.shape[0]
        grads = {"weights": kernels.weight_grad_seeds(program, states, grad_readouts, rot, gen)}
        if post_grads is not None:
            grads["post.weight"], grads["post.bias"] = post_grads
        for name, (offset, size, _) in self.layout.items():
            out[:, offset:offset + size] = grads[name].reshape(S, -1)

    def _load(self, vqc: nn.Module, row: np.ndarray) -> None:
        """A seed's parameters from its row, into its module (for its own twin)."""
        for name, p in vqc.named_parameters():
            offset, size, shape = self.layout[name]
            p.detach().numpy()[...] = row[offset:offset + size].reshape(shape)

    def report_counts(self, seed: int) -> None:
        """Add seed's circuits since its last report to its head's counters (``circuits.gradients.count``,
        the head's ``CircuitCounter``), as its twin would have added them call by call."""
        act_rows, act_calls, grad_rows, grad_calls = self.pending[seed].tolist()
        vqc = self.twins[seed].vqc
        count(vqc, "act", act_rows, vqc.cfg.shots)
        counter = counter_of(vqc)
        if counter is not None:
            counter.forward(act_calls)
            counter.backwards(grad_rows, grad_calls)
        self.pending[seed] = 0


def seed_batched_twin(modules: list[nn.Module]) -> Optional[SeedBatchedVQC]:
    """The forward-and-backward entry point of one circuit head per seed (weights with a seed axis), or
    None (a head without a twin, or seeds whose specs differ)."""
    return SeedBatchedVQC(modules) if SeedBatchedVQC.supports(modules) else None


def training_twin(module: nn.Module) -> Optional[NumpyVQC]:
    """The forward-and-backward twin of a circuit head, or None (keep torch)."""
    return NumpyVQC(module) if NumpyVQC.supports(module) else None


def acting_twin(module: nn.Module) -> Optional[NumpyVQCActing]:
    """The acting twin of a circuit head that is never differentiated, or None (keep torch)."""
    return NumpyVQCActing(module) if NumpyVQCActing.supports(module) else None
