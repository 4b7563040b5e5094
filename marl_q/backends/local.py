"""`local`: one OS process per worker, the server in the main process, the real wall clock.

Each worker process rebuilds its Worker from the resolved config (so nothing but plain data crosses
the process boundary), sends what its steps produce, and blocks for replies when it must. A worker
process that dies is reported and restarted (up to backend.max_restarts times); the restarted
worker says hello and resumes from the server's current parameters. If restarts run out, the run
ends with what was learned saved (summary status "worker_failed"). The workers start together: the
answers to the first hellos are held until every worker has said hello.

Fault injection for research and tests: `backend.kill` kills a worker's process with SIGKILL at a
scheduled wall time (a `fault:kill` ledger row, then a restart), and `backend.faults.duplicate: p`
hands a worker's message to the server twice with probability p (a `fault:duplicate` row; the
server applies it at most once).
"""
from __future__ import annotations

import multiprocessing as mp
from multiprocessing import connection as mp_connection
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import Any, Optional

import numpy as np

from marl_q.config import ExperimentConfig
from marl_q.errors import ConfigError
from marl_q.messages import Message, stamp_life
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime
from marl_q.seeding import duplicate_seed

STOP = "stop"
POLL_S = 0.5
MAX_WORKERS_PER_CORE = 4  # beyond this, local refuses unless backend.oversubscribe
STOP_GRACE_S = 5.0  # how long stopping workers may take before they are terminated


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


def check_overload(cfg: ExperimentConfig) -> None:
    """Refuse, before anything is written, a local run with far more workers than cores (each worker is
    a process that imports torch and steps its environments: 64 of them on 2 cores spend minutes starting
    and time out instead of learning); with backend.oversubscribe: true, warn and go on."""
    workers, cores = cfg.backend.workers, cpu_cores()
    if workers <= MAX_WORKERS_PER_CORE * cores:
        return
    if not cfg.backend.oversubscribe:
        raise ConfigError(
            f"backend.workers={workers} on {cores} CPU cores (load {load_average()}): local runs one process per "
            f"worker, more than {MAX_WORKERS_PER_CORE} per core would spend the run starting up and timing out. "
            f"Use at most {MAX_WORKERS_PER_CORE * cores} workers, backend.name=sim to simulate {workers}, or "
            "--set backend.oversubscribe=true to run anyway")
    print(f"marlq: warning: backend.workers={workers} on {cores} CPU cores (load {load_average()}): oversubscribed "
          "(backend.oversubscribe); start-up will be slow", file=sys.stderr, flush=True)


class Duplicator:
    """`backend.faults.duplicate` on a real backend: how many times to hand a message to the server.

    Draws come from a generator seeded by run.seed; each duplicate is a `fault:duplicate` row in
    the ledger, written before the two deliveries.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.p = rt.cfg.backend.faults.duplicate
        self.rng = np.random.default_rng(duplicate_seed(rt.cfg.run.seed))

    def copies(self, msg: Message, t: float) -> int:
        if self.p and self.rng.random() < self.p:
            self.rt.ledger.record_fault("duplicate", t, msg.src, msg.dst, msg.seq, msg.nbytes,
                                        f"{msg.kind} handed to the server twice")
            return 2
        return 1


def kill_schedule(rt: Runtime) -> list[tuple[float, str]]:
    """`backend.kill` as (wall seconds, worker name), earliest first.

    The clock of a kill schedule starts when every worker has said hello (process start-up, which
    takes seconds and varies with load, is not part of it), so `at_s` lands mid-run."""
    return sorted((k.at_s, rt.worker_names[k.worker]) for k in rt.cfg.backend.kill)


def _worker_main(cfg_dict: dict, index: int, inbox: Any, outbox: Any, incarnation: int = 0) -> None:
    """Entry point of a worker process."""
    import os

    import torch

    from marl_q.config import build_config
    from marl_q.registry import ALGORITHMS

    cfg = build_config(cfg_dict)
    torch.set_num_threads(cfg.backend.threads_per_worker)
    worker = ALGORITHMS.get(cfg.algorithm.name).obj(cfg).make_worker(index)
    name = worker.name
    crash_after = cfg.backend.crash_after_steps.get(index) if incarnation == 0 else None
    steps = 0
    try:
        outbox.put(("msgs", name, stamp_life(worker.start(), f"{incarnation}-{uuid.uuid4().hex[:12]}")))
        while True:
            while not worker.ready():
                item = inbox.get()
                if item == STOP:
                    return
                worker.deliver(item)
            while True:  # take whatever else has arrived without waiting
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                if item == STOP:
                    return
                worker.deliver(item)
            work = worker.step()
            steps += 1
            if crash_after is not None and steps >= crash_after:
                os._exit(3)  # an abrupt death: this step's work is lost, no cleanup, no goodbye
            outbox.put(("work", name, work))
    except Exception:  # reported to the main process, which decides what to do
        outbox.put(("error", name, traceback.format_exc()))
    finally:
        worker.close()


@BACKENDS.register("local", help="one OS process per worker, server in the main process, wall clock")
def run_local(rt: Runtime) -> dict:
    return LocalRun(rt).run()


run_local.preflight = check_overload  # type: ignore[attr-defined]  # before the run directory is made


class LocalRun:
    """The main process of a local run: serve the workers' queues until the run is done.

    Each turn of the loop takes one item from a worker (its hello, its step's work, or the error it
    raised) and routes what the server answers, runs the kills that are due, and checks that every
    worker process is alive and not silent too long. A worker that fails is restarted, or ends the run
    (status "worker_failed") when its restarts have run out.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cfg = rt.cfg
        self.names = rt.worker_names
        self.ctx = mp.get_context("spawn")
        self.cfg_dict = self.cfg.to_dict()
        # One queue each way per worker, replaced when the worker is restarted: a process killed while
        # its queue's feeder thread held the queue's lock would otherwise block every other writer.
        self.outboxes: dict[str, Any] = {}
        self.inboxes: dict[str, Any] = {}
        self.procs: dict[str, Any] = {}
        self.restarts = {name: 0 for name in self.names}
        self.t0 = time.perf_counter()
        self.last_heard = {name: self.t0 for name in self.names}
        # when we last sent it something; a worker that spoke after our last reply may be blocked on us
        # (a sync barrier), so only one that owes us an answer can be "silent too long"
        self.last_sent = {name: self.t0 for name in self.names}
        self.duplicator = Duplicator(rt)
        self.kills = kill_schedule(rt)
        self.greeted: set[str] = set()  # workers whose first hello arrived
        # restarted workers whose new incarnation has not said hello yet: what the server sends them
        # meanwhile was meant for the dead one (a sync round it was part of, say) and is dropped, as the
        # sim does; the new incarnation's hello gets the current parameters
        self.unheard: set[str] = set()
        self.t_run: Optional[float] = None  # when every worker had said hello: the kill schedule's zero
        # the answers to the first hellos, held until every worker has said hello: the workers start
        # together, so none trains alone while another process is still importing (which would also let
        # a short run end before the kill schedule's clock had started)
        self.held: list[Message] = []
        self.turn = 0  # whose queue is served first, rotating
        self.status = "completed"
        self.last_check = self.t0
        # a fresh process that has not said hello: when it was started (its hello is due within hello_s;
        # start-up takes longer when workers outnumber cores, so the limit grows with workers per core)
        self.starting: dict[str, float] = {}
        self.hello_s = self.cfg.backend.hello_timeout_s * max(1.0, len(self.names) / cpu_cores())
        # failures of each worker since any worker last finished a step: every worker at 2 or more means
        # the run cannot make progress (the machine is overloaded, or every worker hits the same error)
        self.streak = {name: 0 for name in self.names}
        self.interrupts = 0  # Ctrl-C presses seen by the main loop's handler

    def run(self) -> dict:
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self.on_interrupt) if main else None
        try:
            try:
                for i in range(len(self.names)):
                    if self.interrupts:
                        break
                    self.spawn(i)
                self.last_check = time.perf_counter()
                while not self.rt.done() and self.status == "completed":
                    if self.interrupts:
                        self.status = "interrupted"
                        break
                    now = self.serve_next()
                    self.run_due_kills(now)
                    if now - self.last_check >= POLL_S:
                        self.last_check = now  # liveness, checked on the clock whether or not others keep talking
                        self.check_liveness(now)
                if self.interrupts:
                    self.status = "interrupted"
            finally:
                self.stop_workers(grace_s=1.0 if self.interrupts else STOP_GRACE_S)
            # between turns the server's state is whole: an interrupted run keeps what it learned in a
            # checkpoint, so that `marlq resume` can continue it (nothing learned: nothing to resume)
            learned = self.rt.service.updates() > 0
            return self.rt.finish(time.perf_counter() - self.t0, virtual=False, status=self.status,
                                  checkpoint=self.status != "interrupted" or learned)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def on_interrupt(self, signum: int, frame: Any) -> None:
        """Ctrl-C: the main loop stops at its next turn (within POLL_S); a second Ctrl-C stops at once."""
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt

    # ------------------------------------------------------------------------- one turn of the loop
    def serve_next(self) -> float:
        """Take the next item from any worker (waiting at most until the next kill or poll) and
        handle it; returns when it was taken."""
        wait_s = POLL_S
        if self.kills and self.t_run is not None:
            wait_s = max(0.0, min(POLL_S, self.t_run + self.kills[0][0] - time.perf_counter()))
        self.turn += 1
        kind, name, body = _next_item(self.outboxes, wait_s, self.turn)
        now = time.perf_counter()
        if kind == "error":
            self.last_heard[name] = now
            if self.failed(name, f"raised an exception:\n{body}"):
                self.status = "worker_failed"
        elif kind is not None:
            self.last_heard[name] = now
            if kind == "work":
                self.streak = dict.fromkeys(self.streak, 0)  # a step was taken: the run makes progress
            self.receive(kind, name, body, now)
        return now

    def receive(self, kind: str, name: str, body: Any, now: float) -> None:
        """A worker's hello ("msgs") or step ("work"): through the server, and its answers on."""
        msgs: list[Message] = body.messages if kind == "work" else body
        if kind == "work":
            self.rt.record_work(name, body, now - self.t0)
        else:
            self.said_hello(name, now)
        for msg in msgs:
            for _ in range(self.duplicator.copies(msg, now - self.t0)):
                replies = self.rt.deliver(msg, now - self.t0)
                self.rt.after_delivery(now - self.t0)
                for reply in replies:
                    self.route(reply, now)
        if self.t_run is not None and self.held:
            for reply in self.held:
                self.post(reply)
            self.held.clear()

    def said_hello(self, name: str, now: float) -> None:
        self.unheard.discard(name)
        self.starting.pop(name, None)
        if self.t_run is None:
            self.greeted.add(name)
            self.t_run = now if len(self.greeted) == len(self.names) else None

    def route(self, reply: Message, now: float) -> None:
        """An answer of the server: dropped if meant for a dead incarnation, held until every worker
        has said hello, posted otherwise."""
        if reply.dst in self.unheard:
            self.rt.ledger.record_fault("undeliverable", now - self.t0, reply.src, reply.dst, reply.seq,
                                        reply.nbytes, f"{reply.kind} to a killed incarnation")
        elif self.t_run is None:
            self.held.append(reply)
        else:
            self.post(reply)

    def post(self, reply: Message) -> None:
        self.inboxes[reply.dst].put(reply)
        self.last_sent[reply.dst] = time.perf_counter()

    def run_due_kills(self, now: float) -> None:
        while self.kills and self.t_run is not None and self.t_run + self.kills[0][0] <= now \
                and self.status == "completed" and not self.rt.done():
            at_s, victim = self.kills.pop(0)
            if self.kill(victim, at_s):
                self.status = "worker_failed"

    def check_liveness(self, now: float) -> None:
        for name, p in list(self.procs.items()):
            if not p.is_alive():
                why = f"process exited with code {p.exitcode}"
            elif name in self.starting and now - self.starting[name] > self.hello_s:
                why = (f"never said hello within {self.hello_s:.3g} s of starting (backend.hello_timeout_s; "
                       f"load {load_average()} on {cpu_cores()} cores)")
            elif (name not in self.starting and self.last_sent[name] > self.last_heard[name]
                  and now - self.last_sent[name] > self.cfg.backend.reply_timeout_s):
                why = f"silent for {self.cfg.backend.reply_timeout_s:.3g} s after a reply (backend.reply_timeout_s)"
            else:
                continue
            if self.failed(name, why):
                self.status = "worker_failed"
                break

    # ------------------------------------------------------------------------- the worker processes
    def spawn(self, i: int) -> None:
        name = self.names[i]
        self.inboxes[name], self.outboxes[name] = self.ctx.Queue(), self.ctx.Queue()
        p = self.ctx.Process(target=_worker_main, daemon=True,
                             args=(self.cfg_dict, i, self.inboxes[name], self.outboxes[name], self.restarts[name]))
        with _sigint_ignored():  # inherited by the new process: Ctrl-C reaches the main process only
            p.start()
        self.procs[name] = p
        self.last_sent[name] = time.perf_counter()  # a fresh process owes us its hello
        self.last_heard[name] = self.last_sent[name] - 1e-9
        self.starting[name] = self.last_sent[name]

    def kill(self, name: str, at_s: float) -> bool:
        """Kill a worker's process as scheduled; True if the run must end."""
        p = self.procs[name]
        self.rt.ledger.record_fault("kill", time.perf_counter() - self.t0, name, name,
                                    detail=f"SIGKILL to pid {p.pid}, scheduled at {at_s} s after the start")
        p.kill()
        p.join(timeout=5)
        return self.failed(name, f"killed by backend.kill at {at_s} s (SIGKILL)")

    def failed(self, name: str, detail: str) -> bool:
        """Handle a dead worker; True if the run must end."""
        now = time.perf_counter() - self.t0
        if self.restarts[name] >= self.cfg.backend.max_restarts:
            self.rt.record_fault("worker_failed", name, f"{detail}; no restarts left", now)
            return True
        self.streak[name] += 1
        if min(self.streak.values()) >= 2:
            self.rt.record_fault("worker_failed", name, (
                f"{detail}; every worker has now failed twice with no step taken by any, so the run is "
                f"stopped: see the first failure above; on a busy machine ({len(self.names)} workers, "
                f"{cpu_cores()} cores, load {load_average()}) use fewer backend.workers or raise "
                "backend.hello_timeout_s"), now)
            return True
        self.restarts[name] += 1
        self.rt.record_fault("worker_restarted", name, f"{detail}; restart {self.restarts[name]}", now)
        p = self.procs[name]
        if p.is_alive():
            p.terminate()
        p.join(timeout=5)
        for q in (self.inboxes[name], self.outboxes[name]):
            q.cancel_join_thread()  # what is still in them is dropped; the restarted worker says hello
            q.close()
        self.spawn(self.names.index(name))
        self.unheard.add(name)
        self.held[:] = [r for r in self.held if r.dst != name]  # its answer died with it; its successor says hello
        return False

    def stop_workers(self, grace_s: float = STOP_GRACE_S) -> None:
        """Tell every worker to stop; terminate those still running after ``grace_s`` (all together)."""
        for name in self.names:
            if name in self.inboxes:
                self.inboxes[name].put(STOP)
        deadline = time.perf_counter() + grace_s
        for p in self.procs.values():
            p.join(timeout=max(0.0, deadline - time.perf_counter()))
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()  # SIGTERM: a worker still importing ends without a traceback
        for p in self.procs.values():
            p.join(timeout=1.0)


class _sigint_ignored:
    """SIGINT ignored for the ``with`` block (main thread only): a process started inside inherits the
    ignored disposition, and Python then never turns Ctrl-C into a KeyboardInterrupt there (a terminal's
    Ctrl-C goes to the whole process group; the main process alone decides how the run ends)."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _next_item(outboxes: dict[str, Any], timeout: float, turn: int = 0) -> tuple[Any, Any, Any]:
    """The next (kind, worker, body) from any worker's queue, or (None, None, None) after timeout.

    Among the queues with something waiting, the first at or after position ``turn`` (mod the number
    of workers) is served: with a rising ``turn`` every worker gets its turn, so under load the first
    worker's queue cannot starve the others."""
    names = list(outboxes)
    k = turn % len(names)
    names = names[k:] + names[:k]
    readers = {outboxes[name]._reader: name for name in names}  # the queues' pipe ends, to wait on
    ready = set(mp_connection.wait(list(readers), timeout=timeout))
    for reader in [r for r in readers if r in ready]:  # in turn order
        try:
            return outboxes[readers[reader]].get_nowait()
        except (queue.Empty, EOFError, OSError):
            continue  # a dying worker's partial write: its death is noticed by the liveness check
    return None, None, None
