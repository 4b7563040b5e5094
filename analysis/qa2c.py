"""The quantum A2C reproduction plot (Koelle et al.): learning curves of the four head variants.

    marlq qa2c RUN_DIR... --out qa2c.png [--window 100] [--solve 475]

Reads only run directories (config.yaml, metrics.csv). A run's variant comes from its resolved
actor/critic heads. Each curve is the mean over seeds of the trailing ``window``-episode mean
return against environment steps, with a 95% t-interval band over seeds. Prints, per variant, the
seeds, the steps at which the trailing mean first reached ``solve`` (for more than 10 seeds: how many
did, the first and the median step) and the final trailing mean's mean (95% t), median and IQM.
"""
from __future__ import annotations

import argparse
import csv
import sys
import textwrap
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from analysis.plots import steps_axis
from analysis.stats import clipped_band, iqm, mean_ci
import yaml

QUANTUM_HEADS = {"vqc", "hybrid", "diffqas"}
ORDER = ["classical", "quantum actor", "quantum critic", "quantum actor + critic"]


def variant_of(run_dir: Path) -> str:
    """'classical', 'quantum actor', 'quantum critic' or 'quantum actor + critic' from config.yaml."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    actor = cfg["actor"]["head"] in QUANTUM_HEADS
    critic = cfg["critic"]["head"] in QUANTUM_HEADS
    return ORDER[int(actor) + 2 * int(critic)]


class Curve:
    """One run's finished episodes: env steps so far and the trailing-window mean return."""

    def __init__(self, env_steps: np.ndarray, trailing: np.ndarray) -> None:
        self.env_steps = env_steps
        self.trailing = trailing


def trailing_mean_curve(run_dir: Path, window: int) -> Curve:
    """Per finished episode: env steps so far and the mean return of the last ``window`` episodes."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = sorted(((int(r["env_steps"]), float(r["return"])) for r in csv.DictReader(f)), key=lambda r: r[0])
    steps = np.array([r[0] for r in rows], dtype=float)
    returns = np.array([r[1] for r in rows])
    sums = np.cumsum(np.concatenate([[0.0], returns]))
    counts = np.minimum(np.arange(1, len(returns) + 1), window)
    trailing = (sums[1:] - sums[np.arange(1, len(returns) + 1) - counts]) / counts
    return Curve(steps, trailing)


def steps_to_solve(curve: Curve, solve: float, window: int) -> float | None:
    """First env step at which a full ``window``-episode trailing mean reached ``solve``."""
    hits = np.flatnonzero(curve.trailing[window - 1 :] >= solve)
    return float(curve.env_steps[window - 1 + hits[0]]) if len(hits) else None


def solve_text(solved: list[float | None], listed: int = 10) -> str:
    """Each seed's step to solve ('-': never) for up to ``listed`` seeds; for more, how many solved, the
    first and the median of their steps."""
    if len(solved) <= listed:
        return ", ".join("-" if s is None else f"{s:.0f}" for s in solved)
    hit = sorted(s for s in solved if s is not None)
    if not hit:
        return f"0 of {len(solved)} seeds"
    return f"{len(hit)} of {len(solved)} seeds (first {hit[0]:.0f}, median {np.median(hit):.0f})"


def band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and the half-width of its 95% t-interval (0 for a single seed)."""
    return mean_ci(values)


def main(argv: Sequence[str] | None = None) -> int:
    """The quantum A2C plot (Koelle et al.): learning curves of the four head variants into one PNG, and a table."""
    p = argparse.ArgumentParser(prog="marlq qa2c", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--solve", type=float, default=475.0)
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    groups: dict[str, list[Curve]] = {}
    for run in args.runs:
        if not (run / "metrics.csv").is_file() or not (run / "config.yaml").is_file():
            print(f"{run}: not a finished run directory (no metrics.csv / config.yaml)", file=sys.stderr)
            return 2
        groups.setdefault(variant_of(run), []).append(trailing_mean_curve(run, args.window))
    horizon = min(curve.env_steps[-1] for curves in groups.values() for curve in curves)
    grid = np.linspace(0, horizon, 200)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    print(f"{'variant':<24}{'seeds':>6}  {'steps to ' + str(int(args.solve)):<52}"
          f"at {horizon:.0f} steps: mean (95% t), median, IQM")
    for name in [v for v in ORDER if v in groups]:
        curves = groups[name]
        values = np.stack([np.interp(grid, c.env_steps, c.trailing) for c in curves])
        mean, half = band(values)
        line, = ax.plot(grid, mean, label=f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
        # the t-interval of 5 seeds can reach past what any seed scored (e.g. above CartPole's 500):
        # the band is clipped to the seeds' range at each step
        low, high = clipped_band(values, mean, half)
        ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
        solved = [steps_to_solve(c, args.solve, args.window) for c in curves]
        finals = np.array([float(np.interp(horizon, c.env_steps, c.trailing)) for c in curves])
        final, final_half = band(finals[:, None])
        print(f"{name:<24}{len(curves):>6}  {solve_text(solved):<52}{final[0]:.1f} +- {final_half[0]:.1f}, "
              f"{np.median(finals):.1f}, {iqm(finals):.1f}")
    ax.set_xlabel("environment steps")
    steps_axis(ax.xaxis)
    ax.set_ylabel(f"return (mean of last {args.window} episodes)")
    title = args.title or "CartPole-v1, one-step TD A2C (Koelle et al.): classical vs hybrid quantum heads"
    ax.set_title(textwrap.fill(title, 80), fontsize=10)
    ax.grid(alpha=0.3)
    several = any(len(curves) > 1 for curves in groups.values())
    ax.legend(title="mean over seeds, 95% t-band (clipped to the seeds' range)" if several else "one seed per variant", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")
    return 0


COMMANDS = {"qa2c": main}  # marlq qa2c ...

if __name__ == "__main__":
    sys.exit(main())
