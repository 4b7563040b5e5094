"""marl-q's PPO defaults against Stable-Baselines3's PPO defaults on a task nobody tuned for.

    python -m analysis.peers.sb3_defaults [--steps 300000] [--seeds 0,1,2] [--jobs 2] [--out DIR]

Runs, for each seed and the same budget of env steps, on marlq/SmallReward-v0 (scenarios/small_reward.py)
or on any Gymnasium id or ``package.module:callable`` given with ``--env``:
- ``marl-q new``: scenarios/small_reward_ppo.yaml as it is (marl-q's PPO defaults, one sim worker);
- ``marl-q old``: the same with the defaults marl-q shipped before (``OLD_DEFAULTS``, set explicitly);
- ``SB3``: ``stable_baselines3.PPO("MlpPolicy", env)`` with every default (one env, n_steps 2048);
and prints the mean return of the last ``--window`` training episodes of each run, per seed, with the
random policy's return on the same env (and, on SmallReward, a scripted tracker's).
``--variant LABEL='key=value;key=value'`` adds marl-q runs with other ``--set`` overrides (an ablation). Each run is its own process on one thread, at most
``--jobs`` at once; its result is kept as ``OUT/LABEL_sSEED.json``, so a rerun with the same
``--out`` prints what is there and runs only what is missing. Needs ``pip install -e ".[bench]"``.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "small_reward_ppo.yaml"
# what marl-q's defaults were before issue 26 changed them: the mlp actor's last-layer gain (now 0.01)
# marl-q's defaults before issue 26: actor gain 1.0 and CleanRL's classic-control PPO knobs
OLD_DEFAULTS = {"actor.out_gain": 1.0, "n_steps": 128, "epochs": 4, "minibatches": 4, "lr": 2.5e-4,
                "ent_coef": 0.01, "value_clip": 0.2}
NEW, OLD, SB3 = "marl-q new", "marl-q old", "SB3"


def overrides_of(text: str) -> list[str]:
    """``'key=value;key=value'`` -> ``--set`` items (keys under ``algorithm.`` unless they name a section)."""
    items = [part.strip() for part in text.split(";") if part.strip()]
    sections = ("run.", "backend.", "server.", "scenario.", "algorithm.", "actor.", "critic.")
    return [item if item.startswith(sections) else f"algorithm.{item}" for item in items]


def random_return(env_id: str, env_kwargs: dict[str, Any], episodes: int, seed: int = 0) -> float:
    """Mean return of uniformly random actions over ``episodes`` episodes of the env marl-q would build."""
    from scenarios.generic import GymnasiumConfig, single_env

    env = single_env(GymnasiumConfig(env=env_id, kwargs=dict(env_kwargs), num_envs=1))
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, term, trunc, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def run_marlq(steps: int, seed: int, overrides: list[str], window: int) -> dict[str, Any]:
    """One marl-q run of the scenario file; the mean return of its last ``window`` episodes."""
    import csv

    import torch

    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    torch.set_num_threads(1)
    sets = [f"run.total_env_steps={steps}", "run.progress=false", "run.plots=false", *overrides]
    cfg = load_config(SCENARIO, sets, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_experiment(cfg, Path(tmp) / "run", plots=False)
        with (Path(tmp) / "run" / "metrics.csv").open() as f:
            returns = [float(row["return"]) for row in csv.DictReader(f)]
    return {"final": float(np.mean(returns[-window:])), "episodes": len(returns),
            "env_steps": int(summary["env_steps"]), "wall_s": float(summary["wall_s"])}


def run_sb3(steps: int, seed: int, window: int, env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Stable-Baselines3's PPO with all its defaults on one env; the mean of its last ``window`` episodes."""
    import time

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    import scenarios  # noqa: F401  (registers marlq/SmallReward-v0 with Gymnasium)
    from scenarios.generic import GymnasiumConfig, single_env

    torch.set_num_threads(1)
    if ":" in env_id:  # an import path: the env marl-q builds from it (every form scenario.env takes)
        cfg = GymnasiumConfig(env=env_id, kwargs=dict(env_kwargs), num_envs=1)
        env = make_vec_env(functools.partial(single_env, cfg), n_envs=1, seed=seed)
    else:
        env = make_vec_env(env_id, n_envs=1, seed=seed, env_kwargs=env_kwargs)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, stats_window_size=window)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    returns = [float(info["r"]) for info in model.ep_info_buffer]
    return {"final": float(np.mean(returns)), "episodes": len(returns), "env_steps": int(model.num_timesteps),
            "wall_s": time.perf_counter() - t0}


def _job(job: tuple[str, int, int, list[str], int, str, str, dict[str, Any]]) -> tuple[str, int, dict[str, Any]]:
    label, seed, steps, overrides, window, out, env_id, env_kwargs = job
    if label == SB3:
        result = run_sb3(steps, seed, window, env_id, env_kwargs)
    else:
        sets = [*overrides, f"scenario.env={env_id}", f"scenario.kwargs={json.dumps(env_kwargs)}"]
        result = run_marlq(steps, seed, sets, window)
    result.update(label=label, seed=seed, steps=steps, overrides=overrides, env=env_id, env_kwargs=env_kwargs)
    Path(out, f"{label.replace(' ', '_')}_s{seed}.json").write_text(json.dumps(result, indent=1))
    return label, seed, result


def main(argv: list[str] | None = None) -> int:
    """Run what is missing under ``--out`` and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300_000, help="env steps per run (300000)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (0,1,2)")
    ap.add_argument("--window", type=int, default=100, help="final return: mean of the last this many episodes")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each (2)")
    ap.add_argument("--only", default=f"{NEW},{OLD},{SB3}", help="comma-separated labels to run")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL='key=v;key=v'",
                    help="another marl-q run with these overrides (algorithm keys need no prefix)")
    ap.add_argument("--env", default=None, help="a Gymnasium id or package.module:callable (marlq/SmallReward-v0)")
    ap.add_argument("--env-kwargs", type=json.loads, default={}, metavar="JSON",
                    help="keyword arguments of the env, e.g. '{\"noise\": 0.5}'")
    ap.add_argument("--out", type=Path, default=Path("runs/sb3_defaults"))
    args = ap.parse_args(argv)
    from scenarios.small_reward import ENV_ID, scripted_returns

    env_id = args.env or ENV_ID
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    configs: dict[str, list[str]] = {}
    for label in [x.strip() for x in args.only.split(",") if x.strip()]:
        if label not in (NEW, OLD, SB3):
            ap.error(f"--only: unknown label {label!r} (choices: {NEW}, {OLD}, {SB3})")
        configs[label] = overrides_of(";".join(f"{k}={v}" for k, v in OLD_DEFAULTS.items())) if label == OLD else []
    for item in args.variant:
        label, sep, text = item.partition("=")
        if not sep or not label.strip():
            ap.error(f"--variant {item!r}: expected LABEL='key=value;key=value'")
        configs[label.strip()] = overrides_of(text)
    try:  # the env is built once here, so that a wrong --env is one line before any run
        scale = f"random policy {random_return(env_id, args.env_kwargs, 500):.2f}"
    except (ValueError, TypeError) as exc:
        print(f"--env {env_id!r}: {exc}", file=sys.stderr)
        return 2
    if env_id == ENV_ID:
        scale += f", scripted tracker {np.mean(scripted_returns('tracking', 500, **args.env_kwargs)):.2f}"
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    jobs = []
    for label, overrides in configs.items():
        for seed in seeds:
            path = args.out / f"{label.replace(' ', '_')}_s{seed}.json"
            if path.is_file():
                kept = json.loads(path.read_text())
                if (kept.get("steps"), kept.get("overrides"), kept.get("env"), kept.get("env_kwargs")) == (
                        args.steps, overrides, env_id, args.env_kwargs):
                    results[label, seed] = kept
                    continue
            jobs.append((label, seed, args.steps, overrides, args.window, str(args.out), env_id, args.env_kwargs))
    if jobs:
        with multiprocessing.get_context("spawn").Pool(max(1, args.jobs), maxtasksperchild=1) as pool:
            for label, seed, result in pool.imap_unordered(_job, jobs):
                results[label, seed] = result
                print(f"  done: {label} seed {seed}: {result['final']:.2f} ({result['wall_s']:.0f} s)", flush=True)
    print(f"\n{env_id} {args.env_kwargs or ''}, {args.steps:,} env steps a run; mean return of the last "
          f"{args.window} training episodes\n{scale} (500 episodes each)")
    print(f"{'config':14s} " + " ".join(f"{'seed ' + str(s):>8s}" for s in seeds) + f" {'mean':>8s}  overrides")
    for label, overrides in configs.items():
        values = [results[label, s]["final"] for s in seeds if (label, s) in results]
        cells = " ".join(f"{results[label, s]['final']:8.2f}" if (label, s) in results else f"{'-':>8s}"
                         for s in seeds)
        mean = f"{np.mean(values):8.2f}" if values else f"{'-':>8s}"
        print(f"{label:14s} {cells} {mean}  {' '.join(o.removeprefix('algorithm.') for o in overrides)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
