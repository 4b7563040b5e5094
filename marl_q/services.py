"""Services the runtime offers every algorithm. `ParameterService` carries gradients and deltas.

The other three kinds of traffic (sufficient statistics, trajectories, state commits) are
services their algorithms define (agents/), on the same Service seam (marl_q/protocol.py).
"""
from __future__ import annotations

from typing import Callable, Literal, Optional

import numpy as np
import torch

from marl_q.aggregation import Aggregator
from marl_q.messages import SERVER, Message
from marl_q.optim import FlatOptimizer, LrSchedule, lr_factor
from marl_q.protocol import Context, MessageSpec, Outcome, Service

PARAMS = "params"  # the message kind (and payload key) of a parameter snapshot sent to a worker


class ParameterService(Service):
    """A versioned flat parameter vector updated by pushed gradients (`grad`) or deltas (`delta`).

    Gradients go through one shared optimizer on the server (A3C's shared RMSProp statistics);
    deltas are added, scaled by `server_lr` (FedAsync/FedBuff). The staleness weight scales each
    update as the aggregation rule says.
    """

    def __init__(self, params: np.ndarray, mode: Literal["grad", "delta"], aggregator: Aggregator,
                 make_optimizer: Optional[Callable[[torch.Tensor], FlatOptimizer]] = None,
                 server_lr: float = 1.0, lr_schedule: LrSchedule = "constant") -> None:
        self.param = torch.as_tensor(np.asarray(params, dtype=np.float32)).clone()
        self.mode = mode
        self.aggregator = aggregator
        self.server_lr = server_lr
        self.optimizer = make_optimizer(self.param) if mode == "grad" else None
        self.lr_schedule = lr_schedule
        self._base_lr = self.optimizer.lr if self.optimizer else server_lr
        if mode == "grad" and self.optimizer is None:
            raise ValueError("grad mode needs an optimizer")
        self.specs = {mode: MessageSpec({mode: ((self.param.numel(),), "float32")})}
        self._updates = 0
        self._snapshot: np.ndarray | None = None

    def _params_message(self, worker: str, version: int) -> Message:
        if self._snapshot is None:
            self._snapshot = self.param.numpy().copy()
        return Message(SERVER, worker, PARAMS, {PARAMS: self._snapshot}, base_version=version)

    def hello(self, worker: str, version: int) -> list[Message]:
        return [self._params_message(worker, version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        combined, release = self.aggregator.offer(msg.src, msg.payload[self.mode], ctx.weight)
        applied = combined is not None
        if applied:
            if self.lr_schedule != "constant":  # linear: anneal to zero over the run's budget
                self._scale_lr(lr_factor(self.lr_schedule, ctx.progress))
            self._apply(combined)
        version = ctx.next_version if applied else ctx.version
        return Outcome(applied, [self._params_message(w, version) for w in release])

    def _scale_lr(self, factor: float) -> None:
        if self.optimizer is not None:
            self.optimizer.lr = self._base_lr * factor
        else:
            self.server_lr = self._base_lr * factor

    def _apply(self, update: np.ndarray) -> None:
        update_t = torch.from_numpy(np.ascontiguousarray(update))
        if self.mode == "grad":
            self.optimizer.step(update_t)
        else:
            self.param.add_(update_t, alpha=self.server_lr)
        self._snapshot = None
        self._updates += 1

    def updates(self) -> int:
        return self._updates

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {"params": self.param.numpy().copy(), "updates": np.array(self._updates),
                 "lr_now": np.array(self.optimizer.lr if self.optimizer else self.server_lr)}
        if self.optimizer is not None:
            for key, value in self.optimizer.state_dict().items():
                state[f"optim.{key}"] = value.numpy().copy()
        for key, value in self.aggregator.state_dict().items():
            state[f"agg.{key}"] = value
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.param.copy_(torch.from_numpy(state["params"]))
        self._updates = int(state["updates"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict({k[6:]: torch.from_numpy(np.array(v)) for k, v in state.items()
                                            if k.startswith("optim.")})
        self.aggregator.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("agg.")})
        self._snapshot = None


class ServiceGroup(Service):
    """Several named services on one server (one learner per team): ``marl_q.server.MultiServer`` gives each
    its own core (version, staleness, duplicate filter) and routes messages by ``Message.info[SERVICE]``.
    As the run's one service it answers for all of them: ``updates`` summed, ``state_dict`` each one's
    arrays under ``<name>.`` (a checkpoint's ``service.<name>.<key>``), ``summary`` each one's under
    ``services``."""

    def __init__(self, services: dict[str, Service]) -> None:
        self.services = dict(services)
        self.specs = {}

    def updates(self) -> int:
        return sum(s.updates() for s in self.services.values())

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"{name}.{k}": v for name, s in self.services.items() for k, v in s.state_dict().items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for name, s in self.services.items():
            s.load_state_dict(split_state(state, name))

    def summary(self) -> dict:
        return {}  # the server's summary has each service's (MultiServer.summary)


def split_state(state: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """Service ``name``'s arrays of a ``ServiceGroup.state_dict()``, without the ``<name>.`` prefix."""
    prefix = f"{name}."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
