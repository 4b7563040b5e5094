"""`push_flood` (benchmarks only): workers without an environment push arrays as fast as they may.

It measures what the runtime itself costs per message, on every backend: each worker pushes a
fixed array with a sequence number, at most `window` unanswered, for `seconds`, then reports how
many it sent as one episode. The service adds each push into a vector, acknowledges it, and
samples the server process's memory as it goes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from marl_q.bench.memory import HeapTracer, MemorySampler
from marl_q.messages import HELLO, SERVER, Message
from marl_q.protocol import Algorithm, Context, MessageSpec, Outcome, Service, Work, Worker, worker_name
from marl_q.registry import ALGORITHMS

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig


@dataclass
class PushFloodConfig:
    """push_flood (benchmarks only): each worker pushes `size` float32 values as fast as it may."""

    size: int = 1024  # float32 values per push (4 KiB)
    window: int = 32  # pushes a worker may have unanswered; 1 = one round trip per push
    seconds: float = 10.0  # each worker pushes for this long, then reports its counts as one episode
    bad_every: int = 0  # every n-th push carries a NaN, which admission rejects; 0 = never
    # > 0: trace the server process's Python allocations (tracemalloc) and compare a snapshot taken this many
    # seconds after the first hello with the last one: the summary lists the lines whose memory grew most
    trace_after_s: float = 0.0

    def validate(self) -> None:
        for key in ("size", "window"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1, got {getattr(self, key)}")
        if self.seconds <= 0:
            raise ValueError(f"seconds: must be positive, got {self.seconds}")
        if self.bad_every < 0:
            raise ValueError(f"bad_every: must be >= 0, got {self.bad_every}")
        if self.trace_after_s < 0:
            raise ValueError(f"trace_after_s: must be >= 0, got {self.trace_after_s}")


PUSH, ACK, WELCOME = "push", "ack", "welcome"


class PushFloodWorker(Worker):
    """Pushes a fixed array with a sequence number; waits only when `window` pushes are unanswered.

    After `seconds` it stops pushing, waits until every push has been answered (so each one has
    been through the server, on every backend), and then reports its counts as one episode."""

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        self.p: PushFloodConfig = cfg.algorithm.params
        self.name = worker_name(index)
        self.good = np.ones(self.p.size, dtype=np.float32)
        self.bad = self.good.copy()
        self.bad[0] = np.nan
        self.version, self.seq, self.bad_sent, self.unanswered = 0, 0, 0, 0
        self.welcomed, self.draining, self.finished = False, False, False
        self.t_start: Optional[float] = None
        self.t_last = 0.0

    def start(self) -> list[Message]:
        return [Message(self.name, SERVER, HELLO)]

    def deliver(self, msg: Message) -> None:
        if msg.kind == WELCOME:
            self.welcomed = True
        elif msg.kind == ACK:
            self.unanswered = max(0, self.unanswered - 1)
        self.version = max(self.version, msg.base_version)

    def ready(self) -> bool:
        if not self.welcomed or self.finished:
            return False
        if self.draining:  # the report waits for the last answer
            return self.unanswered == 0
        return self.unanswered < self.p.window

    def step(self) -> Work:
        now = time.perf_counter()
        if self.draining:  # every push answered: report what was sent
            self.finished = True
            report = {"sent": self.seq, "bad_sent": self.bad_sent, "seconds": self.t_last - self.t_start}
            return Work([], env_steps=0, episodes=[report])
        if self.t_start is None:
            self.t_start = now
        self.seq += 1
        bad = self.p.bad_every > 0 and self.seq % self.p.bad_every == 0
        self.bad_sent += bad
        self.unanswered += 1
        self.t_last = now
        self.draining = now - self.t_start >= self.p.seconds  # this push is the last
        msg = Message(self.name, SERVER, PUSH, {"x": self.bad if bad else self.good}, base_version=self.version,
                      seq=self.seq)
        return Work([msg], env_steps=1)


class PushFloodService(Service):
    """Adds each push into a vector and acknowledges it; samples this process's memory as it goes."""

    def __init__(self, size: int, trace_after_s: float = 0.0) -> None:
        self.specs = {PUSH: MessageSpec({"x": ((size,), "float32")})}
        self.params = np.zeros(size, dtype=np.float32)
        self.applied = 0
        self.memory = MemorySampler()
        self.heap = HeapTracer(trace_after_s) if trace_after_s > 0 else None

    def hello(self, worker: str, version: int) -> list[Message]:
        self.memory.sample()
        if self.heap is not None:
            self.heap.start()
        return [Message(SERVER, worker, WELCOME, base_version=version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        self.params += 1e-6 * msg.payload["x"]
        self.applied += 1
        self.memory.sample()
        if self.heap is not None:
            self.heap.sample()
        return Outcome(True, [Message(SERVER, msg.src, ACK, base_version=ctx.next_version)])

    def on_reject(self, msg: Message, version: int) -> list[Message]:
        return [Message(SERVER, msg.src, ACK, base_version=version)]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"params": self.params.copy(), "applied": np.array(self.applied)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.params, self.applied = state["params"].copy(), int(state["applied"])

    def updates(self) -> int:
        return self.applied

    def summary(self) -> dict[str, Any]:
        self.memory.sample(force=True)
        out = {"server_rss": self.memory.series, "server_peak_rss_kb": self.memory.peak_kb()}
        if self.heap is not None:
            out["heap_growth"] = self.heap.growth()
        return out


@ALGORITHMS.register("push_flood", config=PushFloodConfig,
                     help="benchmarks only: workers without an environment push arrays as fast as they may")
class PushFlood(Algorithm):
    metric_fields = ["sent", "bad_sent", "seconds"]

    def make_service(self) -> Service:
        return PushFloodService(self.cfg.algorithm.size, self.cfg.algorithm.trace_after_s)

    def make_worker(self, index: int) -> Worker:
        return PushFloodWorker(self.cfg, index)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {"sent": {r["worker"]: r["sent"] for r in metrics},
                "push_seconds": {r["worker"]: r["seconds"] for r in metrics}}

