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

The main process runs the one driver (marl_q/driver.py) over `LocalTransport`'s events; restarts are
the driver's RestartPolicy, the kill schedule its KillSchedule, duplicates its Duplicator.
"""
from __future__ import annotations

import multiprocessing as mp
from multiprocessing import connection as mp_connection
from multiprocessing import forkserver
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import Any, Iterator, Optional

from marl_q.config import ExperimentConfig
from marl_q.driver import Arrived, Driver, Event, Failed, Started, Stepped, Tick, cpu_cores, load_average
from marl_q.errors import ConfigError
from marl_q.messages import Message, stamp_life
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime

STOP = "stop"
POLL_S = 0.5
MAX_WORKERS_PER_CORE = 4  # beyond this, local refuses unless backend.oversubscribe
STOP_GRACE_S = 5.0  # how long stopping workers may take before they are terminated


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


# What the fork server imports once (multiprocessing's "forkserver" start method): each worker process is then
# forked from it with torch and the config already imported, instead of a fresh interpreter importing them
# again (about a second of CPU per worker start and restart). The server is a fresh interpreter too, so no
# thread of the main process (JAX's, a tracker's) is ever forked. Besides: the plugin index (_fork_preload),
# every scenario module (``import scenarios`` imports them all, and every config's checks do) and the
# actor-critic learners of most runs: a CartPole A3C worker then builds in 0.1 CPU-s instead of 0.8 (the
# server pays 0.7 once). Not torch._dynamo, which a torch.optim optimizer imports when it is built or steps (1-2
# CPU-s): the workers step marl_q.optim's flat optimizers, which do not, and only COMA's learner (on the server)
# builds torch.optim ones (docs/performance.md).
PRELOAD = ["torch", "numpy", "marl_q.config", "marl_q.registry", "marl_q.backends.local", "marl_q.backends._fork_preload",
           "scenarios", "agents.actor_critic"]


def _worker_main(cfg_dict: dict, index: int, inbox: Any, outbox: Any, incarnation: int = 0,
                 environ: Optional[dict] = None) -> None:
    """Entry point of a worker process. ``environ``: the main process's environment when it started this
    worker (the fork server's was taken when the server started)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the main process only (see _sigint_ignored)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)

    import torch

    from marl_q.config import build_config
    from marl_q.registry import algorithm_class

    cfg = build_config(cfg_dict)
    torch.set_num_threads(cfg.backend.threads_per_worker)
    worker = algorithm_class(cfg)(cfg).make_worker(index)
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
    return LocalTransport(rt).run()


run_local.preflight = check_overload  # type: ignore[attr-defined]  # before the run directory is made


class LocalTransport:
    """The worker processes and their queues, as a transport of the one driver (marl_q/driver.py).

    Each turn takes one item from a worker (its hello, its step's work, or the error it raised) and
    yields it as events (the driver routes what the server answers back through ``send``), then a
    Tick (the driver runs the kills that are due), then checks that every worker process is alive and
    not silent too long. The driver's restart policy decides what a failure means; a restart
    replaces the worker's process and queues (``restart``).
    """

    safe_points = False  # the server's state is whole after every message: checkpoints are taken there

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cfg = rt.cfg
        self.names = rt.worker_names
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)  # taken when the server starts (the first run's first worker)
        with _sigint_ignored():  # the server, and every process forked from it, starts with SIGINT ignored
            forkserver.ensure_running()  # returns at once; the server imports PRELOAD before its first fork
        self.cfg_dict = self.cfg.to_dict()
        # One queue each way per worker, replaced when the worker is restarted: a process killed while
        # its queue's feeder thread held the queue's lock would otherwise block every other writer.
        self.outboxes: dict[str, Any] = {}
        self.inboxes: dict[str, Any] = {}
        self.procs: dict[str, Any] = {}
        self.incarnation = {name: 0 for name in self.names}
        self.t0 = time.perf_counter()
        self.last_heard = {name: self.t0 for name in self.names}
        # when we last sent it something; a worker that spoke after our last reply may be blocked on us
        # (a sync barrier), so only one that owes us an answer can be "silent too long"
        self.last_sent = {name: self.t0 for name in self.names}
        self.greeted: set[str] = set()  # workers whose first hello arrived
        # restarted workers whose new incarnation has not said hello yet: what the server sends them
        # meanwhile was meant for the dead one (a sync round it was part of, say) and is dropped, as the
        # sim does; the new incarnation's hello gets the current parameters
        self.unheard: set[str] = set()
        self.t_run: Optional[float] = None  # when every worker had said hello
        # the answers to the first hellos, held until every worker has said hello: the workers start
        # together, so none trains alone while another process is still importing (which would also let
        # a short run end before the kill schedule's clock had started)
        self.held: list[Message] = []
        self.turns = 0  # whose queue is served first, rotating
        self.last_check = self.t0
        # a fresh process that has not said hello: when it was started (its hello is due within hello_s;
        # start-up takes longer when workers outnumber cores, so the limit grows with workers per core)
        self.starting: dict[str, float] = {}
        self.hello_s = self.cfg.backend.hello_timeout_s * max(1.0, len(self.names) / cpu_cores())
        self.interrupts = 0  # Ctrl-C presses seen by the main loop's handler
        self.driver = Driver(rt, self, duplicate=True)

    def run(self) -> dict:
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self.on_interrupt) if main else None
        try:
            try:
                self.driver.run()
            finally:
                self.stop_workers(grace_s=1.0 if self.interrupts else STOP_GRACE_S)
            # between turns the server's state is whole: an interrupted run keeps what it learned in a
            # checkpoint, so that `marlq resume` can continue it (nothing learned: nothing to resume)
            if self.interrupts:
                self.driver.interrupt()
            status = self.driver.status
            learned = self.rt.service.updates() > 0
            return self.rt.finish(time.perf_counter() - self.t0, virtual=False, status=status,
                                  checkpoint=status != "interrupted" or learned)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def on_interrupt(self, signum: int, frame: Any) -> None:
        """Ctrl-C: the main loop stops at its next turn (within POLL_S); a second Ctrl-C stops at once."""
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt

    # ------------------------------------------------------------------------- the events
    def start(self, driver: Driver) -> Iterator[Event]:
        for i in range(len(self.names)):
            if self.interrupts:
                break
            self.spawn(i)
        self.last_check = time.perf_counter()
        return iter(())

    def more(self, driver: Driver) -> bool:
        return not self.interrupts

    def turn(self, driver: Driver) -> Iterator[Event]:
        """The next item of any worker (waiting at most until the next kill or poll), a Tick, and on the
        clock the liveness of every worker."""
        self.turns += 1
        kind, name, body = _next_item(self.outboxes, driver.wait_s(time.perf_counter(), POLL_S), self.turns)
        now = time.perf_counter()
        if kind is not None:
            self.last_heard[name] = now
            yield from self.receive(kind, name, body, now)
        yield Tick(now)
        if now - self.last_check >= POLL_S and not driver.done():
            self.last_check = now  # liveness, checked on the clock whether or not others keep talking
            yield from self.check_liveness(now, driver)

    def receive(self, kind: str, name: str, body: Any, now: float) -> Iterator[Event]:
        """A worker's hello ("msgs"), step ("work") or exception ("error") as events."""
        if kind == "error":
            yield Failed(name, f"raised an exception:\n{body}")
            return
        t = now - self.t0
        if kind == "work":
            yield Stepped(name, body, t)
            msgs: list[Message] = body.messages
        else:
            msgs = body
            if self.said_hello(name, now):
                yield Started(now)
        for msg in msgs:
            yield Arrived(msg, t)
        if self.t_run is not None and self.held:
            for reply in self.held:
                self.post(reply)
            self.held.clear()

    def said_hello(self, name: str, now: float) -> bool:
        """True if every worker has now said hello."""
        self.unheard.discard(name)
        self.starting.pop(name, None)
        if self.t_run is None:
            self.greeted.add(name)
            self.t_run = now if len(self.greeted) == len(self.names) else None
            return self.t_run is not None
        return False

    def check_liveness(self, now: float, driver: Driver) -> Iterator[Event]:
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
            yield Failed(name, why)
            if driver.done():
                return

    # ------------------------------------------------------------------------- what the driver calls
    def send(self, reply: Message, t: float) -> None:
        """An answer of the server: dropped if meant for a dead incarnation, held until every worker
        has said hello, posted otherwise."""
        if reply.dst in self.unheard:
            self.rt.ledger.record_message_fault("undeliverable", t, reply, f"{reply.kind} to a killed incarnation")
        elif self.t_run is None:
            self.held.append(reply)
        else:
            self.post(reply)

    def post(self, reply: Message) -> None:
        self.inboxes[reply.dst].put(reply)
        self.last_sent[reply.dst] = time.perf_counter()

    def record_fault(self, kind: str, name: str, detail: str) -> None:
        self.rt.record_fault(kind, name, detail, time.perf_counter() - self.t0)

    def kill(self, name: str, at_s: float) -> str:
        """Kill a worker's process as scheduled; its failure's detail."""
        p = self.procs[name]
        self.rt.ledger.record_fault("kill", time.perf_counter() - self.t0, name, name,
                                    detail=f"SIGKILL to pid {p.pid}, scheduled at {at_s} s after the start")
        p.kill()
        p.join(timeout=5)
        return f"killed by backend.kill at {at_s} s (SIGKILL)"

    def restart(self, name: str) -> None:
        """A fresh process for a failed worker, with fresh queues; it says hello."""
        p = self.procs[name]
        if p.is_alive():
            p.terminate()
        p.join(timeout=5)
        for q in (self.inboxes[name], self.outboxes[name]):
            q.cancel_join_thread()  # what is still in them is dropped; the restarted worker says hello
            q.close()
        self.incarnation[name] += 1
        self.spawn(self.names.index(name))
        self.unheard.add(name)
        self.held[:] = [r for r in self.held if r.dst != name]  # its answer died with it; its successor says hello

    # ------------------------------------------------------------------------- the worker processes
    def spawn(self, i: int) -> None:
        name = self.names[i]
        self.inboxes[name], self.outboxes[name] = self.ctx.Queue(), self.ctx.Queue()
        p = self.ctx.Process(target=_worker_main, daemon=True,
                             args=(self.cfg_dict, i, self.inboxes[name], self.outboxes[name], self.incarnation[name],
                                   dict(os.environ)))
        # Not inside _sigint_ignored: the first start waits for the fork server's imports (a second or two),
        # and a Ctrl-C then must still reach this process. The worker ignores SIGINT from its first
        # instruction (the server's disposition) and again in _worker_main.
        p.start()
        self.procs[name] = p
        self.last_sent[name] = time.perf_counter()  # a fresh process owes us its hello
        self.last_heard[name] = self.last_sent[name] - 1e-9
        self.starting[name] = self.last_sent[name]

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
