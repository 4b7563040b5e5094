"""`sim`: a deterministic discrete-event simulation with a virtual clock, in one process.

Computation is real; when things happen is simulated. A worker's step takes
cost * compute.step_s * (straggler factor) * lognormal jitter virtual seconds; a message takes
latency + bytes / bandwidth (times jitter). Events are ordered by (time, sequence number), and all
randomness of timing comes from one generator seeded by run.seed, so a seed reproduces a run
exactly. Messages that reach a worker while it computes wait until its step ends.

With `backend.schedule` set to uniform | round_robin | zipf, the active worker of each step is
drawn from that schedule instead, and messages are delivered at once (LSVI's setting: episode k
is played by agent m_k).
"""
from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np

from marl_q.errors import ConfigError
from marl_q.messages import SERVER, Message
from marl_q.protocol import Work, Worker
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime

TIMING_SEED_OFFSET = 7919  # timing randomness is independent of learning randomness


@BACKENDS.register("sim", help="one process, virtual clock, deterministic (the default)")
def run_sim(rt: Runtime) -> dict:
    cfg = rt.cfg
    workers = [rt.algorithm.make_worker(i) for i in range(cfg.backend.workers)]
    try:
        if cfg.backend.schedule == "events":
            clock = _run_events(rt, workers)
        else:
            clock = _run_schedule(rt, workers)
    finally:
        for w in workers:
            w.close()
    return rt.finish(clock, virtual=True)


class _Timing:
    def __init__(self, rt: Runtime) -> None:
        b = rt.cfg.backend
        self.rng = np.random.default_rng(rt.cfg.run.seed + TIMING_SEED_OFFSET)
        self.compute, self.network = b.compute, b.network
        self.factor = [b.compute.straggler_factor if i in b.compute.stragglers else 1.0 for i in range(b.workers)]

    def _jitter(self, sigma: float) -> float:
        # mean-one lognormal: exp(N(-sigma^2/2, sigma))
        return float(math.exp(self.rng.normal(-0.5 * sigma * sigma, sigma))) if sigma > 0 else 1.0

    def compute_s(self, index: int, work: Work) -> float:
        return work.sim_cost * self.compute.step_s * self.factor[index] * self._jitter(self.compute.jitter)

    def network_s(self, msg: Message) -> float:
        n = self.network
        return (n.latency_s + msg.nbytes / n.bandwidth_bytes_per_s) * self._jitter(n.jitter)


def _run_events(rt: Runtime, workers: list[Worker]) -> float:
    timing = _Timing(rt)
    faults = rt.cfg.backend.faults
    index = {w.name: i for i, w in enumerate(workers)}
    heap: list[tuple[float, int, str, object]] = []
    seq = 0
    busy = [False] * len(workers)
    alive = [True] * len(workers)
    life = [0] * len(workers)  # incarnation: events of a crashed worker's past life are void
    inbox: list[list[Message]] = [[] for _ in workers]
    now = 0.0

    def push(t: float, kind: str, item: object) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, item))
        seq += 1

    def delay(m: Message, t: float) -> float:
        d = timing.network_s(m)
        if faults.spike_p and timing.rng.random() < faults.spike_p:
            rt.ledger.record_fault("delay_spike", t, m.src, m.dst, m.seq, m.nbytes, f"+{faults.spike_s} s")
            d += faults.spike_s
        return d

    def send_up(msgs: list[Message], t: float) -> None:
        for m in msgs:
            if faults.loss and timing.rng.random() < faults.loss:
                rt.ledger.record_fault("loss", t, m.src, m.dst, m.seq, m.nbytes,
                                       f"{m.kind} lost; resent after {faults.retransmit_s} s")
                push(t + faults.retransmit_s, "resend", m)
                continue
            arrival = t + delay(m, t)
            push(arrival, "to_server", m)
            if faults.duplicate and timing.rng.random() < faults.duplicate:
                rt.ledger.record_fault("duplicate", t, m.src, m.dst, m.seq, m.nbytes, f"{m.kind} delivered twice")
                push(arrival + faults.dup_delay_s, "to_server", m)

    def start_compute(i: int, t: float) -> None:
        busy[i] = True
        work = workers[i].step()
        push(t + timing.compute_s(i, work), "done", (i, life[i], work))

    for i, w in enumerate(workers):
        send_up(w.start(), 0.0)
        if w.ready():
            start_compute(i, 0.0)
    for i, t_crash in sorted(faults.crash.items()):
        push(t_crash, "crash", i)

    while heap and not rt.done():
        now, _, kind, item = heapq.heappop(heap)
        if kind == "to_server":
            for reply in rt.deliver(item, now):
                push(now + delay(reply, now), "to_worker", reply)
            continue
        if kind == "resend":
            send_up([item], now)
            continue
        if kind == "crash":
            i = item
            rt.ledger.record_fault("crash", now, workers[i].name, workers[i].name, detail="worker state lost")
            rt.record_fault("worker_crashed", workers[i].name, "injected crash (sim)", now)
            workers[i].close()
            alive[i], busy[i] = False, False
            inbox[i].clear()
            life[i] += 1
            push(now + faults.restart_s, "restart", i)
            continue
        if kind == "restart":
            i = item
            workers[i] = rt.algorithm.make_worker(i)
            alive[i] = True
            rt.record_fault("worker_restarted", workers[i].name, "fresh worker after an injected crash", now)
            send_up(workers[i].start(), now)
        elif kind == "to_worker":
            i = index[item.dst]
            if not alive[i]:
                rt.ledger.record_fault("undeliverable", now, item.src, item.dst, item.seq, item.nbytes,
                                       f"{item.kind} to a crashed worker")
                continue
            if busy[i]:
                inbox[i].append(item)
                continue
            workers[i].deliver(item)
        else:  # a step finished
            i, incarnation, work = item
            if incarnation != life[i]:
                continue  # the worker crashed while computing: that work is lost
            busy[i] = False
            rt.record_work(workers[i].name, work, now)
            send_up(work.messages, now)
            for m in inbox[i]:
                workers[i].deliver(m)
            inbox[i].clear()
        if alive[i] and not busy[i] and workers[i].ready() and not rt.done():
            start_compute(i, now)
    if not rt.done() and not heap:
        raise RuntimeError("sim: every worker is waiting and no message is in flight (deadlock)")
    return now


def _schedule(rt: Runtime) -> Callable[[int], int]:
    b = rt.cfg.backend
    rng = np.random.default_rng(rt.cfg.run.seed + TIMING_SEED_OFFSET)
    m = b.workers
    if b.schedule == "uniform":
        return lambda k: int(rng.integers(m))
    if b.schedule == "round_robin":
        return lambda k: k % m
    if b.schedule == "zipf":
        if b.zipf_a <= 0:
            raise ConfigError(f"backend.zipf_a: must be positive, got {b.zipf_a}")
        p = 1.0 / np.arange(1, m + 1) ** b.zipf_a
        p /= p.sum()
        return lambda k: int(rng.choice(m, p=p))
    raise ConfigError(f"backend.schedule: unknown schedule {b.schedule!r}")


def _run_schedule(rt: Runtime, workers: list[Worker]) -> float:
    timing = _Timing(rt)
    index = {w.name: i for i, w in enumerate(workers)}
    pick = _schedule(rt)
    now = 0.0

    def route(msgs: list[Message]) -> None:
        queue = list(msgs)
        while queue:
            msg = queue.pop(0)
            if msg.dst == SERVER:
                queue.extend(rt.deliver(msg, now))
            else:
                workers[index[msg.dst]].deliver(msg)

    for w in workers:
        route(w.start())
    k = 0
    while not rt.done():
        i = pick(k)
        k += 1
        if not workers[i].ready():
            raise RuntimeError(f"sim schedule: worker {workers[i].name} is blocked although messages are instant")
        work = workers[i].step()
        now += timing.compute_s(i, work)
        route(work.messages)  # first, so the step's row counts the traffic it caused
        rt.record_work(workers[i].name, work, now)
    return now
