"""The LBF/RWARE paper's table figures for groups of runs: "maximum return" over greedy evaluations and the
mean of the last training episodes, each as mean +- 95% t-interval over seeds.

    python -m analysis.max_return 'sweeps/lbf/*/seed?' --by algorithm.name [--last 200]

groups the run directories by a config key (dotted; named as ``marlq coma --by`` names its curves) and prints, per group: the number of seeds, the
maximum return (``analysis.stats.maximum_return``: the evaluation step of ``eval.csv`` with the highest
mean over the group's seeds, the mean and interval there, and each seed's value at that step), and the
mean over seeds of each seed's last ``--last`` training episodes' team return (``metrics.csv``). Runs
whose evaluations stop at different steps are compared over the steps they all reached.
"""
from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import yaml

from analysis.coma import config_value, group_label
from analysis.plots import read_csv_columns
from analysis.stats import maximum_return, mean_ci
from marl_q.errors import RunDirError
from marl_q.rundir import run_file


def _column(path: Path, name: str) -> np.ndarray:
    """One column of a run's CSV file (plain or compressed), rows without a value left out."""
    values = read_csv_columns(run_file(path) or path).get(name, np.zeros(0))
    return values[~np.isnan(values)]


def table(runs: Sequence[Path], by: str, last: int) -> list[dict]:
    """One row per group (in the order groups first appear), as described in the module docstring."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        config = yaml.safe_load((run / "config.yaml").read_text())
        groups.setdefault(group_label(by, config_value(config, by)), []).append(run)
    rows = []
    for name, members in groups.items():
        evals = [_column(m / "eval.csv", "eval_return") for m in members]
        steps = [_column(m / "eval.csv", "env_steps") for m in members]
        reached = min(len(e) for e in evals)
        if reached == 0:
            raise ValueError(f"{name}: a run has no evaluation in eval.csv ({', '.join(str(m) for m in members)})")
        best, mean, half = maximum_return(np.stack([e[:reached] for e in evals]))
        tails = [float(np.mean(_column(m / "metrics.csv", "return")[-last:])) for m in members]
        tail_mean, tail_half = mean_ci(np.array(tails))
        rows.append({"group": name, "seeds": len(members), "best_step": int(np.median([s[best] for s in steps])),
                     "max_return": mean, "max_return_ci": half, "per_seed": [float(e[best]) for e in evals],
                     "last": float(tail_mean), "last_ci": float(tail_half), "last_per_seed": tails})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or glob patterns")
    parser.add_argument("--by", default="algorithm.name", help="the config key that names a group")
    parser.add_argument("--last", type=int, default=200, help="training episodes at the end of each run")
    args = parser.parse_args(argv)
    runs = sorted({Path(p) for pattern in args.runs for p in (glob.glob(pattern) or [pattern])})
    missing = [str(r) for r in runs if run_file(r / "eval.csv") is None or not (r / "config.yaml").is_file()]
    if missing or args.last < 1:
        print(f"max_return: not run directories with eval.csv and config.yaml: {', '.join(missing)}" if missing
              else f"max_return: --last must be at least 1, got {args.last}", file=sys.stderr)
        return 2
    try:
        rows = table(runs, args.by, args.last)
    except (ValueError, RunDirError) as exc:
        print(f"max_return: {exc}", file=sys.stderr)
        return 2
    print(f"| {args.by} | seeds | maximum return (greedy; at the step) | per seed there | last {args.last} training episodes |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['group']} | {r['seeds']} | {r['max_return']:.3f} ± {r['max_return_ci']:.3f} (at {r['best_step']:,}) | "
              f"{', '.join(f'{v:.3f}' for v in r['per_seed'])} | {r['last']:.3f} ± {r['last_ci']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
