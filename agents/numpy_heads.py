"""Numpy forward and backward passes for small heads, and the one-step A2C update built on them.

Koelle's quantum A2C updates after every env step, on one observation, with heads of about 30
parameters. At that size torch spends most of a step in per-call dispatch and in the autograd engine,
not in arithmetic. So for the heads that have a numpy twin (``mlp`` here; ``vqc``/``hybrid`` through
``circuits.twins``, whichever executor the circuit planner picks), the worker runs forward and
backward in float64, reading the parameters from (and writing the gradients into) the same flat
buffer the torch modules view. Everything else keeps the torch path. ``algorithm.fast_path: false``
turns this off; the two paths agree to float rounding (tests/agents/test_numpy_heads.py checks them
against torch autograd).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agents.losses import diagnostics, explained_variance, loss_grad
from agents.returns import rollout_targets
from circuits.twins import NumpyVQC, NumpyVQCActing, acting_twin, training_twin  # noqa: F401 (the twins' classes: sim snapshots pickled them by this module's name)

# what a head's forward hands back to its backward (``NumpyMLP``: the layers' inputs and the output;
# ``circuits.twins.ForwardCache`` for a circuit)
Cache = Any


class NumpyMLP:
    """``nn.Sequential`` of Linear / Tanh / ReLU layers (the ``mlp`` head), or one ``nn.Linear``."""

    # float64: the one-step A2C update's and acting's; float32: the parameters' own (PPO's epochs). A class
    # default, so that twins pickled in sim snapshots before it existed read float64
    dtype = np.dtype(np.float64)

    def __init__(self, net: nn.Sequential | nn.Linear, dtype: Any = np.float64) -> None:
        self.dtype = np.dtype(dtype)
        self.layers: list[tuple[str, Any]] = []
        for module in (net,) if isinstance(net, nn.Linear) else net:
            if isinstance(module, nn.Linear):
                self.layers.append(("linear", module))
            elif isinstance(module, nn.Tanh):
                self.layers.append(("tanh", module))
            elif isinstance(module, nn.ReLU):
                self.layers.append(("relu", None))
            else:  # pragma: no cover - numpy_head checks first
                raise TypeError(f"no numpy pass for {type(module).__name__}")

    @staticmethod
    def supports(net: nn.Module) -> bool:
        return isinstance(net, nn.Sequential) and all(isinstance(m, (nn.Linear, nn.Tanh, nn.ReLU)) for m in net)

    def linear_weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each linear layer's weight as ``forward`` converts it on every call (transposed, at the twin's dtype)
        and its bias: what an actor whose parameters stay put between acts keeps and hands to ``forward``."""
        return [(module.weight.detach().numpy().T.astype(self.dtype), module.bias.detach().numpy().copy())
                for kind, module in self.layers if kind == "linear"]

    def views(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """A float32 twin's linear layers as (W^T, b) numpy views of the parameters themselves: always their
        current values (loads and optimizer steps write the flat buffer in place). Kept while the layers
        hold the same parameter objects (a sim snapshot's resume seats new ones: made again then, and
        never pickled: ``__getstate__``); 9 us of a 48-row act's 22 was making them on every call."""
        params = [module.weight for kind, module in self.layers if kind == "linear"]
        kept = self.__dict__.get("_views")
        if kept is None or any(p is not q for p, q in zip(params, kept[0])):
            kept = (params, [(module.weight.detach().numpy().T, module.bias.detach().numpy())
                             for kind, module in self.layers if kind == "linear"])
            self._views = kept
        return kept[1]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_views", None)  # views of the parameters' memory: a pickle would hold copies
        return state

    def forward(self, x: np.ndarray, weights: Optional[list[tuple[np.ndarray, np.ndarray]]] = None
                ) -> tuple[np.ndarray, Cache]:
        """The output and the cache for ``backward``; ``weights``: ``linear_weights()`` of the parameters
        now (the same arrays, so the same bits), else a float32 twin's ``views()``, else converted here."""
        saved = []
        h = x
        if weights is None and self.dtype == np.float32:
            weights = self.views()
        kept = iter(weights) if weights is not None else None
        for kind, module in self.layers:
            saved.append(h)
            h = self._layer(kind, module, h, next(kept) if kept is not None and kind == "linear" else None)
        return h, (saved, h)

    def _layer(self, kind: str, module: Any, h: np.ndarray, weights: Optional[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """One layer's output: ``forward``'s step (``TorchMLP`` replaces it with torch's ops). At float32 the
        weights are read in place (views of the flat parameters), at float64 converted."""
        if kind == "linear":
            w, b = weights if weights is not None else (module.weight.detach().numpy().T.astype(self.dtype, copy=False),
                                                        module.bias.detach().numpy())
            if self.dtype == np.float64:
                return h @ w + b
            out = h @ w  # (the same sum, without a second temporary)
            out += b
            return out
        return np.tanh(h) if kind == "tanh" else np.maximum(h, 0.0)

    def backward(self, cache: Cache, grad: np.ndarray) -> None:
        """Write d loss / d parameters into the parameters' .grad (views of the flat gradient); the input's
        gradient is not formed."""
        saved, out = cache
        outputs = saved[1:] + [out]
        last = len(self.layers) - 1
        views = self.views() if self.dtype == np.float32 else None
        linear = sum(kind == "linear" for kind, _ in self.layers)
        for i, ((kind, module), h_in, h_out) in enumerate(zip(reversed(self.layers), reversed(saved), reversed(outputs))):
            if kind == "linear":
                linear -= 1  # this layer's index among the linear ones
                module.weight.grad.numpy()[...] = grad.T @ h_in
                # float32 (PPO's epochs over many rows): the column sums as a product with ones, 4x as fast
                # as numpy's reduction over axis 0; float64 keeps the one-step path's bits
                module.bias.grad.numpy()[...] = (grad.sum(axis=0) if self.dtype == np.float64
                                                 else np.ones(len(grad), self.dtype) @ grad)
                if i == last:
                    break
                w = (views[linear][0].T if views is not None
                     else module.weight.detach().numpy().astype(self.dtype, copy=False))
                # one output (a critic's value): the outer product by broadcasting, the same products as
                # the (B, 1) @ (1, n) GEMM, which BLAS takes 5x as long over
                grad = grad * w if grad.shape[1] == 1 else grad @ w
            elif kind == "tanh":  # grad * (1 - h_out^2), the same products, in one temporary
                derivative = h_out * h_out
                np.subtract(1.0, derivative, out=derivative)
                derivative *= grad
                grad = derivative
            else:
                grad = grad * (h_out > 0.0)


class TorchMLP(NumpyMLP):
    """The same layers' forward and backward in torch at the parameters' dtype, without autograd: the ops
    autograd records and replays for them (``F.linear``; the backward's ``g.t() @ h``, ``g.sum(0)``,
    ``g @ W``, ``threshold_backward`` / ``tanh_backward``), so the gradients are autograd's to the bit
    (tests/agents/test_q_fast.py) at a fraction of the engine's per-op cost. ``backward`` writes into the
    parameters' .grad, which must exist (views of a flat gradient, ``heads.FlatParameters``)."""

    @torch.no_grad()
    def forward(self, x: torch.Tensor, weights: None = None) -> tuple[torch.Tensor, Cache]:
        return super().forward(x)

    @staticmethod
    def _layer(kind: str, module: Any, h: torch.Tensor, weights: None) -> torch.Tensor:
        if kind == "linear":
            return F.linear(h, module.weight, module.bias)
        if kind == "tanh":  # the layer's own kernel (heads.Tanh's numpy one); twins pickled before kept no module
            return torch.tanh(h) if module is None else module(h)
        return torch.relu(h)

    @torch.no_grad()
    def backward(self, cache: Cache, grad: torch.Tensor) -> None:
        """d loss / d parameters into the parameters' .grad (the input's gradient is not formed)."""
        saved, out = cache
        outputs = saved[1:] + [out]
        last = len(self.layers) - 1
        for i, ((kind, module), h_in, h_out) in enumerate(zip(reversed(self.layers), reversed(saved), reversed(outputs))):
            if kind == "linear":
                # formed in fresh memory, then copied, as autograd's AccumulateGrad does: a GEMM written
                # straight into a view of the flat gradient (``out=``) starts at whatever alignment the view
                # has, and on some CPUs (AMD Zen, MKL) an unaligned output changes the last bits
                module.weight.grad.copy_(grad.t().mm(h_in))
                module.bias.grad.copy_(grad.sum(0))
                if i == last:
                    break
                grad = grad.mm(module.weight)
            elif kind == "tanh":
                grad = torch.ops.aten.tanh_backward(grad, h_out)
            else:
                grad = torch.ops.aten.threshold_backward(grad, h_out, 0)


def numpy_acting_head(module: nn.Module) -> Optional[Any]:
    """The numpy twin an actor that is never differentiated acts through, or None (act through torch):
    a circuit's acting twin (``circuits.twins.acting_twin``: its forward alone, with what it builds
    cached per weights), else ``numpy_head``'s."""
    twin = acting_twin(module)
    return twin if twin is not None else numpy_head(module)


def numpy_head(module: nn.Module) -> Optional[Any]:
    """The numpy twin of a head, or None when it has no numpy pass (the torch path is used)."""
    if NumpyMLP.supports(module):
        return NumpyMLP(module)
    return training_twin(module)


def a2c_gradient(ac: Any, actor: Any, critic: Any, batch: dict[str, np.ndarray],
                 logits: np.ndarray, actor_cache: Cache, flat_grad: np.ndarray) -> dict[str, Optional[float]]:
    """``agents.actor_critic.actor_critic_update``'s single clip-free pass in numpy, written into
    ``flat_grad`` (the zeroed flat gradient the parameters' .grad view): GAE targets from the critic's
    forward, the loss's gradient from its numpy twin (``agents.losses.loss_grad``) over the valid
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
        grad_logits[valid], grad_values[: T * N, 0][valid] = loss_grad(
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
