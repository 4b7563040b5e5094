"""marl-q's DQN (scenarios/cartpole_dqn.yaml) against Stable-Baselines3's DQN, same settings, side by side.

    python -m analysis.peers.sb3_dqn [--steps 50000] [--seeds 0,1,2,3,4] [--out DIR]

Both use RL Baselines3 Zoo's tuned CartPole-v1 settings (``ZOO``: lr 2.3e-3, batch 64, buffer 100000,
learning_starts 1000, gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps 128,
exploration_fraction 0.16, exploration_final_eps 0.04, net_arch [256, 256]), which the scenario file
restates in marl-q's keys. For each seed the two runs go one after the other in this one process,
single-threaded (torch.set_num_threads(1); set OMP/MKL_NUM_THREADS=1 in the shell too), the order
alternating from seed to seed. Printed per seed and per learner:
- steps to solve: the env step at the end of the first episode at which the mean return of the last 100
  training episodes is >= 475 (both from each episode's length, so both count steps the same way);
- the mean of the last 100 training episodes;
- env steps per second of the whole training (wall clock and process CPU time), and the ratio
  marl-q / SB3 of their medians over seeds.
``uptime`` is printed before and after. Each result is kept as ``OUT/LABEL_sSEED.json``, so a rerun with
the same ``--out`` prints what is there and runs only what is missing. Needs ``pip install -e ".[bench]"``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "cartpole_dqn.yaml"
ZOO = {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
       "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128, "exploration_fraction": 0.16,
       "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]}}
MARLQ, SB3 = "marl-q", "SB3"
SOLVE, WINDOW = 475.0, 100


def steps_to_solve(returns: list[float], lengths: list[int], solve: float = SOLVE,
                   window: int = WINDOW) -> Optional[int]:
    """Env steps (the sum of episode lengths) at the end of the first episode whose trailing ``window``
    mean return is >= ``solve``; None if never."""
    r = np.asarray(returns, dtype=np.float64)
    if len(r) < window:
        return None
    csum = np.concatenate([[0.0], np.cumsum(r)])
    means = (csum[window:] - csum[:-window]) / window
    hit = np.flatnonzero(means >= solve)
    return int(np.cumsum(lengths)[hit[0] + window - 1]) if len(hit) else None


def _result(returns: list[float], lengths: list[int], steps: int, wall: float, cpu: float) -> dict[str, Any]:
    return {"steps_to_solve": steps_to_solve(returns, lengths), "final": float(np.mean(returns[-WINDOW:])),
            "episodes": len(returns), "env_steps": steps, "wall_s": wall, "cpu_s": cpu,
            "steps_per_s_wall": steps / wall, "steps_per_s_cpu": steps / cpu}


def run_marlq(steps: int, seed: int) -> dict[str, Any]:
    """scenarios/cartpole_dqn.yaml for ``steps`` env steps with run.seed ``seed``."""
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    cfg = load_config(SCENARIO, [f"run.total_env_steps={steps}", "run.progress=false", "run.plots=false"], seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        w0, c0 = time.perf_counter(), time.process_time()
        summary = run_experiment(cfg, Path(tmp) / "run", plots=False)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        with (Path(tmp) / "run" / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    return _result([float(r["return"]) for r in rows], [int(r["length"]) for r in rows], int(summary["env_steps"]),
                   wall, cpu)


def run_sb3(steps: int, seed: int) -> dict[str, Any]:
    """stable_baselines3.DQN("MlpPolicy") with ``ZOO`` on a Monitor-wrapped CartPole-v1, on the CPU."""
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make("CartPole-v1"))
    w0, c0 = time.perf_counter(), time.process_time()
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **ZOO)
    model.learn(total_timesteps=steps)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    out = _result(list(env.get_episode_rewards()), list(env.get_episode_lengths()), int(model.num_timesteps),
                  wall, cpu)
    env.close()
    return out


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "uptime: not available"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.peers.sb3_dqn", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--out", default="runs/peers/sb3_dqn")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("note: OMP_NUM_THREADS is not 1 in this shell (numpy's BLAS may use more threads)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runners = {MARLQ: run_marlq, SB3: run_sb3}
    print(_uptime())
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for i, seed in enumerate(seeds):
        order = [MARLQ, SB3] if i % 2 == 0 else [SB3, MARLQ]
        for label in order:
            path = out / f"{label}_s{seed}.json"
            if path.exists():
                results[label, seed] = json.loads(path.read_text())
                continue
            results[label, seed] = runners[label](args.steps, seed)
            path.write_text(json.dumps(results[label, seed]))
            print(label, seed, json.dumps(results[label, seed]), flush=True)
    print(_uptime())
    print(f"\nDQN on CartPole-v1, Zoo settings, {args.steps} env steps, one thread")
    print(f"{'seed':>4} | {'learner':7} | {'steps to 475':>12} | {'last-100 mean':>13} | {'steps/s wall':>12} | "
          f"{'steps/s cpu':>11}")
    for seed in seeds:
        for label in (MARLQ, SB3):
            r = results[label, seed]
            solved = r["steps_to_solve"] if r["steps_to_solve"] is not None else "not reached"
            print(f"{seed:>4} | {label:7} | {solved:>12} | {r['final']:>13.1f} | {r['steps_per_s_wall']:>12.0f} | "
                  f"{r['steps_per_s_cpu']:>11.0f}")
    for key in ("steps_per_s_wall", "steps_per_s_cpu"):
        m = {label: [results[label, s][key] for s in seeds] for label in (MARLQ, SB3)}
        med = {label: float(np.median(v)) for label, v in m.items()}
        spread = {label: (float(np.min(v)), float(np.max(v))) for label, v in m.items()}
        print(f"{key}: median marl-q {med[MARLQ]:.0f} (range {spread[MARLQ][0]:.0f}-{spread[MARLQ][1]:.0f}), "
              f"SB3 {med[SB3]:.0f} ({spread[SB3][0]:.0f}-{spread[SB3][1]:.0f}); ratio marl-q / SB3 "
              f"{med[MARLQ] / med[SB3]:.2f}")
    solved = {label: sum(results[label, s]["steps_to_solve"] is not None for s in seeds) for label in (MARLQ, SB3)}
    print(f"solved (100-episode mean >= 475): marl-q {solved[MARLQ]}/{len(seeds)}, SB3 {solved[SB3]}/{len(seeds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
