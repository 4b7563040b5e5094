"""Classical heads: features (B, in_dim) -> outputs (B, out_dim), chosen by `actor.head` / `critic.head`;
and what every worker does with the circuit heads it holds (``worker_heads``, ``head_report``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

import numpy as np
import torch
from torch import nn

from agents.recurrent import RecurrentHead
from circuits.resources import HeadResources
from circuits.shots import seed_heads
from marl_q.errors import ConfigError
from marl_q.registry import HEADS
from marl_q.seeding import derive


class _NumpyTanh(torch.autograd.Function):
    """tanh through numpy's SIMD kernel; the backward is autograd's own for tanh (``tanh_backward`` of the
    output), so only the forward's last bits differ from ``torch.tanh``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def _numpy_tanh_applies(x: torch.Tensor) -> bool:
    """A plain dense CPU float tensor outside torch.func's transforms (vmap, grad: batched seeds)."""
    return (type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and x.layout == torch.strided and not torch._C._are_functorch_transforms_active())


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh``, 9x faster on the CPU: this torch's float tanh kernel is scalar (2.1 ns an element on
    an AVX-512 Zen 5, on every ATen capability), numpy's is vectorised (0.23 ns). A (1200, 64) float32 block,
    a MAPPO epoch's hidden layer on spread, takes 17.7 against 161 us, and tanh was a quarter of the
    epoch (docs/performance.md). The values agree with torch's to one float32 ulp; gradients are autograd's
    tanh backward. Other tensors (CUDA, under ``torch.func`` transforms) take ``torch.tanh``."""
    if not _numpy_tanh_applies(x):
        return torch.tanh(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _NumpyTanh.apply(x)
    return torch.from_numpy(np.tanh(x.numpy()))


class Tanh(nn.Tanh):
    """The ``mlp`` heads' tanh layer: ``tanh`` above. A subclass of ``nn.Tanh`` so that what recognises
    the layer (the numpy twins, batched seeds) still does; snapshots of runs made before it keep
    ``nn.Tanh`` and resume on torch's kernel, bit for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh(x)


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU}


@dataclass
class MLPConfig:
    """A multilayer perceptron with orthogonal initialisation (the PPO/A2C default)."""

    hidden: list[int] = field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    ortho_init: bool = True
    # gain of the last layer; null: ROLE_OUT_GAIN's, 0.01 for an actor (its first policy near uniform,
    # as Stable-Baselines3 and CleanRL initialise theirs) and 1.0 for a critic (docs/actor_critic.md)
    out_gain: Optional[float] = None
    # gru: a GRU cell after the hidden layers carries memory across steps (agents/recurrent.py; the team
    # actor-critics train it by chunked BPTT, docs/recurrent.md); null: feed-forward
    recurrent: Optional[Literal["gru"]] = None

    def validate(self) -> None:
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: layer sizes must be positive, got {self.hidden}")
        if self.recurrent is not None and not self.hidden:
            raise ValueError("recurrent: a GRU head needs at least one hidden layer (its width is the GRU's)")

    def for_role(self, role: str) -> None:
        """Fill a null ``out_gain`` with the default of the section it was written in (``actor``, ``critic``)."""
        if self.out_gain is None:
            self.out_gain = ROLE_OUT_GAIN.get(role, 1.0)


ROLE_OUT_GAIN = {"actor": 0.01, "critic": 1.0}


@HEADS.register("mlp", config=MLPConfig, help="multilayer perceptron (hidden sizes, tanh|relu)")
def build_mlp(cfg: MLPConfig, in_dim: int, out_dim: int) -> nn.Module:
    if cfg.recurrent == "gru":
        return build_gru(cfg, in_dim, out_dim)
    sizes = [in_dim, *cfg.hidden]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), ACTIVATIONS[cfg.activation]()]
    layers.append(nn.Linear(sizes[-1], out_dim))
    net = nn.Sequential(*layers)
    if cfg.ortho_init:
        linears = [m for m in net if isinstance(m, nn.Linear)]
        for i, lin in enumerate(linears):
            last = 1.0 if cfg.out_gain is None else cfg.out_gain  # a config built outside a section
            gain = last if i == len(linears) - 1 else float(np.sqrt(2))
            nn.init.orthogonal_(lin.weight, gain=gain)
            nn.init.zeros_(lin.bias)
    return net


def build_gru(cfg: MLPConfig, in_dim: int, out_dim: int) -> RecurrentHead:
    """The GRU head of an mlp section with ``recurrent: gru``: its ``hidden`` layers encode, a GRU cell
    of the last layer's width carries the memory, a linear layer maps it out. Orthogonal init (gain
    sqrt 2 in the encoder and the GRU's matrices, the section's ``out_gain`` last; zero biases) as the
    feed-forward head's when ``ortho_init``."""
    sizes = [in_dim, *cfg.hidden]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), ACTIVATIONS[cfg.activation]()]
    head = RecurrentHead(nn.Sequential(*layers), sizes[-1], nn.Linear(sizes[-1], out_dim))
    if cfg.ortho_init:
        for lin in head.encoder:
            if isinstance(lin, nn.Linear):
                nn.init.orthogonal_(lin.weight, gain=float(np.sqrt(2)))
                nn.init.zeros_(lin.bias)
        for name in ("weight_ih", "weight_hh"):
            nn.init.orthogonal_(getattr(head.gru, name))
        nn.init.zeros_(head.gru.bias_ih)
        nn.init.zeros_(head.gru.bias_hh)
        nn.init.orthogonal_(head.out.weight, gain=1.0 if cfg.out_gain is None else cfg.out_gain)
        nn.init.zeros_(head.out.bias)
    return head


def count_params(module: nn.Module) -> int:
    """Trainable parameters of a module."""
    return int(sum(p.numel() for p in module.parameters() if p.requires_grad))


class HeadSizeError(ConfigError, ValueError):
    """A head that cannot take the sizes it was asked for (a user error; still a ValueError for callers
    that add the section's name)."""


def build_head(section, in_dim: int, out_dim: int) -> nn.Module:
    """Build the head a config section (`actor` or `critic`) names; a head that cannot take these
    sizes is a user error naming the section."""
    try:
        return HEADS.get(section.name).obj(section.params, in_dim, out_dim)
    except ValueError as exc:
        raise HeadSizeError(f"head {section.name!r} cannot map {in_dim} inputs to {out_dim} outputs: {exc}") from None


def worker_heads(roles: dict[str, nn.Module], run_seed: int, worker: int) -> Optional[HeadResources]:
    """A worker's circuit heads by role (``actor``, ``critic``): the k-th head among them that samples
    (shots, SPSA) draws from the worker's own stream ``derive(run_seed, "shots", worker, k)``
    (``circuits.shots.seed_heads``; an exact head draws nothing), and the returned counters are what the
    worker reports with each step (``head_report``); None without a circuit head."""
    seed_heads(roles.values(), lambda k: derive(run_seed, "shots", worker, k))
    return HeadResources.of(roles)


def resumed_heads(roles: dict[str, nn.Module]) -> Optional[HeadResources]:
    """``worker_heads``' counters for a worker unpickled from a snapshot taken before it reported them:
    counted from the resume on, as the run's ledger holds nothing of what the heads ran before (their
    shot streams continue as they were)."""
    resources = HeadResources.of(roles)
    head_report(resources)
    return resources


def head_report(resources: Optional[HeadResources]) -> Optional[dict[str, Any]]:
    """A worker step's ``Work.resources``: its circuit heads' counts since its previous step (None
    without a circuit head)."""
    return resources.take() if resources is not None else None


class FlatParameters:
    """Re-seats a module's parameters as views of one flat buffer, gradients too.

    Loading parameters pulled from the server is then one copy, a pushed gradient is one array,
    and an optimizer over ``self.flat`` updates every layer. ``writes`` counts the writes through
    ``load``, so that what is derived from the parameters (a worker's acting weights) can tell that
    it is stale; an optimizer stepping ``self.flat`` in place is not counted (no acting cache reads a
    buffer an optimizer steps).
    """

    def __init__(self, *modules: nn.Module) -> None:
        params = [p for m in modules for p in m.parameters() if p.requires_grad]
        flat = nn.Parameter(torch.zeros(sum(p.numel() for p in params)))
        with torch.no_grad():
            offset = 0
            for m in modules:
                for name, p in list(_named_leaf_params(m)):
                    n = p.numel()
                    flat[offset:offset + n].copy_(p.reshape(-1))
                    offset += n
        self._adopt(flat, modules)

    @classmethod
    def from_state(cls, flat: nn.Parameter, modules: Sequence[nn.Module]) -> "FlatParameters":
        """The buffer ``flat`` (a snapshot's) over ``modules``, their parameters seated as its views again:
        what a pickle of a flat buffer holds and rebuilds (``__reduce__``)."""
        out = cls.__new__(cls)
        out._adopt(flat, tuple(modules))
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        # a pickle (a sim snapshot) keeps tensors but not the views between them, nor .grad: it holds the
        # buffer and the modules, and from_state seats the views again (no attribute name in the file)
        return type(self).from_state, (self.flat, self.modules)

    def _adopt(self, flat: nn.Parameter, modules: tuple[nn.Module, ...]) -> None:
        self.flat, self.modules, self.size = flat, modules, flat.numel()
        self.writes = 0
        self._seat()

    def _seat(self) -> None:
        """Make every parameter of the modules (and its gradient) a view of the flat buffer."""
        self.flat.grad = torch.zeros(self.size)
        offset = 0
        for m in self.modules:
            for owner, name, p in list(_owned_params(m)):
                n = p.numel()
                view = nn.Parameter(self.flat.data[offset:offset + n].view_as(p))
                view.grad = self.flat.grad[offset:offset + n].view_as(p)
                owner.register_parameter(name, view)  # replaces the module's own, in its place
                offset += n

    def load(self, values: np.ndarray) -> None:
        with torch.no_grad():
            self.flat.data.copy_(torch.from_numpy(values))
        self.writes += 1

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def numpy(self) -> np.ndarray:
        return self.flat.data.numpy().copy()

    def grad_view(self) -> np.ndarray:
        """The flat gradient as a numpy view (writes land in every parameter's .grad)."""
        return self.flat.grad.numpy()

    def grad_numpy(self) -> np.ndarray:
        return self.flat.grad.numpy().copy()


def _named_leaf_params(m: nn.Module):
    for owner, name, p in _owned_params(m):
        yield name, p


def _owned_params(m: nn.Module):
    for mod in m.modules():
        for name, p in list(mod.named_parameters(recurse=False, remove_duplicate=False)):
            if p.requires_grad:
                yield mod, name, p
