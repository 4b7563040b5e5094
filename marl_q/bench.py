"""`marlq bench runtime`: env-steps/s of A2C against Stable-Baselines3 in the same run, and the
server's accepted pushes/s. Timings are printed, never asserted (tests don't time things)."""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch


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
    from marl_q.messages import SERVER, Message
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
    server.receive(Message("w0", SERVER, "hello"), 0.0)
    for i in range(50):  # warm-up: first calls pay one-off import and allocation costs
        server.receive(Message("w0", SERVER, "grad", {"grad": grads[0]}, base_version=server.version), 0.0)
    pushes_before = service.updates()
    t0 = time.perf_counter()
    for i in range(pushes):
        server.receive(Message("w0", SERVER, "grad", {"grad": grads[i % 8]}, base_version=server.version, seq=i), 0.0)
    elapsed = time.perf_counter() - t0
    assert server.ledger.rejected == 0 and service.updates() - pushes_before == pushes
    return pushes / elapsed


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runtime speed: A2C env-steps/s vs Stable-Baselines3 (same run), server pushes/s."""
    p = argparse.ArgumentParser(prog="marlq bench runtime", description=main.__doc__)
    p.add_argument("--steps", type=int, default=50_000, help="env steps per A2C measurement")
    p.add_argument("--pushes", type=int, default=20_000)
    p.add_argument("--params", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows: dict[str, Any] = {"threads": 1, "steps": args.steps}
    rows["marlq_a2c_steps_per_s"] = max(bench_marlq_a2c(args.steps) for _ in range(args.repeats))
    sb3 = [bench_sb3_a2c(args.steps) for _ in range(args.repeats)]
    rows["sb3_a2c_steps_per_s"] = None if sb3[0] is None else max(sb3)
    rows["a2c_ratio_vs_sb3"] = (None if sb3[0] is None else rows["marlq_a2c_steps_per_s"] / rows["sb3_a2c_steps_per_s"])
    for opt in ("rmsprop", "sgd"):
        rows[f"server_pushes_per_s_{opt}"] = max(bench_server_pushes(args.params, args.pushes, opt)
                                                 for _ in range(args.repeats))
    rows["server_params"] = args.params
    if args.json:
        print(json.dumps(rows))
    else:
        for k, v in rows.items():
            print(f"{k:32s} {v if v is None or isinstance(v, int) else f'{v:,.1f}'}")
        if sb3[0] is None:
            print("(stable-baselines3 not installed: pip install -e '.[bench]' for the peer measurement)")
    return 0


BENCHES = {"runtime": main}
