"""`sim`: a deterministic discrete-event simulation with a virtual clock, in one process.

Computation is real; when things happen is simulated. A worker's step takes
cost * compute.step_s * (straggler factor) * lognormal jitter virtual seconds; a message takes
latency + bytes / bandwidth (times jitter). Events are ordered by (time, sequence number), and all
randomness of timing comes from one generator seeded by run.seed, so a seed reproduces a run
exactly. Messages that reach a worker while it computes wait until its step ends.

With `backend.schedule` set to uniform | round_robin | zipf, the active worker of each step is
drawn from that schedule instead, and messages are delivered at once (LSVI's setting: episode k
is played by agent m_k).

Both are transports of the one driver (marl_q/driver.py): each turn (one event of the heap, or one
step of the schedule) is a generator that yields what happens (a safe point first, then a message
reaching the server, a finished step) and goes on once the driver has handled it.
"""
from __future__ import annotations

import heapq
import math
from typing import Optional

import numpy as np

from marl_q.driver import Arrived, Driver, SafePoint, Stepped
from marl_q.errors import ConfigError
from marl_q.messages import SERVER, Message, stamp_life
from marl_q.protocol import Work, Worker
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime
from marl_q.seeding import derive, timing_seed
from marl_q.state_format import rng_from_state, rng_state


@BACKENDS.register("sim", help="one process, virtual clock, deterministic (the default)")
def run_sim(rt: Runtime) -> dict:
    """Run (or, from a checkpoint's snapshot, continue) the simulation; the result is the same
    whether or not the run was stopped and resumed on the way."""
    cfg = rt.cfg
    snap = rt.resume.snapshot if rt.resume is not None else None
    if snap is not None and snap.get("mode") != cfg.backend.schedule:
        raise ConfigError(f"resume: the snapshot was taken in sim mode {snap.get('mode')!r}, "
                          f"but backend.schedule is {cfg.backend.schedule!r}")
    sim = _EventSim(rt, snap) if cfg.backend.schedule == "events" else _ScheduleSim(rt, snap)
    try:
        Driver(rt, sim).run()
        if rt.out is not None and not rt.stopped:
            rt.checkpoint(sim.now, sim.capture)  # the final state, whole: a finished run can be extended exactly
    finally:
        for w in sim.workers:
            w.close()
    return rt.finish(sim.now, virtual=True, checkpoint=False)


class _Timing:
    def __init__(self, rt: Runtime) -> None:
        b = rt.cfg.backend
        self.rng = np.random.default_rng(timing_seed(rt.cfg.run.seed))
        self.compute, self.network = b.compute, b.network
        self.factor = [b.compute.straggler_factor if i in b.compute.stragglers else 1.0 for i in range(b.workers)]
        if b.compute.speeds == "lognormal":  # a fleet of fixed, heterogeneous speeds: one mean-one factor a worker
            sigma = b.compute.speed_sigma  # (from a stream of its own: the timing generator's draws stay as they were)
            draws = np.random.default_rng(derive(rt.cfg.run.seed, "timing", 0)).normal(-0.5 * sigma * sigma, sigma, b.workers)
            self.factor = [f * float(math.exp(d)) for f, d in zip(self.factor, draws)]

    def _jitter(self, sigma: float) -> float:
        # mean-one lognormal: exp(N(-sigma^2/2, sigma))
        return float(math.exp(self.rng.normal(-0.5 * sigma * sigma, sigma))) if sigma > 0 else 1.0

    def compute_s(self, index: int, work: Work) -> float:
        return work.sim_cost * self.compute.step_s * self.factor[index] * self._jitter(self.compute.jitter)

    def network_s(self, msg: Message) -> float:
        n = self.network
        return (n.latency_s + msg.nbytes / n.bandwidth_bytes_per_s) * self._jitter(n.jitter)


RNGS = ("timing_rng", "pick_rng")  # the sims' generators (STATE names them)


def _restore(sim, snap: dict) -> None:
    """Take a sim's state back from a checkpoint's snapshot (the attributes its STATE names; its
    generators, RNGS, as data: ``marl_q.state_format.rng_state``)."""
    for key in sim.STATE:
        setattr(sim, key, rng_from_state(snap[key]) if key in RNGS else snap[key])
    sim.timing.rng = sim.timing_rng
    sim.started = True


def _capture(sim, mode: str) -> dict:
    """A sim's state for a checkpoint's snapshot: the attributes its STATE names, generators as data."""
    sim.timing_rng = sim.timing.rng
    return {"mode": mode, **{key: rng_state(getattr(sim, key)) if key in RNGS else getattr(sim, key)
                             for key in sim.STATE}}



class _EventSim:
    """Events ordered by (virtual time, sequence number): steps finishing, messages arriving, faults.

    All of its state is in the attributes named in STATE, which `capture()` hands to the runtime's
    checkpoint between events (a safe point) and `__init__` takes back from a snapshot."""

    STATE = ("workers", "heap", "seq", "busy", "alive", "life", "inbox", "now", "timing_rng")
    safe_points = True

    def __init__(self, rt: Runtime, snap: Optional[dict] = None) -> None:
        self.rt = rt
        self.timing = _Timing(rt)
        self.faults = rt.cfg.backend.faults
        if snap is not None:
            _restore(self, snap)
        else:
            n = rt.cfg.backend.workers
            self.workers: list[Worker] = [rt.algorithm.make_worker(i) for i in range(n)]
            self.heap: list[tuple[float, int, str, object]] = []
            self.seq = 0
            self.busy = [False] * n
            self.alive = [True] * n
            # incarnation: events of a crashed worker's past life are void. A resume without a snapshot
            # (fresh workers on the server's state) starts a new life, so the server takes their hellos
            self.life = [len(rt.resumes)] * n
            self.inbox: list[list[Message]] = [[] for _ in range(n)]
            self.now = float(rt.resume.meta.get("t", 0.0)) if rt.resume is not None else 0.0
            self.started = False
        self.index = {w.name: i for i, w in enumerate(self.workers)}

    def capture(self) -> dict:
        return _capture(self, "events")

    def send(self, reply: Message, t: float) -> None:
        """An answer of the server, addressed to the incarnation alive now: a worker that crashes before
        it arrives never sees it, and neither does its successor (whose hello gets its own reply)."""
        j = self.index[reply.dst]
        self.push(t + self.delay(reply, t), "to_worker", (reply, self.life[j] if self.alive[j] else -1))

    def push(self, t: float, kind: str, item: object) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, item))
        self.seq += 1

    def delay(self, m: Message, t: float) -> float:
        d = self.timing.network_s(m)
        if self.faults.spike_p and self.timing.rng.random() < self.faults.spike_p:
            self.rt.ledger.record_message_fault("delay_spike", t, m, f"+{self.faults.spike_s} s")
            d += self.faults.spike_s
        return d

    def send_up(self, msgs: list[Message], t: float) -> None:
        faults, rng = self.faults, self.timing.rng
        for m in msgs:
            if faults.loss and rng.random() < faults.loss:
                self.rt.ledger.record_message_fault("loss", t, m,
                                                    f"{m.kind} lost; resent after {faults.retransmit_s} s")
                self.push(t + faults.retransmit_s, "resend", m)
                continue
            arrival = t + self.delay(m, t)
            self.push(arrival, "to_server", m)
            if faults.duplicate and rng.random() < faults.duplicate:
                self.rt.ledger.record_message_fault("duplicate", t, m, f"{m.kind} delivered twice")
                self.push(arrival + faults.dup_delay_s, "to_server", m)

    def start_compute(self, i: int, t: float) -> None:
        self.busy[i] = True
        work = self.workers[i].step()
        self.push(t + self.timing.compute_s(i, work), "done", (i, self.life[i], work))

    def start_workers(self) -> None:
        """Every worker says hello at the start (time 0, or the checkpoint's time on a resume without
        a snapshot) and starts a step if it may; the crashes are scheduled."""
        self.started = True
        for i, w in enumerate(self.workers):
            self.send_up(stamp_life(w.start(), str(self.life[i])), self.now)
            if w.ready():
                self.start_compute(i, self.now)
        for i, t_crash in sorted(self.faults.crash.items()):
            if t_crash >= self.now:  # (a resume without a snapshot starts at the checkpoint's time)
                self.push(t_crash, "crash", i)

    def crash(self, i: int, now: float) -> None:
        """An injected crash: the worker's state, its inbox and its step in progress are lost."""
        name = self.workers[i].name
        self.rt.ledger.record_fault("crash", now, name, name, detail="worker state lost")
        self.rt.record_fault("worker_crashed", name, "injected crash (sim)", now)
        self.workers[i].close()
        self.alive[i], self.busy[i] = False, False
        self.inbox[i].clear()
        self.life[i] += 1
        self.push(now + self.faults.restart_s, "restart", i)

    def drop_out(self, i: int, msgs: list[Message], now: float) -> None:
        """The worker leaves as its step ends (faults.dropout): the step's messages are never sent and
        those waiting for it are lost; it keeps its state and rejoins after an exponential time of mean
        faults.rejoin_s as a new incarnation (answers addressed to the old one are void)."""
        ledger, name = self.rt.ledger, self.workers[i].name
        for m in msgs:
            ledger.record_message_fault("dropout", now, m, f"{m.kind} not sent: {name} left")
        for m in self.inbox[i]:
            ledger.record_message_fault("undeliverable", now, m, f"{m.kind} to a worker that left")
        self.inbox[i].clear()
        self.alive[i] = False
        self.life[i] += 1
        self.push(now + self.faults.rejoin_s * float(self.timing.rng.exponential()), "rejoin", (i, self.life[i]))

    def start(self, driver: Driver):
        if not self.started:  # (a resumed snapshot has started)
            self.start_workers()
        return iter(())

    def more(self, driver: Driver) -> bool:
        if not self.heap:
            raise RuntimeError("sim: every worker is waiting and no message is in flight (deadlock)")
        return True

    def turn(self, driver: Driver):
        """A safe point, then the next event of the heap."""
        rt, workers = self.rt, self.workers
        yield SafePoint(self.now)
        if driver.done():  # run.stop_after_updates, at the safe point
            return
        self.now, _, kind, item = heapq.heappop(self.heap)
        now = self.now
        if kind == "to_server":
            yield Arrived(item, now)  # the server's answers come back through send()
            return
        if kind == "resend":
            self.send_up([item], now)
            return
        if kind == "crash":
            self.crash(item, now)
            return
        if kind == "rejoin":
            i, life = item
            if life != self.life[i]:  # it crashed while away: its restart said hello
                return
            self.alive[i] = True
            self.send_up(stamp_life(workers[i].start(), str(life)), now)
            return  # it waits for the parameters its hello asks for
        if kind == "restart":
            i = item
            workers[i] = rt.algorithm.make_worker(i)
            self.alive[i] = True
            rt.record_fault("worker_restarted", workers[i].name, "fresh worker after an injected crash", now)
            self.send_up(stamp_life(workers[i].start(), str(self.life[i])), now)
        elif kind == "to_worker":
            item, addressee = item
            i = self.index[item.dst]
            if not self.alive[i] or addressee != self.life[i]:
                rt.ledger.record_message_fault("undeliverable", now, item,
                                               f"{item.kind} to a crashed worker")
                return
            if self.busy[i]:
                self.inbox[i].append(item)
                return
            workers[i].deliver(item)
        else:  # a step finished
            i, incarnation, work = item
            if incarnation != self.life[i]:
                return  # the worker crashed while computing: that work is lost
            self.busy[i] = False
            yield Stepped(workers[i].name, work, now)
            if self.faults.dropout and self.timing.rng.random() < self.faults.dropout:
                self.drop_out(i, work.messages, now)
                return
            self.send_up(work.messages, now)
            for m in self.inbox[i]:
                workers[i].deliver(m)
            self.inbox[i].clear()
        if self.alive[i] and not self.busy[i] and workers[i].ready() and not driver.done():
            self.start_compute(i, now)


class _ScheduleSim:
    """The active worker of each step is drawn from backend.schedule; messages arrive at once."""

    STATE = ("workers", "k", "now", "timing_rng", "pick_rng")
    safe_points = True

    def __init__(self, rt: Runtime, snap: Optional[dict] = None) -> None:
        b = rt.cfg.backend
        self.rt = rt
        self.timing = _Timing(rt)
        if b.schedule == "zipf" and b.zipf_a <= 0:
            raise ConfigError(f"backend.zipf_a: must be positive, got {b.zipf_a}")
        if b.schedule not in ("uniform", "round_robin", "zipf"):
            raise ConfigError(f"backend.schedule: unknown schedule {b.schedule!r}")
        if snap is not None:
            _restore(self, snap)
        else:
            self.workers: list[Worker] = [rt.algorithm.make_worker(i) for i in range(b.workers)]
            self.k = 0
            self.now = 0.0
            self.pick_rng = np.random.default_rng(timing_seed(rt.cfg.run.seed))
            self.started = False
        self.index = {w.name: i for i, w in enumerate(self.workers)}
        self.queue: list[Message] = []  # the messages of one step and their answers, in order (see route)

    def capture(self) -> dict:
        return _capture(self, self.rt.cfg.backend.schedule)

    def pick(self, k: int) -> int:
        b = self.rt.cfg.backend
        m = b.workers
        if b.schedule == "uniform":
            return int(self.pick_rng.integers(m))
        if b.schedule == "round_robin":
            return k % m
        p = 1.0 / np.arange(1, m + 1) ** b.zipf_a
        return int(self.pick_rng.choice(m, p=p / p.sum()))

    def send(self, reply: Message, t: float) -> None:
        self.queue.append(reply)

    def route(self, msgs: list[Message]):
        """Messages and the answers they cause, in the order they were sent, each delivered at once."""
        self.queue = list(msgs)
        while self.queue:
            msg = self.queue.pop(0)
            if msg.dst == SERVER:
                yield Arrived(msg, self.now)  # its answers join the queue through send()
            else:
                self.workers[self.index[msg.dst]].deliver(msg)

    def start(self, driver: Driver):
        if not self.started:  # (a resumed snapshot has started)
            self.started = True
            for w in self.workers:
                yield from self.route(w.start())

    def more(self, driver: Driver) -> bool:
        return True

    def turn(self, driver: Driver):
        """A safe point, then one step of the worker the schedule draws."""
        yield SafePoint(self.now)
        if driver.done():  # run.stop_after_updates, at the safe point
            return
        i = self.pick(self.k)
        self.k += 1
        worker = self.workers[i]
        if not worker.ready():
            raise RuntimeError(f"sim schedule: worker {worker.name} is blocked although messages are instant")
        work = worker.step()
        self.now += self.timing.compute_s(i, work)
        yield from self.route(work.messages)  # first, so the step's row counts the traffic it caused
        yield Stepped(worker.name, work, self.now)
