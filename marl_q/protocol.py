"""The seam between the runtime and algorithms: Algorithm, Worker, Service and what they exchange.

See PLUGINS.md for the contract in prose. The same Worker and Service objects run on every
backend; backends only move messages and keep time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from marl_q.messages import Message

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig


def worker_name(index: int) -> str:
    """The name of worker ``index`` (from 0): how the runtime, the server, the ledger and services address it."""
    return f"w{index}"


def worker_names(count: int) -> tuple[str, ...]:
    """The names of a run's ``count`` workers, in index order."""
    return tuple(worker_name(i) for i in range(count))


@dataclass(frozen=True)
class MessageSpec:
    """What a message kind must carry: payload name -> (shape with None for any size, dtype)."""

    payload: dict[str, tuple[tuple[Optional[int], ...], str]]
    versioned: bool = True  # staleness is computed and max_staleness enforced
    finite: bool = True  # float arrays must hold finite values


@dataclass
class Work:
    """The result of one Worker.step(): messages to send, env steps, finished episodes, sim cost."""

    messages: list[Message] = field(default_factory=list)
    env_steps: int = 0
    episodes: list[dict[str, Any]] = field(default_factory=list)
    cost: Optional[float] = None  # units of backend.compute.step_s; defaults to env_steps
    # circuit heads' counts since the worker's previous step (circuits.resources.HeadResources.take)
    resources: Optional[dict[str, Any]] = None

    @property
    def sim_cost(self) -> float:
        return float(self.env_steps if self.cost is None else self.cost)


@dataclass
class Context:
    """What the server core tells a service about the message it is handing over."""

    version: int
    staleness: int
    weight: float
    workers: tuple[str, ...]
    rng: np.random.Generator
    progress: float = 0.0  # fraction of the run's budget used so far (for schedules)

    @property
    def next_version(self) -> int:
        return self.version + 1


@dataclass
class Outcome:
    """A service's verdict: did the state change (bumps the version), and what to send back."""

    applied: bool
    replies: list[Message] = field(default_factory=list)
    accepted: bool = True
    reason: str = ""
    # diagnostics of the updates a learner on the server ran while handling the message (train.csv);
    # a worker's own go in the message's info (marl_q.messages.TRAIN)
    train: list[dict[str, Any]] = field(default_factory=list)


class Worker:
    """One decentralized agent (see PLUGINS.md)."""

    name: str

    def start(self) -> list[Message]:
        raise NotImplementedError

    def deliver(self, msg: Message) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def step(self) -> Work:
        raise NotImplementedError

    def close(self) -> None:
        """Release environments and other resources."""


class Service:
    """The algorithm-specific handler the server hosts (see PLUGINS.md)."""

    specs: dict[str, MessageSpec] = {}

    def hello(self, worker: str, version: int) -> list[Message]:
        raise NotImplementedError

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        raise NotImplementedError

    def on_reject(self, msg: Message, version: int) -> list[Message]:
        """Replies to a rejected or dropped message, so a worker waiting on it can go on."""
        return self.hello(msg.src, version)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}

    def updates(self) -> int:
        """Server updates applied so far (drives checkpoints and progress)."""
        return 0


class Algorithm:
    """A learning algorithm: builds the server's service and the workers from the config."""

    metric_fields: list[str] = ["return", "length"]
    # episode columns measured on the wall clock: written to metrics_wall.csv, never to metrics.csv
    # (which must be byte-identical for a seed on sim)
    wall_fields: tuple[str, ...] = ()

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """Cross-section checks at load time (raise ConfigError)."""

    def make_service(self) -> Service:
        raise NotImplementedError

    def make_worker(self, index: int) -> Worker:
        raise NotImplementedError

    def annotate(self, row: dict[str, Any], ledger: Any) -> None:
        """Add run-level columns (known only to the runtime, e.g. ledger totals) to an episode row."""

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def acting_policy(self, state: dict[str, np.ndarray]) -> "ActingPolicy":
        """The trained policy, rebuilt from a checkpoint's service state (``Service.state_dict()``):
        what ``marl_q.rundir.load_trained`` returns to act with. An algorithm without one says so."""
        from marl_q.errors import UserError

        raise UserError(f"algorithm {self.cfg.algorithm.name!r}: has no acting policy to load from a checkpoint")


Observations = dict[str, np.ndarray]


def gumbel_max(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sample from softmax(logits) per row with a seeded generator (one uniform per entry)."""
    return np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=1)


@dataclass
class ActingPolicy:
    """A trained policy as an algorithm's ``acting_policy`` hook rebuilds it.

    ``logits``: observations of the agents acting now -> each agent's action logits (log-probabilities
    up to a constant), computed in one batch. ``probabilities``: the exact action probabilities, when
    the algorithm defines them otherwise than softmax(logits) (an epsilon floor, say). ``agents``: the
    names it acts for (None: one policy shared by whichever agents the observations name).
    ``models``: the rebuilt networks by role ("actor", "critic", ...); ``info``: what else the
    checkpoint fixes (env_steps, epsilon, the environment's description)."""

    logits: Callable[[Observations], Observations]
    probabilities: Optional[Callable[[Observations], Observations]] = None
    agents: Optional[list[str]] = None
    models: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def probs(self, obs: Observations) -> Observations:
        """Each agent's action probabilities."""
        if self.probabilities is not None:
            return self.probabilities(obs)
        out = {}
        for name, row in self.logits(obs).items():
            z = np.exp(np.asarray(row, dtype=np.float64) - np.max(row))
            out[name] = z / z.sum()
        return out

    def act(self, obs: Observations, rng: Optional[np.random.Generator] = None) -> dict[str, int]:
        """One action per agent: the most likely one (``rng`` None), or a draw from its distribution by
        Gumbel-max with ``rng`` (one row of uniforms per agent, agents in sorted order)."""
        logits = self.logits(obs)
        names = sorted(logits)
        if not names:
            return {}
        stacked = np.stack([logits[n] for n in names])
        acts = np.argmax(stacked, axis=1) if rng is None else gumbel_max(stacked, rng)
        return dict(zip(names, acts.tolist()))
