"""The server core: admission, versions, staleness, dispatch to the service, and the ledger.

Admission is the same for every kind of traffic: a message from an unknown sender, of an unknown
kind, with the wrong payload names, shapes or dtypes, or with non-finite values is rejected and
recorded with its reason, and the run goes on with the server state unchanged.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from marl_q.config import ServerConfig
from marl_q.ledger import Ledger
from marl_q.messages import HELLO, LIFE, SERVER, SERVICE, TRAIN, Message
from marl_q.protocol import Context, MessageSpec, Service
from marl_q.registry import STALENESS
from marl_q.seeding import derive
from marl_q.services import ServiceGroup


class Server:
    """Hosts one service; every message in or out passes through `receive` and is in the ledger."""

    def __init__(self, service: Service, workers: list[str], cfg: ServerConfig, ledger: Ledger,
                 seed: int = 0, progress: Optional[Callable[[], float]] = None,
                 on_train: Optional[Callable[[str, list, int, Optional[int], float], None]] = None,
                 name: Optional[str] = None) -> None:
        """``progress``: the fraction of the run's budget used (a service's schedules read it; 0 without);
        ``on_train``: the run's train.csv, called with (worker, diagnostics of the updates, version,
        staleness, t) for every accepted message that carries diagnostics or whose handling ran a
        learner's update; ``name``: the service's name on a ``MultiServer`` (its replies carry it in
        ``info[SERVICE]``; None: the run's one service)."""
        self.service = service
        self.name = name
        self.workers = tuple(workers)
        self._known = frozenset(workers)
        self.cfg = cfg
        self.ledger = ledger
        self.version = 0
        self.rng = np.random.default_rng(seed)
        rule = cfg.staleness
        fn = STALENESS.get(rule.rule, key="server.staleness.rule").obj
        self._weight = lambda s: fn(s, a=rule.a, b=rule.b)
        self.staleness_counts: dict[int, int] = {}
        self.progress = progress
        self.on_train = on_train
        # highest sequence number seen per (worker, kind) since that worker's last hello: a retried or
        # duplicated message (seq > 0, not above it) is applied at most once
        self._last_seq: dict[tuple[str, str], int] = {}
        # the incarnation (Message.info["life"]) of each worker's last hello: the same one again is a
        # duplicate, which must not reset the filter above nor send a second set of parameters (a
        # worker blocked on its push would take that stale reply as its answer and push again)
        self._life: dict[str, str] = {}

    def receive(self, msg: Message, t: float) -> list[Message]:
        """Admit, dispatch and record one message; return the replies (also recorded)."""
        if msg.kind == HELLO and msg.src in self._known:
            life = msg.info.get(LIFE)
            if life is not None and self._life.get(msg.src) == str(life):
                self.ledger.record(msg, t, self.version, accepted=False,
                                   reason=f"duplicate: hello of incarnation {life} from {msg.src} already seen")
                return []
            if life is not None:
                self._life[msg.src] = str(life)
            self.ledger.record(msg, t, self.version, accepted=True)
            for key in [k for k in self._last_seq if k[0] == msg.src]:
                del self._last_seq[key]  # a (re)started worker numbers its messages afresh
            return self._send(self.service.hello(msg.src, self.version), t)
        spec = self.service.specs.get(msg.kind)
        reason = self._admission(msg, spec)
        if reason is None and msg.seq > 0:
            key = (msg.src, msg.kind)
            if msg.seq <= self._last_seq.get(key, 0):
                # the original was handled and answered; a duplicate gets no second answer
                self.ledger.record(msg, t, self.version, accepted=False,
                                   reason=f"duplicate: seq {msg.seq} of {msg.kind} from {msg.src} already seen")
                return []
            self._last_seq[key] = msg.seq
        staleness: Optional[int] = None
        if reason is None and spec.versioned:
            staleness = self.version - msg.base_version
            if staleness < 0:
                reason = f"base_version {msg.base_version} is ahead of the server's {self.version}"
            elif self.cfg.max_staleness is not None and staleness > self.cfg.max_staleness:
                self.ledger.record(msg, t, self.version, staleness, accepted=False, stale_drop=True,
                                   reason=f"stale: {staleness} > max_staleness {self.cfg.max_staleness}")
                return self._send(self.service.on_reject(msg, self.version), t)
        if reason is not None:
            self.ledger.record(msg, t, self.version, staleness, accepted=False, reason=reason)
            if msg.src in self._known:
                return self._send(self.service.on_reject(msg, self.version), t)
            return []
        s = staleness or 0
        ctx = Context(self.version, s, self._weight(s), self.workers, self.rng,
                      self.progress() if self.progress is not None else 0.0)
        outcome = self.service.handle(msg, ctx)
        if staleness is not None and outcome.accepted:
            self.staleness_counts[s] = self.staleness_counts.get(s, 0) + 1
        self.ledger.record(msg, t, self.version, staleness, accepted=outcome.accepted, reason=outcome.reason)
        if outcome.applied:
            self.version += 1
        if outcome.accepted and self.on_train is not None and (TRAIN in msg.info or outcome.train):
            self.on_train(msg.src, list(msg.info.get(TRAIN, ())) + outcome.train, self.version, staleness, t,
                          **({"service": self.name} if self.name is not None else {}))
        return self._send(outcome.replies, t)

    def serve(self, service: Service) -> None:
        """Host ``service`` from now on (a resume takes the very service object of its snapshot)."""
        self.service = service

    def _send(self, replies: list[Message], t: float) -> list[Message]:
        for reply in replies:
            if self.name is not None:
                reply.info[SERVICE] = self.name
            self.ledger.record(reply, t, self.version)
        return replies

    def _admission(self, msg: Message, spec: Optional[MessageSpec]) -> Optional[str]:
        """None if the message may be handed to the service, else why not."""
        if msg.src not in self._known:
            return f"unknown sender {msg.src!r}"
        if msg.dst != SERVER:
            return f"addressed to {msg.dst!r}, not the server"
        if spec is None:
            return f"unknown kind {msg.kind!r} (expected one of {sorted(self.service.specs)})"
        if not isinstance(msg.payload, dict):
            return "payload is not a mapping of arrays"
        names, expected = set(msg.payload), set(spec.payload)
        if names != expected:
            parts = []
            if expected - names:
                parts.append(f"missing {sorted(expected - names)}")
            if names - expected:
                parts.append(f"unexpected {sorted(names - expected)}")
            return f"payload names: {', '.join(parts)}"
        for name, (shape, dtype) in spec.payload.items():
            arr = msg.payload[name]
            if not isinstance(arr, np.ndarray):
                return f"{name}: not an array ({type(arr).__name__})"
            if arr.dtype != np.dtype(dtype):
                return f"{name}: dtype {arr.dtype}, expected {dtype}"
            if len(arr.shape) != len(shape) or any(e is not None and e != a for e, a in zip(shape, arr.shape)):
                want = tuple("*" if e is None else e for e in shape)
                return f"{name}: shape {arr.shape}, expected {want}"
            if spec.finite and arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                return f"{name}: non-finite values (NaN or Inf)"
        return None

    def state(self) -> dict:
        """The core's own state (not the service's), JSON-able, for a checkpoint."""
        return {"version": self.version, "rng": self.rng.bit_generator.state,
                "staleness_counts": [[k, v] for k, v in sorted(self.staleness_counts.items())],
                "last_seq": [[w, k, s] for (w, k), s in sorted(self._last_seq.items())],
                "life": [[w, life] for w, life in sorted(self._life.items())]}

    def load_state(self, state: dict) -> None:
        self.version = int(state["version"])
        self.rng.bit_generator.state = state["rng"]
        self.staleness_counts = {int(k): int(v) for k, v in state["staleness_counts"]}
        self._last_seq = {(w, k): int(s) for w, k, s in state["last_seq"]}
        self._life = {w: str(life) for w, life in state.get("life", [])}  # absent in older checkpoints

    def summary(self) -> dict:
        return {"server_version": self.version, "updates": self.service.updates()}


def staleness_hist(counts: dict[int, int]) -> dict[str, int]:
    """summary.json's ``staleness_hist``: accepted updates by staleness, keys as text in increasing order."""
    return {str(k): v for k, v in sorted(counts.items())}


class MultiServer:
    """The one server of a run with several services (``ServiceGroup``: one learner per team): one ``Server``
    core per service, each with its own version, staleness counts, generator and duplicate filter, all
    writing the one ledger (its rows name their service). A message goes to the core its
    ``info[SERVICE]`` names, and that core's replies carry the name back (``Server.name``); a message naming no service of
    this server is refused with its reason (a ledger row) and answered by nobody."""

    def __init__(self, group: ServiceGroup, workers: list[str], cfg: ServerConfig, ledger: Ledger, seed: int = 0,
                 progress: Optional[Callable[[], float]] = None,
                 on_train: Optional[Callable[[str, list, int, Optional[int], float], None]] = None) -> None:
        self.service = group
        self.ledger = ledger
        self.cores = {name: Server(service, workers, cfg, ledger, seed=derive(seed, "learner", k),
                                   progress=progress, on_train=on_train, name=name)
                      for k, (name, service) in enumerate(group.services.items())}

    @property
    def version(self) -> int:
        """The services' versions summed (what a progress bar shows)."""
        return sum(core.version for core in self.cores.values())

    @property
    def staleness_counts(self) -> dict[int, int]:
        """Every service's accepted updates by staleness, added up."""
        out: dict[int, int] = {}
        for core in self.cores.values():
            for s, n in core.staleness_counts.items():
                out[s] = out.get(s, 0) + n
        return dict(sorted(out.items()))

    def receive(self, msg: Message, t: float) -> list[Message]:
        name = msg.info.get(SERVICE)
        core = self.cores.get(name) if isinstance(name, str) else None
        if core is None:
            self.ledger.record(msg, t, 0, accepted=False,
                               reason=f"unknown service {name!r} (this server's: {', '.join(self.cores)})")
            return []
        return core.receive(msg, t)

    def serve(self, group: ServiceGroup) -> None:
        self.service = group
        for name, core in self.cores.items():
            core.serve(group.services[name])

    def state(self) -> dict:
        return {"services": {name: core.state() for name, core in self.cores.items()}}

    def load_state(self, state: dict) -> None:
        for name, core in self.cores.items():
            core.load_state(state["services"][name])

    def summary(self) -> dict:
        """The summed version and updates (as one server's), and each service's own."""
        return {"server_version": self.version, "updates": self.service.updates(),
                "services": {name: {"server_version": core.version, "updates": core.service.updates(),
                                    "staleness_hist": staleness_hist(core.staleness_counts)}
                             for name, core in self.cores.items()}}


def make_server(service: Service, workers: list[str], cfg: ServerConfig, ledger: Ledger, seed: int = 0,
                progress: Optional[Callable[[], float]] = None,
                on_train: Optional[Callable[[str, list, int, Optional[int], float], None]] = None) -> "Server | MultiServer":
    """The server of a run: a ``MultiServer`` for a ``ServiceGroup``, else one ``Server``."""
    kind = MultiServer if isinstance(service, ServiceGroup) else Server
    return kind(service, workers, cfg, ledger, seed=seed, progress=progress, on_train=on_train)
