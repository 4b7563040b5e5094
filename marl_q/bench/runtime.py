"""`marlq bench runtime`: how fast the runtime moves work and messages.

env-steps/s of A2C against Stable-Baselines3 in the same run; the server's accepted pushes/s
in-process; updates/s and env-steps/s of CartPole A3C on sim, local and ray with 1, 2 and 4 workers;
and each backend's per-message overhead, measured with `push_flood`, a worker without an environment
(pushes/s with 32 pushes in flight, and the round trip of one push at a time). Timings are printed,
never asserted (tests don't time things).
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from marl_q.bench.runs import flood_config, parse_backends, print_table, run_config, shared_ray
from marl_q.messages import HELLO, SERVER, Message
from marl_q.protocol import worker_name

NOT_INSTALLED = "not installed (pip install -e '.[bench]')"  # the Stable-Baselines3 cells without it
RAY_PARTS = {"backends", "overhead"}  # the measurements that run backends (ray among them)


# ----------------------------------------------------------------------------- A2C against Stable-Baselines3
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



# ----------------------------------------------------------------------------- the server in-process
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
    w0 = worker_name(0)
    service = ParameterService(rng.standard_normal(n_params).astype(np.float32), "grad",
                               Hogwild((w0,), 1), make_optimizer=make)
    server = Server(service, [w0], ServerConfig(), Ledger(None))
    grads = [rng.standard_normal(n_params).astype(np.float32) for _ in range(8)]
    server.receive(Message(w0, SERVER, HELLO), 0.0)
    for i in range(50):  # warm-up: first calls pay one-off import and allocation costs
        server.receive(Message(w0, SERVER, "grad", {"grad": grads[0]}, base_version=server.version), 0.0)
    pushes_before = service.updates()
    t0 = time.perf_counter()
    for i in range(pushes):
        server.receive(Message(w0, SERVER, "grad", {"grad": grads[i % 8]}, base_version=server.version, seq=i), 0.0)
    elapsed = time.perf_counter() - t0
    assert server.ledger.rejected == 0 and service.updates() - pushes_before == pushes
    return pushes / elapsed



# ----------------------------------------------------------------------------- backends compared
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
    with run_config(a3c_config(backend, workers, steps)) as (summary, run_dir):
        pushing, updates_per_s = _steady_rate(run_dir, "grad")
    per_update = summary["env_steps"] / max(1, summary["updates"])
    return {"backend": backend, "workers": workers, "pushing": pushing, "updates": summary["updates"],
            "updates_per_s": updates_per_s, "env_steps_per_s": updates_per_s * per_update,
            "wall_s": summary["wall_s"]}


def bench_overhead(backend: str, seconds: float, size: int) -> dict[str, Any]:
    """One push_flood worker: pushes/s with 32 in flight, and microseconds per round trip (1 in flight)."""
    out: dict[str, Any] = {"backend": backend, "payload_bytes": 4 * size}
    for window, key in ((32, "pushes_per_s"), (1, "round_trips_per_s")):
        with run_config(flood_config(backend, 1, seconds, window=window, size=size)) as (summary, _):
            w0 = worker_name(0)
            out[key] = summary["sent"][w0] / max(summary["push_seconds"][w0], 1e-9)
    out["round_trip_us"] = 1e6 / out["round_trips_per_s"]
    return out


# ----------------------------------------------------------------------------- the command
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
    backends = parse_backends(args.backend)
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
    with shared_ray(backends if parts & RAY_PARTS else [], max(workers)):  # Ray only for a part that runs it
        if "backends" in parts:
            table = [bench_backend_a3c(b, w, args.backend_steps) for b in backends for w in workers]
        if "overhead" in parts:
            overhead = [bench_overhead(b, args.flood_seconds, args.payload) for b in backends]
    rows["a3c_by_backend"] = table
    rows["overhead_by_backend"] = overhead
    if args.json:
        print(json.dumps(rows))
        return 0
    for k, v in rows.items():
        if not isinstance(v, list):
            print(f"{k:32s} {NOT_INSTALLED if v is None else v if isinstance(v, int) else f'{v:,.1f}'}")
    if table:
        print_table(f"CartPole A3C, {args.backend_steps} env steps; rates once every worker had pushed "
                     "('pushing': workers that did)", table,
                     ["backend", "workers", "pushing", "updates_per_s", "env_steps_per_s", "wall_s"])
    if overhead:
        print_table(f"per-message overhead: one push_flood worker, {4 * args.payload} B pushes, "
                     f"{args.flood_seconds:g} s each", overhead,
                     ["backend", "pushes_per_s", "round_trip_us"])
    return 0



BENCHES = {"runtime": main}  # marlq bench runtime
