"""Numpy forward and backward passes for small heads, and the one-step A2C update built on them.

Koelle's quantum A2C updates after every env step, on one observation, with heads of about 30
parameters. At that size torch spends most of a step in per-call dispatch and in the autograd engine,
not in arithmetic: a 4-5-2 MLP and a 16 x 32 circuit matrix take microseconds in numpy. So for the
heads whose gradients are simple to write down (``mlp``, and ``vqc``/``hybrid`` on the dense analytic
path), the worker runs forward and backward here, in float64, reading the parameters from (and
writing the gradients into) the same flat buffer the torch modules view. Everything else keeps the
torch path. ``algorithm.fast_path: false`` turns this off; the two paths agree to float rounding
(tests/agents/test_numpy_heads.py checks them against torch autograd).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from agents.losses import a2c_loss_grad, diagnostics, explained_variance
from agents.returns import rollout_targets
from circuits import kernels
from circuits.adjoint import built_for_weights
from circuits.gradients import count
from circuits.resources import counter_of

# a head's cache from forward, handed back to backward
Cache = tuple


class NumpyMLP:
    """``nn.Sequential`` of Linear / Tanh / ReLU layers (the ``mlp`` head)."""

    def __init__(self, net: nn.Sequential) -> None:
        self.layers: list[tuple[str, Any]] = []
        for module in net:
            if isinstance(module, nn.Linear):
                self.layers.append(("linear", module))
            elif isinstance(module, nn.Tanh):
                self.layers.append(("tanh", None))
            elif isinstance(module, nn.ReLU):
                self.layers.append(("relu", None))
            else:  # pragma: no cover - numpy_head checks first
                raise TypeError(f"no numpy pass for {type(module).__name__}")

    @staticmethod
    def supports(net: nn.Module) -> bool:
        return isinstance(net, nn.Sequential) and all(isinstance(m, (nn.Linear, nn.Tanh, nn.ReLU)) for m in net)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Cache]:
        saved = []
        h = x
        for kind, module in self.layers:
            saved.append(h)
            if kind == "linear":
                h = h @ module.weight.detach().numpy().T.astype(np.float64) + module.bias.detach().numpy()
            elif kind == "tanh":
                h = np.tanh(h)
            else:
                h = np.maximum(h, 0.0)
        return h, (saved, h)

    def backward(self, cache: Cache, grad: np.ndarray) -> None:
        """Write d loss / d parameters into the parameters' .grad (views of the flat gradient)."""
        saved, out = cache
        outputs = saved[1:] + [out]
        for (kind, module), h_in, h_out in zip(reversed(self.layers), reversed(saved), reversed(outputs)):
            if kind == "linear":
                module.weight.grad.numpy()[...] = grad.T @ h_in
                module.bias.grad.numpy()[...] = grad.sum(axis=0)
                grad = grad @ module.weight.detach().numpy().astype(np.float64)
            elif kind == "tanh":
                grad = grad * (1.0 - h_out * h_out)
            else:
                grad = grad * (h_out > 0.0)


class NumpyVQC:
    """A ``VQC`` whose weight gradient has a numpy form: up to 4 qubits the dense path's analytic gradient
    (circuits.engine.DenseAdjoint), from 5 (where the torch head takes the adjoint path) the adjoint
    state-vector sweeps of circuits.adjoint, without torch's autograd around them; fixed feature scaling
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
        self.adjoint = NumpyVQC.on_adjoint_path(vqc)
        self.kernels = True  # few rows through circuits.kernels (where numba is here)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a twin pickled before the adjoint form or the kernels existed (a sim snapshot) keeps the path it
        # ran on: the resumed run computes what the snapshot's would have, to the bit
        state.setdefault("adjoint", False)
        state.setdefault("kernels", False)
        self.__dict__.update(state)

    @staticmethod
    def on_adjoint_path(vqc: Any) -> bool:
        """Whether the torch head's gradient would take the adjoint state-vector path (from 5 qubits on the
        CPU, with the exact torch engine): the twin then runs its numpy sweeps."""
        from circuits.vqc import ANALYTIC_MAX_BATCH

        return (vqc.cfg.backend == "torch" and vqc.hardware is None and vqc.weights.device.type == "cpu"
                and not vqc.cfg.reupload and vqc.path(ANALYTIC_MAX_BATCH, True) == "adjoint")

    @staticmethod
    def supports(module: nn.Module) -> bool:
        from circuits.vqc import VQC

        if not isinstance(module, VQC):
            return False
        cfg = module.cfg
        # (a head with shots, noise or a hardware gradient rule has analytic_grad off and is not on the
        # exact adjoint path: the torch path)
        return ((module.analytic_grad or NumpyVQC.on_adjoint_path(module)) and module.pre is None
                and module.input_scale is None and cfg.scaling in ("none", "atan", "bound")
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
        """The head's circuit and weights, read from nn.Module's registries: its attribute lookup costs about
        half a microsecond each, and an act at one row through the kernels about 16 in all."""
        return self.vqc._modules["circuit"], self.vqc._parameters["weights"]

    def _kernel_rows(self, rows: int) -> bool:
        """Whether ``rows`` rows run through the compiled kernels (circuits.kernels): few enough for this
        qubit count, and numba here."""
        return self.kernels and rows <= kernels.max_rows(self.vqc.cfg.n_qubits)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Cache]:
        self._count_forward(x.shape[0])
        if self._kernel_rows(x.shape[0]):
            circuit, weights = self._circuit_and_weights()
            rot, gen = kernels.rotations(circuit, weights.detach().numpy().astype(np.float64), True)
            readouts, states = kernels.forward(circuit, self._angles(x), rot, True)
            out, hidden = self._head(readouts)
            return out, (readouts, hidden, ("kernel", states, rot, gen))
        if self.adjoint:
            from circuits import adjoint

            adjoint.single_thread_blas()
            weights, circuit = self.vqc.weights.detach().numpy(), self.vqc.circuit
            blocks = adjoint.BlockMatrices(circuit, weights.astype(np.float64), True)
            structure = adjoint.structure_of(circuit)
            psi = adjoint.final_state(circuit, self._angles(x).astype(weights.dtype), blocks, structure)[0]
            readouts = adjoint.readouts_of(psi, structure).astype(np.float64)
            out, hidden = self._head(readouts)
            return out, (readouts, hidden, (psi, blocks, structure))
        dense, dense_adjoint = self.vqc.dense_adjoint()  # cached until the weights change
        r = self._product_state(x)
        out, amplitudes, readouts, hidden = self._outputs(r, dense.numpy().astype(np.float64))
        return out, (readouts, hidden, (r, amplitudes, dense_adjoint))

    def _product_state(self, x: np.ndarray) -> np.ndarray:
        """The encoded product state (B, 2^n)."""
        return np.cos(self._angles(x)[:, :, None] * 0.5 - self.shifts).prod(axis=1)

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

    def backward(self, cache: Cache, grad: np.ndarray) -> None:
        readouts, hidden, state = cache
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
        if isinstance(state[0], str):  # ("kernel", ...)
            _, states, rot, gen = state
            weight_grad = kernels.weight_grad(self._circuit_and_weights()[0], states, grad_readouts, rot, gen)
        elif self.adjoint:
            from circuits import adjoint

            psi, blocks, structure = state
            weight_grad = adjoint.backward_sweep(self.vqc.circuit, psi, grad_readouts.astype(psi.real.dtype),
                                                 blocks, structure, True)[1]
        else:
            r, amplitudes, dense_adjoint = state
            weight_grad = dense_adjoint.weight_grad(r, 2.0 * amplitudes * (grad_readouts @ self.readout.T))
        self._circuit_and_weights()[1].grad.numpy()[...] = weight_grad


class NumpyVQCActing(NumpyVQC):
    """The forward pass alone of a ``VQC``, for acting (no backward): as ``NumpyVQC`` plus an optional
    ``preprocess: linear`` pre-layer. Few rows (``circuits.kernels.max_rows``) run through the compiled
    kernels, with the wires' matrices cached per weights. Otherwise, up to 4 qubits, from the cached
    circuit matrix (a head given one is marked acting only, ``circuits.vqc.mark_acting_only``, so a
    weight change rebuilds just that matrix); from 5 (``ADJOINT_MIN_QUBITS``) by the state-vector
    forward of ``circuits.adjoint`` with its Kronecker blocks cached per weights: an actor's weights
    change every few dozen acts, and rebuilding a 2^n x 2^n matrix each time cost more than all its
    acts together (7.6 ms per rebuild at 8 qubits, against ~0.1 ms per act of 3 rows)."""

    def __init__(self, vqc: Any) -> None:
        from circuits.vqc import ADJOINT_MIN_QUBITS, mark_acting_only

        super().__init__(vqc)
        mark_acting_only(vqc)
        self._dense: tuple[Any, np.ndarray] | None = None  # (the torch matrix, its float64 copy)
        self.statevector = vqc.cfg.n_qubits >= ADJOINT_MIN_QUBITS or not vqc.use_dense
        # (the weights, what was built from them: "blocks" (adjoint.BlockMatrices), "rotations" (kernels))
        self._per_weights: tuple[torch.Tensor, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_per_weights"] = None  # a cache: rebuilt from the weights on the next act (the same matrices)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a twin pickled before it could act by the state vector or the kernels (a sim snapshot): it keeps
        # its path, so the resumed run acts exactly as the snapshot's would have. Blocks pickled by an
        # earlier version (``_blocks``) lack what the current forward reads: rebuilt
        state.setdefault("statevector", False)
        state.setdefault("adjoint", False)
        state.setdefault("kernels", False)
        state.pop("_blocks", None)
        state["_per_weights"] = None
        self.__dict__.update(state)

    def _built(self, key: str, make: Any) -> Any:
        """make(weights as float64 numpy) for the head's current weights, cached until they change."""
        self._per_weights, value = built_for_weights(self._per_weights, self._circuit_and_weights()[1].detach(), key,
                                                     make)
        return value

    @staticmethod
    def supports(module: nn.Module) -> bool:
        from circuits.vqc import VQC

        if not isinstance(module, VQC):
            return False
        cfg = module.cfg
        # (a head with shots, noise or a hardware gradient rule runs through its Hardware, which this
        # exact twin would skip: the torch path)
        return ((module.use_dense or NumpyVQC.on_adjoint_path(module)) and cfg.backend == "torch"
                and module.weights.device.type == "cpu"
                and module.hardware is None and module.input_scale is None and cfg.scaling in ("none", "atan", "bound")
                and cfg.output in NumpyVQC.OUTPUTS)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, Cache]:
        self._count_forward(x.shape[0])
        pre = self.vqc.pre
        if pre is not None:
            x = x @ pre.weight.detach().numpy().T.astype(np.float64) + pre.bias.detach().numpy()
        circuit = self._circuit_and_weights()[0]
        if self._kernel_rows(x.shape[0]):
            rot = self._built("rotations", lambda weights: kernels.rotations(circuit, weights, False)[0])
            return self._head(kernels.forward(circuit, self._angles(x), rot, False)[0])[0], None
        if self.statevector:
            from circuits import adjoint

            blocks = self._built("blocks", lambda weights: adjoint.BlockMatrices(circuit, weights, False))
            angles = self._angles(x).astype(self.vqc.weights.detach().numpy().dtype)
            readouts = adjoint.readouts_np(circuit, angles, blocks).astype(np.float64)
            return self._head(readouts)[0], None
        with torch.no_grad():
            dense = self.vqc.dense_matrix()  # cached until the weights change
        if self._dense is None or self._dense[0] is not dense:
            self._dense = (dense, dense.numpy().astype(np.float64))
        return self._outputs(self._product_state(x), self._dense[1])[0], None

    def backward(self, cache: Cache, grad: np.ndarray) -> None:
        raise TypeError("NumpyVQCActing is for acting only: it has no backward pass")


def numpy_acting_head(module: nn.Module) -> Optional[Any]:
    """The numpy twin an actor that is never differentiated acts through, or None (act through torch):
    a circuit's forward alone (``NumpyVQCActing``: few rows through the compiled kernels, more through
    the cached dense matrix up to 4 qubits or the state vector with its blocks cached per weights, where
    the learner's twin would build their derivatives on every act), else ``numpy_head``'s."""
    if NumpyVQCActing.supports(module):
        return NumpyVQCActing(module)
    return numpy_head(module)


def numpy_head(module: nn.Module) -> Optional[Any]:
    """The numpy twin of a head, or None when it has no numpy pass (the torch path is used)."""
    if NumpyMLP.supports(module):
        return NumpyMLP(module)
    if NumpyVQC.supports(module):
        return NumpyVQC(module)
    return None


def a2c_gradient(ac: Any, actor: Any, critic: Any, batch: dict[str, np.ndarray],
                 logits: np.ndarray, actor_cache: Cache, flat_grad: np.ndarray) -> dict[str, Optional[float]]:
    """``agents.actor_critic.actor_critic_update``'s single clip-free pass in numpy, written into
    ``flat_grad`` (the zeroed flat gradient the parameters' .grad view): GAE targets from the critic's
    forward, the loss's gradient from its numpy twin (``agents.losses.a2c_loss_grad``) over the valid
    steps, backward through both heads, a global-norm clip. ``logits``/``actor_cache``: the actor's
    forward on obs[:T] from the rollout. Returns the update's diagnostics, as the torch pass does."""
    T, N = batch["actions"].shape
    obs_all = batch["obs"].reshape((T + 1) * N, -1).astype(np.float64)
    values_col, critic_cache = critic.forward(obs_all)
    adv, returns = rollout_targets(batch, values_col[:, 0].reshape(T + 1, N), ac.gamma, ac.gae_lambda,
                                   ac.reward_scale)
    valid = batch["valid"].reshape(-1)
    grad_logits = np.zeros_like(logits)
    grad_values = np.zeros((len(obs_all), 1))
    diag = diagnostics(None, None)
    if valid.any():
        terms: dict[str, float] = {}
        values, targets = values_col[: T * N, 0][valid], returns.reshape(-1)[valid]
        grad_logits[valid], grad_values[: T * N, 0][valid] = a2c_loss_grad(
            ac, logits[valid], batch["actions"].reshape(-1)[valid], adv.reshape(-1)[valid], values, targets, terms)
        # the one pass is at the rollout's parameters: ratio 1, approx KL 0; no clip
        diag = diagnostics(terms["policy"], terms["value"], terms["entropy"], 0.0, None,
                           explained_variance(values, targets))
    critic.backward(critic_cache, grad_values)
    actor.backward(actor_cache, grad_logits)
    if ac.max_grad_norm is not None:
        norm = float(np.sqrt(np.dot(flat_grad.astype(np.float64), flat_grad.astype(np.float64))))
        coef = ac.max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            flat_grad *= np.float32(coef)
    return diag
