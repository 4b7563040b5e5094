"""`ray`: the server and every worker as Ray actors, on a local Ray instance or an existing cluster.

The server actor hosts the Runtime (admission, service, ledger, checkpoints and run-dir files) and is
pinned to the driver's node by default, so the run directory is written where `marlq run` was started
(``backend.server_placement``: the head or a labelled node instead; the run directory must then be shared
storage). Worker actors go where ``backend.placement`` says (Placer: spread, pack, a label, or Ray's own
choice); ``placement.csv`` records where each actor ran. A lost worker node is a RayActorError of each of
its workers, restarted by the policy below on the nodes that remain; a lost server (its node gone) ends
the run with RunLost, one line naming the last good checkpoint to resume from. Each
worker actor rebuilds its Worker from the resolved config dict (as local.py's worker processes do)
and is truly asynchronous: it submits its step's messages to the server actor without blocking,
collects replies as they complete (``ray.wait`` with timeout 0) and blocks only when
``worker.ready()`` is False (or when ``backend.ray.max_in_flight`` steps' work is unanswered). An
actor call costs far more than handling a message, so a worker has at most CALLS_IN_FLIGHT calls
outstanding and batches the steps it takes meanwhile into its next call; the server applies a
batch's messages one by one, in order, exactly as if each had come alone (the ledger cannot tell).

Replies go through per-worker mailboxes on the server: a push returns the pusher's mail, and a
blocked worker with nothing in flight long-polls for it (a sync barrier's reply can be caused by
another worker's push). Every push carries its worker's incarnation and a call number; the server
applies each worker's calls in call order (an async actor may start them out of order) and drops
calls from an incarnation that was replaced (a `fault:orphaned` ledger row).

A worker actor that dies (RayActorError), or whose step raises, is restarted from the server's
current parameters as the one driver's RestartPolicy says (backend.max_restarts, as on local), each
a fault in the summary. `backend.kill` kills worker actors with ``ray.kill`` at scheduled wall times
(a `fault:kill` row); `backend.faults.duplicate` hands messages to the server twice (a
`fault:duplicate` row).

Both loops are the one driver (marl_q/driver.py): the server actor hands each call's hello and work
to its Driver as events (its mailboxes are the transport), and the driver process runs a Driver over
`RayTransport`, whose events are the worker actors' lifecycle (every worker started, one ended).

Ray is imported only when this backend runs, so `import marl_q` works without it.
"""
from __future__ import annotations

import copy
import math
import os
import socket
import sys
import threading
import time
import traceback
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from marl_q.config import SERVER_PLACEMENTS, WORKER_PLACEMENTS
from marl_q.driver import Arrived, Driver, Event, Failed, Started, Stepped, Tick
from marl_q.errors import RAY_MISSING, ConfigError, RunLost, import_extra
from marl_q.messages import Message, stamp_life
from marl_q.progress import RunProgress
from marl_q.registry import BACKENDS
from marl_q.runtime import Runtime

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

POLL_S = 0.5  # the driver's loop: kills, liveness, progress
MAIL_WAIT_S = 1.0  # a blocked worker's long poll for mail
POLL_EVERY_S = 0.001  # how often a worker that can go on looks for completed calls
CALLS_IN_FLIGHT = 2  # a worker's submit calls outstanding; what it produces meanwhile waits for the next one
LABEL_SHARE = 0.001  # what an actor placed by a custom resource label asks of it (a node with 1 takes 1000)
HEAD_RESOURCE = "node:__internal_head__"  # Ray's resource of the head node


def import_ray() -> Any:
    """The ray module, or a ConfigError saying how to install it."""
    return import_extra("ray", RAY_MISSING)


@BACKENDS.register("ray", help="server and workers as Ray actors, local instance or backend.ray.address")
def run_ray(rt: Runtime) -> dict:
    with ray_instance(rt.cfg) as ray:
        return _drive(ray, rt)


@contextmanager
def ray_instance(cfg: ExperimentConfig) -> Iterator[Any]:
    """The ray module, connected as ``cfg`` says (see connect) for the ``with`` block.

    An instance this started is shut down at the end; one already running (a test's, a notebook's, an
    outer ``ray_instance`` shared by several runs in a row) is left as it was."""
    ray = import_ray()
    started = connect(ray, cfg)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


# ----------------------------------------------------------------------------- connecting
def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` or ``ray://host:port``; a ConfigError otherwise."""
    text = address.strip()
    for prefix in ("ray://", "tcp://"):
        text = text.removeprefix(prefix)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"backend.ray.address: expected host:port (e.g. 127.0.0.1:6379, what `ray start --head` "
                          f"prints), got {address!r}")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float) -> None:
    """Refuse an address that does not answer like a Ray head within ``timeout_s`` seconds.

    First a TCP connection, then the HTTP/2 handshake every gRPC server (Ray's GCS is one) answers
    with a SETTINGS frame: a closed port, a wrong host or a port that holds something else gives a
    ConfigError in bounded time instead of ray.init retrying for minutes.
    """
    host, port = parse_address(address)
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            head = sock.recv(9)
    except TimeoutError:
        raise ConfigError(f"backend.ray.address: {host}:{port} did not answer within {timeout_s:g} s "
                          "(backend.ray.connect_timeout_s); is a Ray head running there (`ray start --head`)?") from None
    except OSError as exc:
        raise ConfigError(f"backend.ray.address: cannot reach {host}:{port} ({exc.strerror or exc}); start a head "
                          "with `ray start --head` and use the address it prints") from None
    if len(head) < 9 or head[3] != 0x04:
        raise ConfigError(f"backend.ray.address: {host}:{port} answers, but not like a Ray head (no gRPC handshake); "
                          "use the address `ray start --head` prints (its GCS port, 6379 by default)")


PROBE = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=True, logging_level="ERROR")
print("cpus", ray.cluster_resources().get("CPU", 0))
"""


AUTH_ERROR = "InvalidAuthToken"
AUTH_HINT = ("run with RAY_AUTH_MODE=token in the environment and the head's token in ~/.ray/auth_token "
             "or RAY_AUTH_TOKEN")


def probe_cluster(address: str, timeout_s: float) -> None:
    """Join ``address`` from a throwaway process: ray.init retries for minutes against something that
    answers but is not a Ray head (a proxy, another gRPC server), and that child can be killed.

    A head that refuses the token (Ray logs ``InvalidAuthToken`` at its first refused call, then retries the
    same token for tens of seconds) is refused at that first line: no retry with the same token can pass."""
    import signal
    import subprocess

    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-c", PROBE, address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    err: list[str] = []
    settled = threading.Event()  # the probe refused the token, or closed its stderr (it ended)

    def read_err() -> None:
        for line in proc.stderr:
            err.append(line)
            if AUTH_ERROR in line:
                break
        settled.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    ended = settled.wait(timeout_s) and AUTH_ERROR not in "".join(err)
    if ended:
        try:
            proc.wait(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            ended = False
    if not ended:  # refused, or still trying at the deadline
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out = proc.stdout.read()
    proc.stdout.close()
    reader.join()
    proc.stderr.close()
    text = "".join(err)
    if AUTH_ERROR in text:
        raise ConfigError(f"backend.ray.address: the Ray head at {address} wants an authentication token; "
                          f"{AUTH_HINT}") from None
    if not ended:
        raise ConfigError(f"backend.ray.address: no Ray cluster answered at {address} within {timeout_s:g} s "
                          "(backend.ray.connect_timeout_s); is a head running there (`ray start --head`)?") from None
    if proc.returncode != 0 or "cpus" not in out:
        raise ConfigError(f"backend.ray.address: could not join the Ray cluster at {address}: "
                          f"{(text.strip().splitlines() or ['no output'])[-1]}")


def connect(ray: Any, cfg: ExperimentConfig) -> bool:
    """Join backend.ray.address, or start a small local instance; True if this call did (and must shut down)."""
    rc = cfg.backend.ray
    if rc.address:  # before anything can wait on it: a wrong address is a user error in bounded time
        t_end = time.monotonic() + rc.connect_timeout_s
        check_reachable(rc.address, rc.connect_timeout_s)
        probe_cluster(rc.address, max(1.0, t_end - time.monotonic()))
    if ray.is_initialized():  # a caller (a test, a notebook) already chose the instance
        check_resources(ray, cfg)
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine unless asked
    common = {"log_to_driver": False, "configure_logging": True, "logging_level": "WARNING"}
    if rc.address:
        try:
            ray.init(address=rc.address, **common)
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            raise ConfigError(f"backend.ray.address: could not join the Ray cluster at {rc.address}: {exc}") from None
        check_resources(ray, cfg)
        return True
    workers = cfg.backend.workers
    # Ray lowers its worker processes' priority 15 nice levels below the driver's; here the workers are the
    # run, and on a busy machine they then got next to no CPU (a resumed run's 200 env steps took 150 s
    # beside two CPU-bound jobs): they run at the driver's priority, as local's worker processes do
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address="local",  # a new instance, never one a stale /tmp/ray/ray_current_cluster points at
             num_cpus=max(1, math.ceil(workers * rc.num_cpus_per_worker)),
             resources={k: v * workers for k, v in rc.resources.items()} or None,
             include_dashboard=rc.include_dashboard, dashboard_host="127.0.0.1",
             _node_ip_address="127.0.0.1", **common)
    return True


def check_resources(ray: Any, cfg: ExperimentConfig) -> None:
    """A cluster that cannot place every worker actor would leave the run waiting forever: refuse it."""
    rc = cfg.backend.ray
    have = ray.cluster_resources()
    need = {"CPU": cfg.backend.workers * rc.num_cpus_per_worker}
    need.update({k: cfg.backend.workers * v for k, v in rc.resources.items()})
    short = [f"{k}: {v:g} needed, {have.get(k, 0):g} in the cluster" for k, v in need.items() if v > have.get(k, 0)]
    if short:
        raise ConfigError(f"backend.ray: the cluster cannot place {cfg.backend.workers} worker actors "
                          f"({'; '.join(short)}); lower backend.ray.num_cpus_per_worker / resources or add nodes")
    for key, label in (("placement", cfg.backend.placement), ("server_placement", cfg.backend.server_placement)):
        if label not in WORKER_PLACEMENTS + SERVER_PLACEMENTS and have.get(label, 0) <= 0:
            raise ConfigError(f"backend.{key}: no node of the cluster has the resource {label!r}; start one with "
                              f"`ray start ... --resources='{{\"{label}\": 1}}'` or choose another placement")


# ----------------------------------------------------------------------------- the actors
class ServerHost:
    """The Runtime inside a Ray actor (async: a blocked worker's mail poll must not block the server).

    Methods without an ``await`` run whole, one at a time, on the actor's event loop, so the Runtime
    is never entered concurrently. It is the transport of its own Driver, which takes each call's
    hello and work as events; ``send`` puts the server's answers in the workers' mailboxes.
    """

    safe_points = False

    def __init__(self, cfg_dict: dict, out: Optional[str], runtime_cls: type, resume: Any = None) -> None:
        import asyncio

        import torch

        from marl_q.config import build_config

        cfg = build_config(cfg_dict)
        torch.set_num_threads(cfg.backend.threads_per_worker)
        kwargs = {"resume": resume} if resume is not None else {}
        self.rt = runtime_cls(cfg, Path(out) if out else None, **kwargs)
        self.t0 = time.perf_counter()
        self.driver = Driver(self.rt, self, duplicate=True)
        names = self.rt.worker_names
        self.life = {n: 0 for n in names}  # incarnation the server currently serves
        self.expected = {n: 0 for n in names}  # next call number of that incarnation
        self.held: dict[str, dict[int, list]] = {n: {} for n in names}  # calls that arrived early
        self.mail: dict[str, list[Message]] = {n: [] for n in names}
        self.has_mail = {n: asyncio.Event() for n in names}
        self.finished = asyncio.Event()
        self.greeted: set[str] = set()
        self.started = asyncio.Event()  # every worker has said hello: the kill schedule's zero
        self.closed = False
        self.error: Optional[BaseException] = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def stopping(self) -> bool:
        return self.closed or self.error is not None or self.rt.done()

    def _take(self, name: str) -> tuple[bool, list[Message]]:
        out, self.mail[name] = self.mail[name], []
        self.has_mail[name].clear()
        return self.stopping(), out

    def _wake_all(self) -> None:
        self.finished.set()
        for event in self.has_mail.values():
            event.set()

    async def submit(self, name: str, life: int, n: int, items: list[tuple[str, Any]]) -> tuple[bool, list[Message]]:
        """A worker's call number ``n``: a batch of ("hello", messages) and ("work", Work) items, applied one by
        one in order, each message as if it had come alone. Returns (stop, its mail)."""
        if life != self.life[name]:
            for kind, body in items:
                for m in (body.messages if kind == "work" else body):
                    self.rt.ledger.record_message_fault("orphaned", self.now(), m,
                                                        f"{m.kind} from incarnation {life} of {name}, which was replaced")
            return True, []
        self.held[name][n] = items
        while self.expected[name] in self.held[name] and not self.stopping():
            batch = self.held[name].pop(self.expected[name])
            self.expected[name] += 1
            for kind, body in batch:
                if self.stopping():
                    break
                try:
                    self._apply(name, kind, body)
                except BaseException as exc:  # the run cannot go on; the driver re-raises it
                    self.error = exc
                    print(traceback.format_exc(), file=sys.stderr)
        if self.stopping():
            self._wake_all()
        return self._take(name)

    def _apply(self, name: str, kind: str, body: Any) -> None:
        t = self.now()
        if kind == "work":
            self.driver.handle(Stepped(name, body, t))
            msgs = body.messages
        else:
            msgs = body
            self.greeted.add(name)
            if len(self.greeted) == len(self.rt.worker_names):
                self.started.set()
        for msg in msgs:
            self.driver.handle(Arrived(msg, t))

    def send(self, reply: Message, t: float) -> None:
        """An answer of the server, to its worker's mailbox."""
        self.mail[reply.dst].append(reply)
        self.has_mail[reply.dst].set()

    async def wait_mail(self, name: str, life: int, timeout_s: float) -> tuple[bool, list[Message]]:
        """A blocked worker's long poll: its mail as soon as there is any, or nothing after ``timeout_s``."""
        import asyncio

        if life == self.life[name] and not self.mail[name] and not self.stopping():
            try:
                await asyncio.wait_for(self.has_mail[name].wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        if life != self.life[name]:
            return True, []
        return self._take(name)

    async def replaced(self, name: str) -> int:
        """The driver restarts ``name``: serve its next incarnation only."""
        self.life[name] += 1
        self.expected[name] = 0
        self.held[name].clear()
        self.mail[name] = []
        self.has_mail[name].set()  # a poll of the dead incarnation returns
        self.has_mail[name].clear()
        return self.life[name]

    async def fault(self, kind: str, name: str, detail: str, ledger_row: Optional[str] = None) -> None:
        """A fault in the summary, and optionally a ``fault:<ledger_row>`` ledger row."""
        if ledger_row:
            self.rt.ledger.record_fault(ledger_row, self.now(), name, name, detail=detail)
        if kind:
            self.rt.record_fault(kind, name, detail, self.now())

    async def where(self) -> str:
        """The id of the node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def wait_started(self) -> bool:
        await self.started.wait()
        return True

    async def wait_done(self) -> bool:
        """Returns once the run is done (budget, stop) or the server failed (re-raised here)."""
        if not self.stopping():
            await self.finished.wait()
        if self.error is not None:
            raise self.error
        return True

    async def stats(self) -> tuple[int, int, int]:
        return self.rt.env_steps, self.rt.episodes, self.rt.server.version

    async def finish(self, status: str) -> dict:
        self.closed = True
        self._wake_all()
        if status == "interrupted" and self.error is None:
            # the actor runs one call at a time, so its state is whole here: keep what was learned, so that
            # the interrupt's resume hint is true (nothing learned: no checkpoint, and the hint says so)
            return self.rt.finish(self.now(), virtual=False, status=status,
                                  checkpoint=self.rt.service.updates() > 0)
        if status in ("interrupted", "failed"):  # the state may be mid-update: keep the last periodic checkpoint
            return self.rt.finish(self.now(), virtual=False, status=status, checkpoint=False)
        return self.rt.finish(self.now(), virtual=False, status=status)


class WorkerHost:
    """One worker in a Ray actor, rebuilt from the resolved config dict."""

    def __init__(self, cfg_dict: dict, index: int, life: int, server: Any) -> None:
        import torch

        from marl_q.config import build_config
        from marl_q.registry import algorithm_class

        cfg = build_config(cfg_dict)
        torch.set_num_threads(cfg.backend.threads_per_worker)
        self.worker = algorithm_class(cfg)(cfg).make_worker(index)
        self.server, self.life = server, life
        self.crash_after = cfg.backend.crash_after_steps.get(index) if life == 0 else None
        self.max_in_flight = cfg.backend.ray.max_in_flight

    def where(self) -> str:
        """The id of the node this actor runs on (answered once the actor is up)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self) -> int:
        """Step, push, collect until the server says stop; returns the steps taken.

        What the worker's steps produce while CALLS_IN_FLIGHT calls are outstanding is batched into the next
        call (an actor call costs about a millisecond of Ray overhead, a message to the server far less); at
        most ``max_in_flight`` steps' work is sent or waiting to be sent and unanswered."""
        import ray

        w, name, calls = self.worker, self.worker.name, 0
        pending: dict[Any, int] = {}  # call ref -> items it carries (0: a mail poll)
        batch: list[tuple[str, Any]] = []

        def send() -> None:
            nonlocal calls, batch
            pending[self.server.submit.remote(name, self.life, calls, batch)] = len(batch)
            calls += 1
            batch = []

        def unanswered() -> int:
            return sum(pending.values()) + len(batch)

        batch.append(("hello", stamp_life(w.start(), f"{self.life}-{uuid.uuid4().hex[:12]}")))
        send()
        steps, next_poll = 0, 0.0
        try:
            while True:
                if pending:
                    can_act = (w.ready() and unanswered() < self.max_in_flight) or \
                        (batch and len(pending) < CALLS_IN_FLIGHT)
                    refs, done = list(pending), []
                    if not can_act:  # nothing to do until something comes back
                        done, _ = ray.wait(refs, num_returns=1)
                    elif time.perf_counter() >= next_poll:  # take what has completed, without waiting
                        next_poll = time.perf_counter() + POLL_EVERY_S  # (a poll costs as much as many steps)
                        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                    for ref in done:
                        del pending[ref]
                        stop, replies = ray.get(ref)
                        if stop:
                            return steps
                        for reply in replies:
                            w.deliver(reply)
                if w.ready() and unanswered() < self.max_in_flight:
                    work = w.step()
                    steps += 1
                    if self.crash_after is not None and steps >= self.crash_after:
                        os._exit(3)  # an abrupt death, like local's: the work not yet sent is lost
                    batch.append(("work", work))
                if batch and len(pending) < CALLS_IN_FLIGHT:
                    send()
                elif not pending and not batch and not w.ready():
                    pending[self.server.wait_mail.remote(name, self.life, MAIL_WAIT_S)] = 0
        finally:
            w.close()


# ----------------------------------------------------------------------------- the driver
def _drive(ray: Any, rt: Runtime) -> dict:
    return RayTransport(ray, rt).run()


class RayTransport:
    """The driver process of a ray run: starts the server actor and the worker actors, then runs the one
    driver over their lifecycle.

    Each turn waits for the first of: the run is done, every worker has said hello (a
    Started event: the kill schedule's zero), a worker actor's run() ended (told to stop; or died or
    raised: a Failed event, which the driver's restart policy turns into a restart or the run's end
    with "worker_failed"). Then a Tick (the driver runs the kills that are due) and the bar.
    """

    safe_points = False

    def __init__(self, ray: Any, rt: Runtime) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.cfg = ray, rt.cfg
        self.names = rt.worker_names
        rc = self.cfg.backend.ray
        self.actor_cfg = copy.deepcopy(self.cfg.to_dict())
        self.actor_cfg["run"]["progress"] = False  # the driver draws the bar; an actor's stderr goes to Ray's logs
        resume = rt.resume
        self.out = rt.retire()  # the server actor's Runtime owns the run directory from here on
        out = self.out
        where = self.cfg.backend.server_placement
        if where == "driver":  # the run directory is written where `marlq run` runs
            server_opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False)}
        else:  # elsewhere: the run directory must be storage that node and the driver's both see
            server_opts = {"resources": {HEAD_RESOURCE if where == "head" else where: LABEL_SHARE}}
        self.server = (ray.remote(ServerHost)
                       .options(num_cpus=0, max_restarts=0, **server_opts)
                       .remote(self.actor_cfg, str(out) if out else None, type(rt), resume))
        self.placer = Placer(ray, self.cfg)
        self.worker_cls = ray.remote(WorkerHost)
        self.worker_opts = {"num_cpus": rc.num_cpus_per_worker, "resources": self.placer.need_resources,
                            "max_restarts": 0}
        self.placements = PlacementLog(out, ray)
        self.where_refs: dict[Any, tuple[str, int]] = {self.server.where.remote(): ("server", 0)}  # -> (who, life)
        self.handles: dict[str, Any] = {}
        self.runs: dict[Any, str] = {}  # run() ref -> worker
        self.life = {n: 0 for n in self.names}
        self.killed: dict[str, float] = {}  # worker -> scheduled time of the kill that ended its current life
        self.bar = RunProgress(self.cfg, suffix=" (ray)") if self.cfg.run.progress else None
        self.next_bar = 0.0
        self.done_ref = self.server.wait_done.remote()
        self.started_ref = self.server.wait_started.remote()
        self.finished = False  # the server actor says the run is done
        self.driver = Driver(None, self, cfg=self.cfg, names=self.names)  # the messages: the server actor's driver

    def run(self) -> dict:
        from ray.exceptions import RayActorError

        try:
            status = self.driver.run()
            summary = self.ray.get(self.server.finish.remote(status))
        except RayActorError as exc:  # the server actor died (its node was lost): what it wrote is all there is
            raise RunLost(self.server_lost(exc)) from None
        except BaseException as exc:
            self.flush(exc)
            raise
        finally:
            self.close()
        return summary

    def server_lost(self, exc: BaseException) -> str:
        """The one line of a run whose server actor died: why, and the checkpoint a resume continues from."""
        from marl_q.rundir import latest_checkpoint
        from marl_q.runtime import one_line

        node = self.placements.server_node
        why = f"its node {node[:12]} was lost" if node and not self.placer.alive(node) else \
            f"it died ({one_line(str(exc))[:160]})"
        if self.out is None:
            return f"the server actor was lost: {why}; the run had no run directory, so nothing to resume"
        last = latest_checkpoint(self.out)
        if last is None:
            return (f"the server actor was lost: {why}; no checkpoint was written before it, so nothing to "
                    f"resume: run it again (set run.checkpoint_every)")
        return (f"the server actor was lost: {why}; the last good checkpoint is {last}: continue with "
                f"`marlq resume {self.out}` on the nodes that remain")

    # ------------------------------------------------------------------------- the events
    def start(self, driver: Driver) -> Iterator[Event]:
        for i in range(len(self.names)):
            self.spawn(i)
        return iter(())

    def more(self, driver: Driver) -> bool:
        return not self.finished

    def turn(self, driver: Driver) -> Iterator[Event]:
        """What is ready (waiting at most until the next kill or poll) as events, a Tick, the bar."""
        ready = self.wait(driver.wait_s(time.perf_counter(), POLL_S))
        self.placements.collect(self.where_refs)
        if self.done_ref in ready:
            self.ray.get(self.done_ref)  # raises what broke the server, if anything did
            self.finished = True
            return
        if self.started_ref is not None and self.started_ref in ready:
            ready.remove(self.started_ref)
            self.started_ref = None
            yield Started(time.perf_counter())
        yield from self.ended(ready, driver)
        yield Tick(time.perf_counter())
        self.show_progress()

    def wait(self, wait_s: float) -> list[Any]:
        """What is ready of: the run done, every worker started, the workers' run() calls."""
        waiting = [self.done_ref, *self.runs] + ([self.started_ref] if self.started_ref is not None else [])
        ready, _ = self.ray.wait(waiting, num_returns=1, timeout=wait_s)
        return ready

    def ended(self, ready: list[Any], driver: Driver) -> Iterator[Event]:
        """Worker actors whose run() ended: told to stop (the run is ending), or died or raised."""
        from ray.exceptions import RayActorError, RayTaskError

        for ref in ready:
            name = self.runs.pop(ref)
            try:
                self.ray.get(ref)
                continue  # it was told to stop: the run is ending
            except RayActorError:
                node = self.placer.nodes.get(name)
                detail = (f"killed by backend.kill at {self.killed.pop(name)} s (ray.kill)" if name in self.killed
                          else f"actor died: its node {node[:12]} was lost" if node and not self.placer.alive(node)
                          else "actor died (process exited or its node was lost)")
            except RayTaskError as exc:
                detail = f"raised an exception:\n{exc}"
            env_steps = self.ray.get(self.server.stats.remote())[0]  # the restart policy's measure of progress
            yield Failed(name, detail, steps=env_steps)
            if driver.done():
                return

    def show_progress(self) -> None:
        if self.bar is not None and time.perf_counter() >= self.next_bar:
            self.next_bar = time.perf_counter() + 1.0
            self.bar.show(*self.ray.get(self.server.stats.remote()))

    # ------------------------------------------------------------------------- what the driver calls
    def record_fault(self, kind: str, name: str, detail: str) -> None:
        self.ray.get(self.server.fault.remote(kind, name, detail))
        _say(kind, name, detail)

    def kill(self, name: str, at_s: float) -> None:
        """``ray.kill`` of a worker actor as scheduled; its run() ref fails next (a Failed event)."""
        self.ray.get(self.server.fault.remote(
            "", name, f"ray.kill of its actor, scheduled at {at_s} s after the start", "kill"))
        self.killed[name] = at_s
        self.ray.kill(self.handles[name], no_restart=True)
        return None

    def restart(self, name: str) -> None:
        """End the failed actor (a no-op if dead; a worker whose step raised is ended), have the server
        serve the next incarnation only, and start it."""
        self.ray.kill(self.handles[name], no_restart=True)
        self.life[name] = self.ray.get(self.server.replaced.remote(name))
        self.spawn(self.names.index(name))

    # ------------------------------------------------------------------------- the worker actors
    def spawn(self, i: int) -> None:
        """Start worker ``i``'s actor on the node backend.placement chooses (Ray's choice for `default`)."""
        name = self.names[i]
        strategy = self.placer.strategy(name)
        opts = self.worker_opts if strategy is None else {**self.worker_opts, "scheduling_strategy": strategy}
        self.handles[name] = self.worker_cls.options(**opts).remote(self.actor_cfg, i, self.life[name], self.server)
        # where() first: the actor runs its calls in order, and run() returns only at the end
        self.where_refs[self.handles[name].where.remote()] = (name, self.life[name])
        self.runs[self.handles[name].run.remote()] = name

    # ------------------------------------------------------------------------- the end
    def flush(self, exc: BaseException) -> None:
        """The run is failing with ``exc``: have the server actor write what it has (status interrupted or
        failed); what is raised, not the summary, decides the exit code."""
        ending = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        try:
            self.ray.get(self.server.finish.remote(ending), timeout=30)
        except Exception as flush_exc:  # never mask what is being raised
            print(f"marlq: the server actor could not flush the run files ({flush_exc})", file=sys.stderr)

    def close(self) -> None:
        self.placements.collect(self.where_refs)
        self.placements.close()
        if self.bar is not None:
            self.bar.close()
        for h in self.handles.values():
            self.ray.kill(h, no_restart=True)
        self.ray.kill(self.server, no_restart=True)


class Placer:
    """backend.placement: the node each worker actor goes to.

    `default` leaves it to Ray's scheduler. `spread` and `pack` choose among the live nodes that can still
    hold the worker's CPUs and resources next to this run's other workers there (the nodes' totals, from
    ``ray.nodes()``): `spread` the node with the fewest of this run's workers, `pack` the first that fits
    (nodes in id order). A custom resource label is `spread` over the nodes that have it, and each worker
    asks for LABEL_SHARE of it, so Ray too keeps it there. The affinity is soft: a node lost between
    the choice and the start leaves the worker to Ray's scheduler rather than failing it."""

    def __init__(self, ray: Any, cfg: ExperimentConfig) -> None:
        self.ray = ray
        self.mode = cfg.backend.placement
        rc = cfg.backend.ray
        self.need_resources = dict(rc.resources)
        if self.mode not in WORKER_PLACEMENTS:
            self.need_resources[self.mode] = LABEL_SHARE
        self.need = {"CPU": rc.num_cpus_per_worker, **self.need_resources}
        self.nodes: dict[str, str] = {}  # worker -> the node chosen for its current actor

    def live_nodes(self) -> dict[str, dict[str, float]]:
        """node id -> total resources of every live node, in id order."""
        return {n["NodeID"]: n["Resources"] for n in sorted(self.ray.nodes(), key=lambda n: n["NodeID"])
                if n["Alive"]}

    def alive(self, node: str) -> bool:
        try:
            return node in self.live_nodes()
        except Exception:  # the cluster cannot say: do not claim the node was lost
            return True

    def strategy(self, name: str) -> Any:
        """The scheduling strategy for ``name``'s next actor; None for Ray's own."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.nodes.pop(name, None)
        if self.mode == "default":
            return None
        live = self.live_nodes()
        count = {n: 0 for n in live}
        for node in self.nodes.values():
            if node in count:
                count[node] += 1
        fits = [n for n, total in live.items()
                if all(count[n] * v + v <= total.get(k, 0) + 1e-9 for k, v in self.need.items() if v > 0)
                and (self.mode in WORKER_PLACEMENTS or total.get(self.mode, 0) > 0)]
        if not fits:
            return None  # nowhere this run can see: Ray's scheduler places it when it can
        node = fits[0] if self.mode == "pack" else min(fits, key=lambda n: count[n])
        self.nodes[name] = node
        return NodeAffinitySchedulingStrategy(node_id=node, soft=True)


class PlacementLog:
    """``placement.csv`` in the run directory: the node each worker actor (and the server) really runs on,
    as each actor answers ``where()``; a row per actor: time, session, worker, life, node."""

    def __init__(self, out: Optional[Path], ray: Any) -> None:
        self.session = uuid.uuid4().hex[:8]
        self.t0 = time.perf_counter()
        self.server_node: Optional[str] = None
        self.fh = None
        if out is not None:
            path = Path(out) / "placement.csv"
            new = not path.exists()
            self.fh = open(path, "a", encoding="utf-8")
            if new:
                self.fh.write("t_s,session,worker,life,node\n")

    def row(self, worker: str, life: int, node: str) -> None:
        if self.fh is not None:
            self.fh.write(f"{time.perf_counter() - self.t0:.3f},{self.session},{worker},{life},{node}\n")
            self.fh.flush()

    def collect(self, refs: dict[Any, tuple[str, int]]) -> None:
        """The rows of the actors that have answered where they run (those that died first give none)."""
        import ray

        if not refs:
            return
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in done:
            worker, life = refs.pop(ref)
            try:
                node = ray.get(ref)
            except Exception:  # the actor died before it said where it was
                continue
            if worker == "server":
                self.server_node = node
            self.row(worker, life, node)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _say(kind: str, name: str, detail: str) -> None:
    from marl_q.runtime import one_line

    print(f"marlq: {kind} {name}: {one_line(detail)}", file=sys.stderr, flush=True)

