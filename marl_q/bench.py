"""`marlq bench runtime` and `marlq bench load`: how fast the runtime moves work and messages.

runtime: env-steps/s of A2C against Stable-Baselines3 in the same run; the server's accepted
pushes/s in-process; updates/s and env-steps/s of CartPole A3C on sim, local and ray with 1, 2 and
4 workers; and each backend's per-message overhead, measured with `push_flood`, a worker without an
environment (pushes/s with 32 pushes in flight, and the round trip of one push at a time).
load: N push_flood workers pushing as fast as they can for S seconds; per worker, the pushes it
sent must equal accepted + rejected + dropped_stale in the ledger, and the server process's RSS is
sampled over time. Timings are printed, never asserted (tests don't time things).
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from marl_q.messages import HELLO, SERVER, Message
from marl_q.ledger import LedgerAudit, ledger_audit
from marl_q.protocol import Algorithm, Context, MessageSpec, Outcome, Service, Work, Worker
from marl_q.registry import ALGORITHMS


def a2c_config(steps: int, envs: int = 8) -> dict[str, Any]:
    """SB3's A2C defaults with 8 CartPole envs and MLP 64-64 heads, on one sim worker."""
    return {
        "run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
        "backend": {"name": "sim", "workers": 1},
        "scenario": {"name": "cartpole", "num_envs": envs},
        "algorithm": {"name": "a2c", "n_steps": 5, "lr": 7e-4},
        "actor": {"head": "mlp", "hidden": [64, 64], "out_gain": 0.01},
        "critic": {"head": "mlp", "hidden": [64, 64]},
        "server": {"aggregation": "sync"},
    }


def bench_marlq_a2c(steps: int) -> float:
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    cfg = build_config(a2c_config(steps))
    t0 = time.perf_counter()
    summary = run_experiment(cfg, None)
    return summary["env_steps"] / (time.perf_counter() - t0)


def bench_sb3_a2c(steps: int) -> Optional[float]:
    try:
        from stable_baselines3 import A2C
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None
    env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
    model = A2C("MlpPolicy", env, seed=0, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    return steps / (time.perf_counter() - t0)


def bench_server_pushes(n_params: int, pushes: int, optimizer: str) -> float:
    """Accepted pushes per second of an n-parameter gradient, in-process (hogwild, admission on)."""
    from marl_q.aggregation import Hogwild
    from marl_q.config import ServerConfig
    from marl_q.ledger import Ledger
    from marl_q.server import Server
    from marl_q.services import ParameterService
    import marl_q.staleness  # noqa: F401  (registers the rules)

    rng = np.random.default_rng(0)
    from marl_q.optim import FlatRMSprop, FlatSGD

    make = {"rmsprop": lambda p: FlatRMSprop(p, lr=1e-4, alpha=0.99, eps=1e-5),
            "sgd": lambda p: FlatSGD(p, lr=1e-4)}[optimizer]
    service = ParameterService(rng.standard_normal(n_params).astype(np.float32), "grad",
                               Hogwild(("w0",), 1), make_optimizer=make)
    server = Server(service, ["w0"], ServerConfig(), Ledger(None))
    grads = [rng.standard_normal(n_params).astype(np.float32) for _ in range(8)]
    server.receive(Message("w0", SERVER, HELLO), 0.0)
    for i in range(50):  # warm-up: first calls pay one-off import and allocation costs
        server.receive(Message("w0", SERVER, "grad", {"grad": grads[0]}, base_version=server.version), 0.0)
    pushes_before = service.updates()
    t0 = time.perf_counter()
    for i in range(pushes):
        server.receive(Message("w0", SERVER, "grad", {"grad": grads[i % 8]}, base_version=server.version, seq=i), 0.0)
    elapsed = time.perf_counter() - t0
    assert server.ledger.rejected == 0 and service.updates() - pushes_before == pushes
    return pushes / elapsed


# ----------------------------------------------------------------------------- push_flood: no environment
@dataclass
class PushFloodConfig:
    """push_flood (benchmarks only): each worker pushes `size` float32 values as fast as it may."""

    size: int = 1024  # float32 values per push (4 KiB)
    window: int = 32  # pushes a worker may have unanswered; 1 = one round trip per push
    seconds: float = 10.0  # each worker pushes for this long, then reports its counts as one episode
    bad_every: int = 0  # every n-th push carries a NaN, which admission rejects; 0 = never

    def validate(self) -> None:
        for key in ("size", "window"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1, got {getattr(self, key)}")
        if self.seconds <= 0:
            raise ValueError(f"seconds: must be positive, got {self.seconds}")
        if self.bad_every < 0:
            raise ValueError(f"bad_every: must be >= 0, got {self.bad_every}")


PUSH, ACK, WELCOME = "push", "ack", "welcome"


class PushFloodWorker(Worker):
    """Pushes a fixed array with a sequence number; waits only when `window` pushes are unanswered.

    After `seconds` it stops pushing, waits until every push has been answered (so each one has
    been through the server, on every backend), and then reports its counts as one episode."""

    def __init__(self, cfg: Any, index: int) -> None:
        self.p: PushFloodConfig = cfg.algorithm.params
        self.name = f"w{index}"
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

    def __init__(self, size: int) -> None:
        self.specs = {PUSH: MessageSpec({"x": ((size,), "float32")})}
        self.params = np.zeros(size, dtype=np.float32)
        self.applied = 0
        self.memory = MemorySampler()

    def hello(self, worker: str, version: int) -> list[Message]:
        self.memory.sample()
        return [Message(SERVER, worker, WELCOME, base_version=version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        self.params += 1e-6 * msg.payload["x"]
        self.applied += 1
        self.memory.sample()
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
        return {"server_rss": self.memory.series, "server_peak_rss_kb": self.memory.peak_kb()}


@ALGORITHMS.register("push_flood", config=PushFloodConfig,
                     help="benchmarks only: workers without an environment push arrays as fast as they may")
class PushFlood(Algorithm):
    metric_fields = ["sent", "bad_sent", "seconds"]

    def make_service(self) -> Service:
        return PushFloodService(self.cfg.algorithm.size)

    def make_worker(self, index: int) -> Worker:
        return PushFloodWorker(self.cfg, index)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {"sent": {r["worker"]: r["sent"] for r in metrics},
                "push_seconds": {r["worker"]: r["seconds"] for r in metrics}}


def proc_status_kb(field_name: str) -> Optional[int]:
    """A kB field of /proc/self/status (VmRSS: resident now, VmHWM: peak resident); None off Linux."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class MemorySampler:
    """(seconds, VmRSS kB) of this process, at most every `every_s` seconds."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self.t0 = time.perf_counter()
        self.next = 0.0
        self.series: list[tuple[float, int]] = []

    def sample(self, force: bool = False) -> None:
        t = time.perf_counter() - self.t0
        if force or t >= self.next:
            self.next = t + self.every_s
            kb = proc_status_kb("VmRSS")
            if kb is not None:
                self.series.append((round(t, 3), kb))

    def peak_kb(self) -> Optional[int]:
        return proc_status_kb("VmHWM")


# ----------------------------------------------------------------------------- backends compared
BACKEND_NAMES = ("sim", "local", "ray")


def a3c_config(backend: str, workers: int, steps: int) -> dict[str, Any]:
    """CartPole A3C as in scenarios/cartpole_a3c.yaml, for a fixed number of env steps."""
    return {
        "run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
        "backend": {"name": backend, "workers": workers, "ray": {"num_cpus_per_worker": 0.5}},
        "scenario": {"name": "cartpole", "num_envs": 8},
        "algorithm": {"name": "a3c", "n_steps": 5, "lr": 2e-3, "reward_scale": 0.1},
        "actor": {"head": "mlp", "hidden": [64, 64], "out_gain": 0.01},
        "critic": {"head": "mlp", "hidden": [64, 64]},
        "server": {"aggregation": "hogwild"},
    }


def flood_config(backend: str, workers: int, seconds: float, window: int = 32, size: int = 1024,
                 max_staleness: Optional[int] = None, bad_every: int = 0) -> dict[str, Any]:
    """push_flood workers; the run ends when every worker has reported its count."""
    return {
        "run": {"seed": 0, "total_episodes": workers, "progress": False, "plots": False},
        "backend": {"name": backend, "workers": workers, "ray": {"num_cpus_per_worker": 0.25}},
        "scenario": {"name": "cartpole"},  # not used by push_flood; a config names one
        "algorithm": {"name": "push_flood", "size": size, "window": window, "seconds": seconds,
                      "bad_every": bad_every},
        "server": {"aggregation": "hogwild", "max_staleness": max_staleness},
    }


def _run_in_tmp(raw: dict[str, Any], keep: Optional[Path] = None) -> tuple[dict[str, Any], Path, Optional[str]]:
    """Run a raw config into ``keep`` or a temporary directory; returns (summary, run dir, tmp to delete)."""
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    tmp = None
    if keep is None:
        tmp = tempfile.mkdtemp(prefix="marlq-bench-")
        keep = Path(tmp) / "run"
    summary = run_experiment(build_config(raw), keep, plots=False)
    return summary, keep, tmp


def _steady_rate(run_dir: Path, kind: str) -> tuple[int, float]:
    """(workers that pushed, accepted ``kind`` pushes per wall second once every one of them had pushed).

    Worker start-up (process spawn, imports) takes seconds and overlaps the first workers' training,
    so the rate is measured from the moment the last worker made its first push to the end."""
    walls: dict[str, float] = {}
    with open(run_dir / "comm_wall.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            walls[r["id"]] = float(r["wall_s"])
    pushes: list[tuple[float, str]] = []
    with open(run_dir / "comm.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["kind"] == kind and r["dst"] == SERVER and r["accepted"] == "1":
                pushes.append((walls[r["id"]], r["src"]))
    first: dict[str, float] = {}
    for t, src in pushes:
        first.setdefault(src, t)
    if not first:
        return 0, float("nan")
    t0 = max(first.values())
    times = [t for t, _ in pushes if t >= t0]
    if len(times) < 2 or times[-1] <= t0:
        return len(first), float("nan")
    return len(first), (len(times) - 1) / (times[-1] - t0)


def bench_backend_a3c(backend: str, workers: int, steps: int) -> dict[str, Any]:
    """Updates/s and env-steps/s of CartPole A3C, in the steady phase (start-up excluded)."""
    summary, run_dir, tmp = _run_in_tmp(a3c_config(backend, workers, steps))
    try:
        pushing, updates_per_s = _steady_rate(run_dir, "grad")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    per_update = summary["env_steps"] / max(1, summary["updates"])
    return {"backend": backend, "workers": workers, "pushing": pushing, "updates": summary["updates"],
            "updates_per_s": updates_per_s, "env_steps_per_s": updates_per_s * per_update,
            "wall_s": summary["wall_s"]}


def bench_overhead(backend: str, seconds: float, size: int) -> dict[str, Any]:
    """One push_flood worker: pushes/s with 32 in flight, and microseconds per round trip (1 in flight)."""
    out: dict[str, Any] = {"backend": backend, "payload_bytes": 4 * size}
    for window, key in ((32, "pushes_per_s"), (1, "round_trips_per_s")):
        summary, _, tmp = _run_in_tmp(flood_config(backend, 1, seconds, window=window, size=size))
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        out[key] = summary["sent"]["w0"] / max(summary["push_seconds"]["w0"], 1e-9)
    out["round_trip_us"] = 1e6 / out["round_trips_per_s"]
    return out


class _RayInstance:
    """One local Ray instance for every ray measurement of a benchmark (started once, shut down after)."""

    def __init__(self, backends: Sequence[str], workers: int) -> None:
        self.ray = None
        if "ray" in backends:
            from marl_q.backends.ray_backend import connect, import_ray
            from marl_q.config import build_config

            self.ray = import_ray()
            raw = flood_config("ray", workers, 1.0)
            raw["backend"]["ray"]["num_cpus_per_worker"] = 0.5
            self.started = connect(self.ray, build_config(raw))

    def close(self) -> None:
        if self.ray is not None and self.started:
            self.ray.shutdown()


def _backends(text: str) -> list[str]:
    from marl_q.errors import ConfigError

    names = [b.strip() for b in text.split(",") if b.strip()]
    for b in names:
        if b not in BACKEND_NAMES:
            raise ConfigError(f"--backend: unknown backend {b!r} (choices: {', '.join(BACKEND_NAMES)})")
    return names


def _print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{c:>16s}" for c in columns))
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            cells.append(f"{v:>16,.1f}" if isinstance(v, float) else f"{str(v):>16s}")
        print("  ".join(cells))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runtime speed: A2C vs Stable-Baselines3, server pushes/s, A3C on each backend, per-message overhead."""
    p = argparse.ArgumentParser(prog="marlq bench runtime", description=main.__doc__)
    p.add_argument("--parts", default="a2c,server,backends,overhead",
                   help="which measurements, comma-separated (a2c, server, backends, overhead)")
    p.add_argument("--steps", type=int, default=50_000, help="env steps per A2C measurement")
    p.add_argument("--pushes", type=int, default=20_000)
    p.add_argument("--params", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=2, help="best of N for the a2c and server measurements")
    p.add_argument("--backend", default="sim,local,ray", help="backends to compare (sim, local, ray)")
    p.add_argument("--workers", default="1,2,4", help="worker counts for the A3C measurement")
    p.add_argument("--backend-steps", type=int, default=20_000, help="env steps per A3C measurement")
    p.add_argument("--flood-seconds", type=float, default=3.0, help="seconds per overhead measurement")
    p.add_argument("--payload", type=int, default=1024, help="float32 values per push in the overhead test")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    backends = _backends(args.backend)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    torch.set_num_threads(1)
    rows: dict[str, Any] = {"threads": 1}
    sb3: list[Optional[float]] = [0.0]
    if "a2c" in parts:
        rows["steps"] = args.steps
        rows["marlq_a2c_steps_per_s"] = max(bench_marlq_a2c(args.steps) for _ in range(args.repeats))
        sb3 = [bench_sb3_a2c(args.steps) for _ in range(args.repeats)]
        rows["sb3_a2c_steps_per_s"] = None if sb3[0] is None else max(sb3)
        rows["a2c_ratio_vs_sb3"] = (None if sb3[0] is None
                                    else rows["marlq_a2c_steps_per_s"] / rows["sb3_a2c_steps_per_s"])
    if "server" in parts:
        for opt in ("rmsprop", "sgd"):
            rows[f"server_pushes_per_s_{opt}"] = max(bench_server_pushes(args.params, args.pushes, opt)
                                                     for _ in range(args.repeats))
        rows["server_params"] = args.params
    table: list[dict[str, Any]] = []
    overhead: list[dict[str, Any]] = []
    instance = _RayInstance(backends, max(workers))
    try:
        if "backends" in parts:
            table = [bench_backend_a3c(b, w, args.backend_steps) for b in backends for w in workers]
        if "overhead" in parts:
            overhead = [bench_overhead(b, args.flood_seconds, args.payload) for b in backends]
    finally:
        instance.close()
    rows["a3c_by_backend"] = table
    rows["overhead_by_backend"] = overhead
    if args.json:
        print(json.dumps(rows))
        return 0
    for k, v in rows.items():
        if not isinstance(v, list):
            print(f"{k:32s} {v if v is None or isinstance(v, int) else f'{v:,.1f}'}")
    if "a2c" in parts and sb3[0] is None:
        print("(stable-baselines3 not installed: pip install -e '.[bench]' for the peer measurement)")
    if table:
        _print_table(f"CartPole A3C, {args.backend_steps} env steps; rates once every worker had pushed "
                     "('pushing': workers that did)", table,
                     ["backend", "workers", "pushing", "updates_per_s", "env_steps_per_s", "wall_s"])
    if overhead:
        _print_table(f"per-message overhead: one push_flood worker, {4 * args.payload} B pushes, "
                     f"{args.flood_seconds:g} s each", overhead,
                     ["backend", "pushes_per_s", "round_trip_us"])
    return 0


# ----------------------------------------------------------------------------- load
def load_main(argv: Optional[Sequence[str]] = None) -> int:
    """Load test: N workers push as fast as they can; per-worker accounting and server memory over time."""
    p = argparse.ArgumentParser(prog="marlq bench load", description=load_main.__doc__)
    p.add_argument("--backend", default="local", help="one or more of sim, local, ray, comma-separated (run in turn)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0, help="how long each worker pushes")
    p.add_argument("--payload", type=int, default=1024, help="float32 values per push")
    p.add_argument("--window", type=int, default=32, help="unanswered pushes a worker may have")
    p.add_argument("--max-staleness", type=int, default=64, help="server.max_staleness (stale pushes are dropped)")
    p.add_argument("--bad-every", type=int, default=50, help="every n-th push carries a NaN (rejected); 0 = none")
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: temporary)")
    p.add_argument("--plot", type=Path, default=None, help="draw the server's RSS over time to this PNG")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    backends = _backends(args.backend)
    if args.workers < 1 or args.seconds <= 0:
        raise ConfigError(f"--workers must be >= 1 and --seconds > 0, got {args.workers} and {args.seconds}")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    torch.set_num_threads(1)
    results = []
    instance = _RayInstance(backends, args.workers)
    try:
        for backend in backends:
            raw = flood_config(backend, args.workers, args.seconds, window=args.window, size=args.payload,
                               max_staleness=args.max_staleness, bad_every=args.bad_every)
            keep = args.out / backend if args.out is not None else None
            summary, run_dir, tmp = _run_in_tmp(raw, keep)
            try:
                results.append(_load_result(backend, summary, ledger_audit(run_dir)))
            finally:
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)
    finally:
        instance.close()
    if args.plot is not None:
        plot_rss(results, args.plot, args)
    if args.json:
        print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}))
    else:
        for r in results:
            _print_load(r, args)
        if args.plot is not None:
            print(f"\nplot: {args.plot}")
    return 0 if all(r["accounted"] for r in results) else 1


def _load_result(backend: str, summary: dict[str, Any], audit: LedgerAudit) -> dict[str, Any]:
    per_worker = []
    for name in sorted(summary["sent"], key=lambda n: int(n[1:])):
        row = audit.worker(name)
        sent = int(summary["sent"][name])
        total = row["accepted"] + row["rejected"] + row["dropped_stale"]
        per_worker.append({"worker": name, "sent": sent, "accepted": row["accepted"], "rejected": row["rejected"],
                           "dropped_stale": row["dropped_stale"], "ok": sent == total,
                           "pushes_per_s": sent / max(summary["push_seconds"][name], 1e-9)})
    series = summary["server_rss"]
    mid = series[len(series) // 2] if series else (None, None)
    return {
        "backend": backend, "workers": per_worker, "accounted": all(w["ok"] for w in per_worker),
        "pushes_per_s": sum(w["pushes_per_s"] for w in per_worker),
        "rss_mb": {"start": series[0][1] / 1024 if series else None, "middle": mid[1] / 1024 if series else None,
                   "end": series[-1][1] / 1024 if series else None,
                   "peak_sampled": max(kb for _, kb in series) / 1024 if series else None,
                   "peak_vmhwm": summary["server_peak_rss_kb"] / 1024 if summary["server_peak_rss_kb"] else None},
        "rss_series": series, "ledger_messages": summary["messages"], "wall_s": summary["wall_s"],
    }


def _print_load(r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n{r['backend']}: {args.workers} push_flood workers x {args.seconds:g} s, {4 * args.payload} B pushes, "
          f"window {args.window}, max_staleness {args.max_staleness}, a NaN every {args.bad_every}")
    print(f"{'worker':>8s} {'sent':>10s} {'accepted':>10s} {'rejected':>10s} {'stale':>10s} {'pushes/s':>10s}  "
          "sent = accepted + rejected + stale")
    for w in r["workers"]:
        print(f"{w['worker']:>8s} {w['sent']:>10,d} {w['accepted']:>10,d} {w['rejected']:>10,d} "
              f"{w['dropped_stale']:>10,d} {w['pushes_per_s']:>10,.0f}  {'yes' if w['ok'] else 'NO'}")
    m = r["rss_mb"]
    print(f"all workers: {r['pushes_per_s']:,.0f} pushes/s; server RSS (MB): start {m['start']:.1f}, "
          f"middle {m['middle']:.1f}, end {m['end']:.1f}, peak sampled {m['peak_sampled']:.1f}, "
          f"peak (VmHWM) {m['peak_vmhwm']:.1f}")


def plot_rss(results: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r["rss_series"]:
            t, kb = (np.asarray(v, dtype=float) for v in zip(*r["rss_series"]))
            ax.plot(t - t[0], kb / 1024, label=f"{r['backend']} server process (one run)")
    ax.set_xlabel("time since the first worker said hello (s)")
    ax.set_ylabel("resident memory, VmRSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Server memory under load: {args.workers} workers pushing {4 * args.payload} B "
                 f"for {args.seconds:g} s", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


BENCHES = {"runtime": main, "load": load_main}
