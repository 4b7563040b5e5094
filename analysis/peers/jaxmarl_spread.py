"""marl-q against JaxMARL's IPPO on simple_spread: env steps per second and returns, one core each, interleaved.

JaxMARL runs in its own virtualenv (``analysis/peers/jaxmarl_spread.sh`` builds it from PyPI); its IPPO
baseline is *their* file, ``baselines/IPPO/ippo_ff_mpe.py`` from github.com/FLAIROx/JaxMARL, passed by
path (it is not part of this repository). This script loads that file with ``wandb``, ``hydra`` and
``hydra`` replaced by inert modules (no logging; its ``main``, which plots, is not called), takes its ``make_train`` with its own
``config/ippo_ff_mpe.yaml`` (one seed instead of its vmap over ``NUM_SEEDS``; ``TOTAL_TIMESTEPS`` and
``SEED`` from here), and times three phases in that process: import (jax, jaxmarl and their file),
compile (``jax.jit(train).lower(rng).compile()``) and the training loop (the compiled call, to
``block_until_ready``). The only change to their code path is the log wrapper: their
``MPELogWrapper`` is subclassed to also record each episode's *team* return over its first 25 steps
(their MPE episodes are 26 steps: ``done`` is checked before the step counter moves; marl-q's, like
mpe2's, are 25), the scale of marl-q's ``metrics.csv``.

marl-q runs ``marlq run scenarios/spread_ippo_jaxmarl.yaml`` (plots off) from ``--tree``: the whole
process is timed from outside, the training loop is the run's ``summary.json`` ``wall_s``.

Every run is its own process, pinned (``taskset -c CPU``), one thread (``OMP_NUM_THREADS=1``,
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``), the two
interleaved round by round. Before timing, ``--check`` steps both envs from the same positions with
the same actions and compares observations and rewards.

    analysis/peers/jaxmarl_spread.sh        # the venv, their baseline file, the check and 3 rounds
    python analysis/peers/jaxmarl_spread.py --jaxmarl-python /tmp/jaxmarl_venv/bin/python \\
        --baseline /tmp/jaxmarl_src/ippo_ff_mpe.py --steps 300000 --rounds 3 --out /tmp/jaxmarl_cmp.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
SCENARIO = "scenarios/spread_ippo_jaxmarl.yaml"
FIRST_STEPS = 25  # the steps of an episode whose rewards count (marl-q's and mpe2's episode length)


def one_thread_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
                JAX_PLATFORMS="cpu", WANDB_MODE="disabled", MPLBACKEND="Agg", **extra)


# ----------------------------------------------------------------------------- JaxMARL side (its venv)
def _inert_modules() -> None:
    """wandb and hydra as modules that do nothing: the baseline imports them at the top (hydra for its
    ``main``'s decorator, wandb for ``main`` and for the per-update ``io_callback``, which then logs
    nothing). Its plotting is in ``main``, which is never called (matplotlib is JaxMARL's own dependency)."""
    wandb = types.ModuleType("wandb")
    wandb.init = lambda *a, **k: None
    wandb.log = lambda *a, **k: None
    hydra = types.ModuleType("hydra")
    hydra.main = lambda *a, **k: (lambda f: f)
    sys.modules.update({"wandb": wandb, "hydra": hydra})


def _load_baseline(path: str) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("jaxmarl_ippo_ff_mpe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _team_return_wrapper(base: type) -> type:
    """Their MPELogWrapper, also recording each episode's team return over its first 25 steps: info
    ``team_return_25`` is it times ``episode_end`` (1 on the step an episode ends), so that the
    baseline's per-update means of the two give the mean over the episodes that ended in an update."""
    import jax.numpy as jnp
    from flax import struct

    @struct.dataclass
    class State:
        inner: object
        running: object
        last: object

    class TeamReturn25(base):
        def reset(self, key):
            obs, inner = super().reset(key)
            return obs, State(inner, jnp.zeros(()), jnp.zeros(()))

        def step(self, key, state, action):
            t = state.inner.env_state.step  # steps taken in this episode before this one
            obs, inner, reward, done, info = super().step(key, state.inner, action)
            team = sum(reward[a] for a in self._env.agents) * (t < FIRST_STEPS)
            running = state.running + team
            end = done["__all__"]
            n = self._env.num_agents
            info["team_return_25"] = jnp.full((n,), running * end)
            info["episode_end"] = jnp.full((n,), end.astype(jnp.float32))
            return obs, State(inner, running * (1 - end), running), reward, done, info

    return TeamReturn25


def jaxmarl_child(baseline: str, config_path: str, steps: int, seed: int) -> None:
    t0 = time.perf_counter()
    _inert_modules()
    import jax
    from omegaconf import OmegaConf

    module = _load_baseline(baseline)
    jax.numpy.zeros(1).block_until_ready()
    t_import = time.perf_counter() - t0
    config = OmegaConf.to_container(OmegaConf.load(config_path))
    config.update(TOTAL_TIMESTEPS=steps, SEED=seed, NUM_SEEDS=1)
    module.LogWrapper = _team_return_wrapper(module.LogWrapper)
    train = module.make_train(config)
    rng = jax.random.PRNGKey(seed)
    t1 = time.perf_counter()
    compiled = jax.jit(train).lower(rng).compile()
    t_compile = time.perf_counter() - t1
    t2 = time.perf_counter()
    out = jax.block_until_ready(compiled(rng))
    t_train = time.perf_counter() - t2
    metrics = out["metrics"]
    done_steps = config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"]
    print(json.dumps({"peer": "jaxmarl", "import_s": t_import, "compile_s": t_compile, "train_s": t_train,
                      "env_steps": done_steps, "updates": config["NUM_UPDATES"],
                      "return_sum_by_update": [float(x) for x in metrics["team_return_25"]],
                      "ends_by_update": [float(x) for x in metrics["episode_end"]],
                      "jax": jax.__version__, "jaxmarl_config": {k: v for k, v in config.items() if k.isupper()}}),
          flush=True)


def check_child(seed: int, episodes: int) -> None:
    """JaxMARL's simple_spread from reset, random actions: positions, actions, observations and rewards."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import jaxmarl

    env = jaxmarl.make("MPE_simple_spread_v3")
    rng = np.random.default_rng(seed)
    step = jax.jit(env.step_env)
    episodes_out = []
    key = jax.random.PRNGKey(seed)
    for _ in range(episodes):
        key, k_reset = jax.random.split(key)
        obs, state = env.reset(k_reset)
        record = {"p_pos": np.asarray(state.p_pos).tolist(), "p_vel": np.asarray(state.p_vel).tolist(),
                  "obs": [np.stack([np.asarray(obs[a]) for a in env.agents]).tolist()], "actions": [], "rewards": []}
        for _t in range(FIRST_STEPS):
            actions = rng.integers(0, 5, env.num_agents)
            key, k_step = jax.random.split(key)
            obs, state, reward, done, _ = step(k_step, state, {a: jnp.asarray(actions[i]) for i, a in enumerate(env.agents)})
            record["actions"].append(actions.tolist())
            record["obs"].append(np.stack([np.asarray(obs[a]) for a in env.agents]).tolist())
            record["rewards"].append([float(reward[a]) for a in env.agents])
        episodes_out.append(record)
    print(json.dumps({"episodes": episodes_out}))


# ----------------------------------------------------------------------------- marl-q side
def compare_envs(recorded: dict) -> tuple[float, float]:
    """Replay JaxMARL's episodes in marl-q's native spread from the same positions: the largest
    observation and reward differences."""
    import numpy as np

    from scenarios.spread_native import SpreadNative

    env = SpreadNative(N=3, local_ratio=0.5, max_cycles=FIRST_STEPS)
    obs_err = rew_err = 0.0
    for ep in recorded["episodes"]:
        env.reset(seed=0)
        pos = np.asarray(ep["p_pos"], dtype=np.float64)
        env.pos, env.landmarks = pos[: env.n].copy(), pos[env.n:].copy()
        env.vel = np.asarray(ep["p_vel"], dtype=np.float64)[: env.n].copy()
        env._pairs = None
        obs = env._observations()
        obs_err = max(obs_err, float(np.abs(obs - np.asarray(ep["obs"][0])).max()))
        for t, actions in enumerate(ep["actions"]):
            o, r, _, _, _ = env.step({a: int(actions[i]) for i, a in enumerate(env.possible_agents)})
            got = np.stack([o[a] for a in env.possible_agents])
            obs_err = max(obs_err, float(np.abs(got - np.asarray(ep["obs"][t + 1])).max()))
            rew_err = max(rew_err, float(np.abs(np.array([r[a] for a in env.possible_agents]) - ep["rewards"][t]).max()))
    return obs_err, rew_err


def run_marlq(tree: Path, steps: int, seed: int, cpu: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = ["taskset", "-c", cpu, sys.executable, "-m", "marl_q.cli", "run", SCENARIO,
               "--set", f"run.total_env_steps={steps}", "--set", f"run.seed={seed}", "--set", "run.plots=false",
               "--quiet", "--out", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=one_thread_env(PYTHONPATH=str(tree)), capture_output=True, text=True)
        whole = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(f"marl-q run failed:\n{proc.stderr[-3000:]}")
        summary = json.loads((out / "summary.json").read_text())
        import csv

        with open(out / "metrics.csv") as f:
            returns = [float(row["return"]) for row in csv.DictReader(f)]
    last = returns[-100:]
    return {"peer": "marl-q", "whole_s": whole, "train_s": summary["wall_s"], "env_steps": summary["env_steps"],
            "return_last100": sum(last) / len(last), "episodes": len(returns)}


def run_jaxmarl(python: str, baseline: str, config: str, steps: int, seed: int, cpu: str) -> dict:
    cmd = ["taskset", "-c", cpu, python, str(HERE), "--child-jaxmarl", baseline, config, str(steps), str(seed)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=one_thread_env(), capture_output=True, text=True)
    whole = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"JaxMARL run failed:\n{proc.stderr[-3000:]}")
    got = json.loads(lines[-1])
    got["whole_s"] = whole
    return got


def jaxmarl_return(got: dict, last_updates: int = 2) -> float:
    """Mean team return (first 25 steps) of the episodes that ended in the last ``last_updates`` updates
    (16 envs x 128 steps / 26: about 79 episodes an update; 2 updates: about 158)."""
    return sum(got["return_sum_by_update"][-last_updates:]) / sum(got["ends_by_update"][-last_updates:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jaxmarl-python", default="/tmp/jaxmarl_venv/bin/python")
    parser.add_argument("--baseline", help="path to JaxMARL's baselines/IPPO/ippo_ff_mpe.py")
    parser.add_argument("--config", help="its config/ippo_ff_mpe.yaml (default: next to the baseline)")
    parser.add_argument("--tree", default=str(ROOT), help="the marl-q checkout to run")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", default="1")
    parser.add_argument("--check-only", action="store_true", help="only compare the two envs")
    parser.add_argument("--out", help="write every run's figures here (JSON)")
    parser.add_argument("--child-jaxmarl", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-check", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_jaxmarl:
        b, c, s, seed = args.child_jaxmarl
        jaxmarl_child(b, c, int(s), int(seed))
        return 0
    if args.child_check:
        check_child(*args.child_check)
        return 0
    if not args.baseline and not args.check_only:
        print("jaxmarl_spread: --baseline PATH (JaxMARL's baselines/IPPO/ippo_ff_mpe.py) is required", file=sys.stderr)
        return 2
    for path in [args.baseline, args.config] if args.baseline else []:
        if path and not Path(path).is_file():
            print(f"jaxmarl_spread: {path}: no such file", file=sys.stderr)
            return 2
    config = args.config or (str(Path(args.baseline).parent / "config" / "ippo_ff_mpe.yaml") if args.baseline else "")
    if args.baseline and not Path(config).is_file():
        print(f"jaxmarl_spread: {config}: no such file (pass --config)", file=sys.stderr)
        return 2
    tree = Path(args.tree).resolve()
    if not (tree / SCENARIO).is_file():
        print(f"jaxmarl_spread: --tree {tree}: no {SCENARIO} there", file=sys.stderr)
        return 2

    proc = subprocess.run([args.jaxmarl_python, str(HERE), "--child-check", str(args.seed), "20"],
                          env=one_thread_env(), capture_output=True, text=True)
    if proc.returncode:
        print(f"jaxmarl_spread: the env check failed in JaxMARL's venv:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return 1
    obs_err, rew_err = compare_envs(json.loads(proc.stdout.splitlines()[-1]))
    print(f"env check, 20 episodes x 25 steps, same positions and actions: max |obs diff| {obs_err:.2e}, "
          f"max |reward diff| {rew_err:.2e} (JaxMARL float32, marl-q float64 physics)", flush=True)
    if obs_err > 1e-4 or rew_err > 1e-4:
        print("jaxmarl_spread: the two envs differ; not timing them", file=sys.stderr)
        return 1
    if args.check_only:
        return 0

    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    runs: list[dict] = []
    for r in range(args.rounds):
        for peer in ("jaxmarl", "marl-q"):
            got = (run_jaxmarl(args.jaxmarl_python, args.baseline, config, args.steps, args.seed, args.cpu)
                   if peer == "jaxmarl" else run_marlq(tree, args.steps, args.seed, args.cpu))
            got["round"] = r
            got["loop_steps_per_s"] = got["env_steps"] / got["train_s"]
            got["whole_steps_per_s"] = got["env_steps"] / got["whole_s"]
            if peer == "jaxmarl":
                got["return_last_2_updates"] = jaxmarl_return(got)
                print(f"round {r} JaxMARL: import {got['import_s']:.1f} s, compile {got['compile_s']:.1f} s, "
                      f"loop {got['train_s']:.1f} s ({got['loop_steps_per_s']:,.0f} env steps/s), whole "
                      f"{got['whole_s']:.1f} s ({got['whole_steps_per_s']:,.0f}/s), team return (25 steps, last 2 updates) "
                      f"{got['return_last_2_updates']:.1f}", flush=True)
            else:
                print(f"round {r} marl-q: loop {got['train_s']:.1f} s ({got['loop_steps_per_s']:,.0f} env steps/s), whole "
                      f"{got['whole_s']:.1f} s ({got['whole_steps_per_s']:,.0f}/s), team return (last 100) "
                      f"{got['return_last100']:.1f}", flush=True)
            runs.append(got)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    by = {p: [g for g in runs if g["peer"] == p] for p in ("jaxmarl", "marl-q")}
    for key in ("loop_steps_per_s", "whole_steps_per_s"):
        ratios = [m[key] / j[key] for m, j in zip(by["marl-q"], by["jaxmarl"])]
        print(f"{key}: JaxMARL median {statistics.median(g[key] for g in by['jaxmarl']):,.0f}, marl-q median "
              f"{statistics.median(g[key] for g in by['marl-q']):,.0f}; marl-q/JaxMARL per round "
              f"{[round(x, 2) for x in ratios]}, median {statistics.median(ratios):.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": args.steps, "seed": args.seed, "tree": str(tree),
                                              "obs_err": obs_err, "rew_err": rew_err, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
