"""The one loop of every backend: a transport's events in, the server's answers out, one restart policy.

A backend is a *transport*: it owns the workers and the clock and turns what happens into events,
in the order they happen, from generators: ``Transport.start`` (the workers start) and then
``Transport.turn``, one turn of its clock each (a heap event, a queue item, a wait on Ray refs), for
as long as the run is not done and ``Transport.more`` says it can go on. The events:

- ``Arrived(msg, t)``: a worker's message reaches the server;
- ``Stepped(worker, work, t)``: a worker finished a step (its messages come as ``Arrived`` events
  when the transport has moved them: at once on local, after a virtual network delay on sim);
- ``Failed(worker, detail)``: a worker died, raised, or stayed silent too long;
- ``Started(at)``: every worker has said hello (the zero of ``backend.kill``'s clock);
- ``Tick(at)``: a turn of a real transport's loop ended (due kills run here);
- ``SafePoint(t)``: the transport's state is whole (sim, between two events): checkpoints are
  taken here, with the transport's ``capture()``, and the run stops here at ``run.stop_after_updates``.

The ``Driver`` takes each event in turn: it hands messages to the server (``Runtime.deliver``), and
each answer to ``Transport.send``; it records finished steps (``Runtime.record_work``); it runs the
kill schedule; and it decides what a failed worker means through the one ``RestartPolicy``
(restart it through ``Transport.restart``, or end the run with status "worker_failed"). A generator
resumes only after its event was handled, so a transport sees the server's answers and the run's
budget (``Driver.done``) exactly where it did when it called the runtime itself.

| transport | where | events from | clock | safe points | failures |
|---|---|---|---|---|---|
| ``_EventSim``, ``_ScheduleSim`` | backends/sim.py | a heap ordered by (virtual time, seq) / the schedule | virtual | every event | injected crashes (simulated, not a policy) |
| ``LocalTransport`` | backends/local.py | one multiprocessing queue per worker | wall | none | process death, errors, silence, kills |
| ``RayTransport`` | backends/ray_backend.py | the worker actors' ``run()`` refs | wall | none | actor death, errors, kills |

On Ray the messages are handled inside the server actor (``ServerHost``): it hands ``Stepped`` and
``Arrived`` events of each worker call to its own ``Driver``, whose transport is the actor's
mailboxes; the driver process runs a second ``Driver`` over the actors' lifecycle events.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, Protocol, Union

import numpy as np

from marl_q.messages import Message
from marl_q.protocol import Work
from marl_q.seeding import duplicate_seed

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig
    from marl_q.runtime import Runtime


# ----------------------------------------------------------------------------- events
@dataclass
class Arrived:
    """A worker's message reaches the server at run time ``t``."""

    msg: Message
    t: float


@dataclass
class Stepped:
    """``worker`` finished a step at run time ``t``."""

    worker: str
    work: Work
    t: float


@dataclass
class Failed:
    """``worker`` died, raised or is silent; ``steps``: a count that grows while any worker makes progress
    (None: the driver's own count of ``Stepped`` events)."""

    worker: str
    detail: str
    steps: Optional[int] = None


@dataclass
class Started:
    """Every worker has said hello, at ``time.perf_counter()`` value ``at``."""

    at: float


@dataclass
class Tick:
    """A turn of a real transport's loop ended at ``time.perf_counter()`` value ``at``."""

    at: float


@dataclass
class SafePoint:
    """The transport's state is whole at run time ``t``."""

    t: float


Event = Union[Arrived, Stepped, Failed, Started, Tick, SafePoint]


class Transport(Protocol):
    """What a backend gives the driver (methods a transport never needs may be left out: a transport
    without SafePoint events needs no ``capture``, one without failures no ``restart`` or ``kill``).

    ``safe_points``: True if the transport yields SafePoint events; checkpoints are then taken there
    only, else after any message the server takes in (when ``run.checkpoint_every`` updates are due)."""

    safe_points: bool

    def start(self, driver: "Driver") -> Iterator[Event]:
        """Start the workers (or continue a resumed run): the events that causes."""

    def more(self, driver: "Driver") -> bool:
        """Whether another turn can happen (asked while the run is not done)."""

    def turn(self, driver: "Driver") -> Iterator[Event]:
        """One turn of the transport's clock: the events it brings, in order."""

    def send(self, reply: Message, t: float) -> None:
        """Move one answer of the server towards its worker."""

    def capture(self) -> dict[str, Any]:
        """The transport's whole state at a safe point (the checkpoint's snapshot)."""

    def record_fault(self, kind: str, worker: str, detail: str) -> None:
        """A fault in the run's summary (and on the console)."""

    def restart(self, worker: str) -> None:
        """Replace a failed worker by a fresh one, which says hello."""

    def kill(self, worker: str, at_s: float) -> Optional[str]:
        """Kill a worker as ``backend.kill`` scheduled: the failure's detail if its death is known now,
        else None (the transport reports it as a Failed event)."""


# ----------------------------------------------------------------------------- policies
def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "unknown"


@dataclass
class Verdict:
    """What a failure means: restart the worker (fault ``worker_restarted``) or end the run
    (``worker_failed``); ``detail`` is the fault's text."""

    restart: bool
    detail: str

    @property
    def kind(self) -> str:
        return "worker_restarted" if self.restart else "worker_failed"


class RestartPolicy:
    """``backend.max_restarts`` per worker, and a stop when the run cannot make progress: every worker
    has failed twice or more while no worker finished a step (the machine is overloaded, or every
    worker hits the same error)."""

    def __init__(self, names: list[str], max_restarts: int) -> None:
        self.names = list(names)
        self.max_restarts = max_restarts
        self.restarts = {name: 0 for name in self.names}
        self.streak = {name: 0 for name in self.names}  # failures since any worker last took a step
        self._steps: Optional[int] = None  # the progress count at the last failure

    def failure(self, name: str, detail: str, steps: int) -> Verdict:
        if self.restarts[name] >= self.max_restarts:
            return Verdict(False, f"{detail}; no restarts left")
        if steps != self._steps:  # a step was taken since the last failure: the run makes progress
            self.streak = dict.fromkeys(self.streak, 0)
            self._steps = steps
        self.streak[name] += 1
        if min(self.streak.values()) >= 2:
            return Verdict(False, (
                f"{detail}; every worker has now failed twice with no step taken by any, so the run is "
                f"stopped: see the first failure above; on a busy machine ({len(self.names)} workers, "
                f"{cpu_cores()} cores, load {load_average()}) use fewer backend.workers or raise "
                "backend.hello_timeout_s"))
        self.restarts[name] += 1
        return Verdict(True, f"{detail}; restart {self.restarts[name]}")


class Duplicator:
    """`backend.faults.duplicate` on a real backend: how many times to hand a message to the server.

    Draws come from a generator seeded by run.seed; each duplicate is a `fault:duplicate` row in
    the ledger, written before the two deliveries. (The sim duplicates in its simulated network.)
    """

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.p = rt.cfg.backend.faults.duplicate
        self.rng = np.random.default_rng(duplicate_seed(rt.cfg.run.seed))

    def copies(self, msg: Message, t: float) -> int:
        if self.p and self.rng.random() < self.p:
            self.rt.ledger.record_message_fault("duplicate", t, msg,
                                                f"{msg.kind} handed to the server twice")
            return 2
        return 1


class KillSchedule:
    """`backend.kill` as (wall seconds, worker name), earliest first.

    Its clock starts when every worker has said hello (process start-up, which takes seconds and
    varies with load, is not part of it), so `at_s` lands mid-run."""

    def __init__(self, cfg: "ExperimentConfig", names: list[str]) -> None:
        self.pending = sorted((k.at_s, names[k.worker]) for k in cfg.backend.kill)
        self.zero: Optional[float] = None

    def interrupt(self) -> None:
        """Ctrl-C: the run ends "interrupted", whatever else was ending it."""
        self.status = "interrupted"

    def wait_s(self, now: float, poll_s: float) -> float:
        """How long a transport may wait for its next item: ``poll_s``, or less when a kill is due sooner."""
        if self.pending and self.zero is not None:
            return max(0.0, min(poll_s, self.zero + self.pending[0][0] - now))
        return poll_s

    def due(self, now: float) -> Optional[tuple[float, str]]:
        """The next kill if it is due at ``now`` (taken off the schedule), else None."""
        if self.pending and self.zero is not None and self.zero + self.pending[0][0] <= now:
            return self.pending.pop(0)
        return None


# ----------------------------------------------------------------------------- the driver
class Driver:
    """Takes a transport's events and hands them to the run: see the module's docstring.

    ``rt`` is None for a driver that only watches workers (Ray's driver process: the messages are
    handled by the server actor's own driver); ``duplicate`` hands messages to the server twice at
    ``backend.faults.duplicate`` (real transports; the sim duplicates in its network)."""

    def __init__(self, rt: Optional["Runtime"], transport: Transport, cfg: Optional["ExperimentConfig"] = None,
                 duplicate: bool = False, names: Optional[list[str]] = None) -> None:
        self.rt = rt
        self.transport = transport
        self.cfg = cfg if cfg is not None else rt.cfg
        names = list(names if names is not None else rt.worker_names)
        self.duplicator = Duplicator(rt) if duplicate and rt is not None else None
        self.restarts = RestartPolicy(names, self.cfg.backend.max_restarts)
        self.kills = KillSchedule(self.cfg, names)
        self.steps = 0  # Stepped events seen: the restart policy's measure of progress
        self.status = "completed"

    def done(self) -> bool:
        """The run ends: its budget is reached or it was stopped (a failure, an interrupt, stop_after_updates)."""
        return self.status != "completed" or (self.rt is not None and self.rt.done())

    def stop(self, status: str) -> None:
        """End the run with ``status`` (the transport's loop ends at its next check of ``done``)."""
        if self.status == "completed":
            self.status = status

    def interrupt(self) -> None:
        """Ctrl-C: the run ends "interrupted", whatever else was ending it."""
        self.status = "interrupted"

    def wait_s(self, now: float, poll_s: float) -> float:
        return self.kills.wait_s(now, poll_s)

    def run(self) -> str:
        """The one event loop: the transport's events, turn by turn, until the run is done or the
        transport can go no further; the run's status."""
        transport = self.transport
        for event in transport.start(self):
            self.handle(event)
        while not self.done() and transport.more(self):
            for event in transport.turn(self):
                self.handle(event)
        return self.status

    def handle(self, event: Event) -> None:
        if isinstance(event, Arrived):
            self.deliver(event.msg, event.t)
        elif isinstance(event, Stepped):
            self.steps += 1
            self.rt.record_work(event.worker, event.work, event.t)
        elif isinstance(event, SafePoint):
            self.rt.safe_point(event.t, self.transport.capture)
        elif isinstance(event, Failed):
            self.failed(event.worker, event.detail, self.steps if event.steps is None else event.steps)
        elif isinstance(event, Started):
            self.kills.zero = event.at
        elif isinstance(event, Tick):
            self.run_due_kills(event.at)
        else:
            raise TypeError(f"not a driver event: {event!r}")

    def deliver(self, msg: Message, t: float) -> None:
        """One message to the server (twice for an injected duplicate); the answers to the transport."""
        for _ in range(self.duplicator.copies(msg, t) if self.duplicator is not None else 1):
            replies = self.rt.deliver(msg, t)
            if not self.transport.safe_points:
                self.rt.after_delivery(t)
            for reply in replies:
                self.transport.send(reply, t)

    def failed(self, name: str, detail: str, steps: int) -> None:
        verdict = self.restarts.failure(name, detail, steps)
        self.transport.record_fault(verdict.kind, name, verdict.detail)
        if verdict.restart:
            self.transport.restart(name)
        else:
            self.stop("worker_failed")

    def run_due_kills(self, now: float) -> None:
        while not self.done():
            kill = self.kills.due(now)
            if kill is None:
                return
            at_s, victim = kill
            detail = self.transport.kill(victim, at_s)
            if detail is not None:
                self.failed(victim, detail, self.steps)

