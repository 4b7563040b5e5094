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
import queue
import time
import traceback
import uuid
from typing import Any, Optional

import numpy as np

from marl_q.messages import Message, stamp_life
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime
from marl_q.seeding import duplicate_seed

STOP = "stop"
POLL_S = 0.5


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

    def run(self) -> dict:
        for i in range(len(self.names)):
            self.spawn(i)
        self.last_check = time.perf_counter()
        try:
            while not self.rt.done() and self.status == "completed":
                now = self.serve_next()
                self.run_due_kills(now)
                if now - self.last_check >= POLL_S:
                    self.last_check = now  # liveness, checked on the clock whether or not others keep talking
                    self.check_liveness(now)
        finally:
            self.stop_workers()
        return self.rt.finish(time.perf_counter() - self.t0, virtual=False, status=self.status)

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
                for reply in self.rt.deliver(msg, now - self.t0):
                    self.route(reply, now)
        if self.t_run is not None and self.held:
            for reply in self.held:
                self.post(reply)
            self.held.clear()

    def said_hello(self, name: str, now: float) -> None:
        self.unheard.discard(name)
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
            owes = self.last_sent[name] > self.last_heard[name]
            silent = owes and now - self.last_sent[name] > self.cfg.backend.reply_timeout_s
            if not p.is_alive() or silent:
                why = f"process exited with code {p.exitcode}" if not p.is_alive() else "silent too long"
                if self.failed(name, why):
                    self.status = "worker_failed"
                    break

    # ------------------------------------------------------------------------- the worker processes
    def spawn(self, i: int) -> None:
        name = self.names[i]
        self.inboxes[name], self.outboxes[name] = self.ctx.Queue(), self.ctx.Queue()
        p = self.ctx.Process(target=_worker_main, daemon=True,
                             args=(self.cfg_dict, i, self.inboxes[name], self.outboxes[name], self.restarts[name]))
        p.start()
        self.procs[name] = p
        self.last_sent[name] = time.perf_counter()  # a fresh process owes us its hello
        self.last_heard[name] = self.last_sent[name] - 1e-9

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

    def stop_workers(self) -> None:
        for name in self.names:
            self.inboxes[name].put(STOP)
        for p in self.procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


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
