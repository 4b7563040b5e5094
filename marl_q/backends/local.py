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
from typing import Any

import numpy as np

from marl_q.messages import Message, stamp_life
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime

STOP = "stop"
POLL_S = 0.5
DUP_SEED_OFFSET = 104729  # duplicate draws are independent of learning randomness


class Duplicator:
    """`backend.faults.duplicate` on a real backend: how many times to hand a message to the server.

    Draws come from a generator seeded by run.seed; each duplicate is a `fault:duplicate` row in
    the ledger, written before the two deliveries.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.p = rt.cfg.backend.faults.duplicate
        self.rng = np.random.default_rng(rt.cfg.run.seed + DUP_SEED_OFFSET)

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
    cfg = rt.cfg
    ctx = mp.get_context("spawn")
    cfg_dict = cfg.to_dict()
    # One queue each way per worker, replaced when the worker is restarted: a process killed while
    # its queue's feeder thread held the queue's lock would otherwise block every other writer.
    outboxes: dict[str, Any] = {}
    inboxes: dict[str, Any] = {}
    procs: dict[str, Any] = {}
    restarts = {name: 0 for name in rt.worker_names}
    t0 = time.perf_counter()
    last_heard = {name: t0 for name in rt.worker_names}
    # when we last sent it something; a worker that spoke after our last reply may be blocked on us
    # (a sync barrier), so only one that owes us an answer can be "silent too long"
    last_sent = {name: t0 for name in rt.worker_names}

    def spawn(i: int) -> None:
        name = rt.worker_names[i]
        inboxes[name], outboxes[name] = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_worker_main, args=(cfg_dict, i, inboxes[name], outboxes[name], restarts[name]),
                        daemon=True)
        p.start()
        procs[name] = p
        last_sent[name] = time.perf_counter()  # a fresh process owes us its hello
        last_heard[name] = last_sent[name] - 1e-9

    def failed(name: str, detail: str) -> bool:
        """Handle a dead worker; True if the run must end."""
        now = time.perf_counter() - t0
        if restarts[name] >= cfg.backend.max_restarts:
            rt.record_fault("worker_failed", name, f"{detail}; no restarts left", now)
            return True
        restarts[name] += 1
        rt.record_fault("worker_restarted", name, f"{detail}; restart {restarts[name]}", now)
        p = procs[name]
        if p.is_alive():
            p.terminate()
        p.join(timeout=5)
        for q in (inboxes[name], outboxes[name]):
            q.cancel_join_thread()  # what is still in them is dropped; the restarted worker says hello
            q.close()
        spawn(rt.worker_names.index(name))
        unheard.add(name)
        held[:] = [r for r in held if r.dst != name]  # its answer died with it; its successor says hello
        return False

    def post(reply: Message) -> None:
        inboxes[reply.dst].put(reply)
        last_sent[reply.dst] = time.perf_counter()

    def kill(name: str, at_s: float) -> bool:
        """Kill a worker's process as scheduled; True if the run must end."""
        p = procs[name]
        rt.ledger.record_fault("kill", time.perf_counter() - t0, name, name,
                               detail=f"SIGKILL to pid {p.pid}, scheduled at {at_s} s after the start")
        p.kill()
        p.join(timeout=5)
        return failed(name, f"killed by backend.kill at {at_s} s (SIGKILL)")

    duplicator = Duplicator(rt)
    kills = kill_schedule(rt)
    greeted: set[str] = set()  # workers whose first hello arrived
    # restarted workers whose new incarnation has not said hello yet: what the server sends them
    # meanwhile was meant for the dead one (a sync round it was part of, say) and is dropped, as the
    # sim does; the new incarnation's hello gets the current parameters
    unheard: set[str] = set()
    t_run = None  # when every worker had said hello: the kill schedule's zero
    # the answers to the first hellos, held until every worker has said hello: the workers start
    # together, so none trains alone while another process is still importing (which would also let
    # a short run end before the kill schedule's clock had started)
    held: list[Message] = []
    turn = 0  # whose queue is served first, rotating
    for i in range(len(rt.worker_names)):
        spawn(i)
    status = "completed"
    last_check = time.perf_counter()
    try:
        while not rt.done() and status == "completed":
            wait_s = POLL_S
            if kills and t_run is not None:
                wait_s = max(0.0, min(POLL_S, t_run + kills[0][0] - time.perf_counter()))
            turn += 1
            kind, name, body = _next_item(outboxes, wait_s, turn)
            now = time.perf_counter()
            if kind == "error":
                last_heard[name] = now
                if failed(name, f"raised an exception:\n{body}"):
                    status = "worker_failed"
            elif kind is not None:
                last_heard[name] = now
                msgs: list[Message] = body.messages if kind == "work" else body
                if kind == "work":
                    rt.record_work(name, body, now - t0)
                else:
                    unheard.discard(name)
                    if t_run is None:
                        greeted.add(name)
                        t_run = now if len(greeted) == len(rt.worker_names) else None
                for msg in msgs:
                    for _ in range(duplicator.copies(msg, now - t0)):
                        for reply in rt.deliver(msg, now - t0):
                            if reply.dst in unheard:
                                rt.ledger.record_fault("undeliverable", now - t0, reply.src, reply.dst, reply.seq,
                                                       reply.nbytes, f"{reply.kind} to a killed incarnation")
                            elif t_run is None:
                                held.append(reply)
                            else:
                                post(reply)
                if t_run is not None and held:
                    for reply in held:
                        post(reply)
                    held.clear()
            while kills and t_run is not None and t_run + kills[0][0] <= now and status == "completed" \
                    and not rt.done():
                at_s, victim = kills.pop(0)
                if kill(victim, at_s):
                    status = "worker_failed"
            if now - last_check < POLL_S:
                continue
            last_check = now  # liveness, checked on the clock whether or not others keep talking
            for name, p in list(procs.items()):
                owes = last_sent[name] > last_heard[name]
                silent = owes and now - last_sent[name] > cfg.backend.reply_timeout_s
                if not p.is_alive() or silent:
                    why = f"process exited with code {p.exitcode}" if not p.is_alive() else "silent too long"
                    if failed(name, why):
                        status = "worker_failed"
                        break
    finally:
        for name in rt.worker_names:
            inboxes[name].put(STOP)
        for p in procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return rt.finish(time.perf_counter() - t0, virtual=False, status=status)


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
