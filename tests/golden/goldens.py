"""The behaviour contract of every shipped scenario file: a short sim run's metrics.csv and comm.csv
hashed with SHA-256.

``python -m tests.golden.goldens`` prints the table that ``test_golden.py`` holds. A change that
cannot keep the last bits (a reordered float sum) regenerates the table in the same commit and says
why in a line beside the changed entry.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = ROOT / "scenarios"

# a few thousand env steps (episodes for the LSVI family, whose budget is counted in episodes)
BUDGET = {"linear_mdp_regret.yaml": ["run.total_episodes=300"],
          # routing decisions and vehicular steps cost more than a CartPole step
          # (and the end-of-run evaluation over a simulated day would dominate: a twentieth of one)
          "routing_amarl.yaml": ["run.total_env_steps=600", "algorithm.eval_days=0.05"],
          "routing_single_ppo.yaml": ["run.total_env_steps=600", "algorithm.eval_days=0.05"],
          "vehicular_a3c.yaml": ["run.total_env_steps=1500"],
          "penalty_cue_coma.yaml": ["run.total_env_steps=2000"],
          # eight pursuers on a grid, three walkers in Box2D: one rollout each
          "pursuit_ippo.yaml": ["run.total_env_steps=400", "algorithm.envs_per_worker=2", "algorithm.n_steps=100"],
          "multiwalker_mappo.yaml": ["run.total_env_steps=512", "algorithm.envs_per_worker=2"]}
# scenario files whose env needs an optional extra, and the module that tells it is installed
NEEDS = {"pursuit_ippo.yaml": "pymunk", "multiwalker_mappo.yaml": "Box2D"}
DEFAULT_BUDGET = ["run.total_env_steps=3000"]
COMMON = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0", "run.seed=0"]


def scenario_files() -> list[str]:
    return sorted(p.name for p in SCENARIO_DIR.glob("*.yaml"))


def overrides(name: str) -> list[str]:
    return COMMON + BUDGET.get(name, DEFAULT_BUDGET)


def golden_hashes(name: str, out: Path) -> dict[str, Any]:
    """Run scenario file ``name`` at the golden budget into ``out``; the SHA-256 of its two files."""
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    cfg = load_config(str(SCENARIO_DIR / name), overrides(name))
    run_experiment(cfg, out)
    return {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("metrics.csv", "comm.csv")}


def main(argv: list[str]) -> int:
    import time

    names = argv or scenario_files()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            h = golden_hashes(name, Path(tmp) / name)
            print(f'    "{name}": ("{h["metrics.csv"]}",\n        "{h["comm.csv"]}"),  # {time.perf_counter() - t0:.1f} s',
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
