"""Learning curves of COMA and its baselines over seeds, with 95% bands, from run directories only.

Usage (after ``marlq sweep ... --grid algorithm.name=coma,iac,central_v``):

    marlq coma SWEEP_OR_RUN_DIRS... --out curves.png [--by algorithm.name]
        [--x env_steps|t] [--window N] [--threshold 8] [--title "..."]

Runs are grouped by a config key (``--by``, dotted, read from each run's config.yaml); each group's
curve is the mean over seeds of the trailing ``window``-episode mean return, on a common x grid, and
its band the 95% t-interval of that mean. A table of final/eval returns (and, with ``--threshold``,
the x at which each seed's curve first reaches it) is printed.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np
from analysis.stats import clipped_band, mean_ci
import yaml

from marl_q.errors import RunDirError


@dataclass
class Run:
    """One run directory's curve and summary."""

    path: Path
    group: str
    x: np.ndarray  # env steps or virtual time at each finished episode
    returns: np.ndarray
    summary: dict
    solve_window: int = 100  # the run's run.solve_window: the default smoothing, as in `marlq plot`


def find_run_dirs(paths: Sequence[Path]) -> list[Path]:
    """Run directories (holding summary.json) at or below each path; a path with none is an error."""
    found: list[Path] = []
    for p in paths:
        if (p / "summary.json").is_file():
            found.append(p)
            continue
        below = sorted(s.parent for s in p.rglob("summary.json"))
        if not below:
            raise RunDirError(f"{p}: no run directory (summary.json) at or below it")
        found.extend(below)
    return found


def config_value(config: dict, dotted: str) -> str:
    """The value of a dotted key in a resolved config mapping, as text."""
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise RunDirError(f"config key {dotted!r} not in this run's config.yaml")
        node = node[part]
    return yaml.safe_dump(node, default_flow_style=True).strip().removesuffix("...").strip()  # as config.yaml spells it


def group_label(by: str, value: str) -> str:
    """A curve's name in the legend and the table: the value alone for the default key (an algorithm's name),
    else ``key=value`` with the key's last part, so that ``null`` or ``true`` say what they are."""
    return value if by == "algorithm.name" else f"{by.rsplit('.', 1)[-1]}={value}"


def load_run(path: Path, by: str, x_key: str) -> Run:
    """Read metrics.csv, summary.json and config.yaml of one run."""
    try:
        summary = json.loads((path / "summary.json").read_text())
        config = yaml.safe_load((path / "config.yaml").read_text())
        with open(path / "metrics.csv", newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get("return", "") != ""]
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable run directory ({exc})") from None
    if rows and x_key not in rows[0]:
        raise RunDirError(f"{path}: metrics.csv has no column {x_key!r}")
    x = np.array([float(r[x_key]) for r in rows])
    returns = np.array([float(r["return"]) for r in rows])
    window = int((config.get("run") or {}).get("solve_window") or 100)
    return Run(path, group_label(by, config_value(config, by)), x, returns, summary, window)


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at every index (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


mean_and_ci = mean_ci  # mean over seeds and the half-width of the t interval (analysis.stats)


def first_reach(x: np.ndarray, curve: np.ndarray, threshold: float) -> Optional[float]:
    """The first x at which ``curve`` is at least ``threshold``, or None."""
    hit = np.flatnonzero(curve >= threshold)
    return float(x[hit[0]]) if len(hit) else None


class Curve(NamedTuple):
    """A group's curve over seeds: the mean, its 95% t half-width, and the band drawn (the t-interval
    clipped to the seeds' own range at each x: with few seeds it can reach past what any seed scored)."""

    grid: np.ndarray
    mean: np.ndarray
    ci: np.ndarray
    seeds: int
    low: np.ndarray
    high: np.ndarray


def group_curves(runs: list[Run], window: int, points: int = 200) -> dict[str, Curve]:
    """group -> Curve, curves interpolated on the x range all seeds cover."""
    out = {}
    for group in sorted({r.group for r in runs}):
        members = [r for r in runs if r.group == group and len(r.x) > 0]
        if not members:
            continue
        hi = min(r.x[-1] for r in members)
        lo = max(r.x[0] for r in members)
        grid = np.linspace(lo, hi, points)
        curves = np.stack([np.interp(grid, r.x, trailing_mean(r.returns, window)) for r in members])
        mean, ci = mean_and_ci(curves)
        low, high = clipped_band(curves, mean, ci)
        out[group] = Curve(grid, mean, ci, len(members), low, high)
    return out


def plot_curves(curves: dict, out: Path, title: str, x_label: Optional[str], y_label: str,
                references: Sequence[tuple[str, float]] = ()) -> Path:
    """One line per group with its 95% band, and dashed horizontal reference levels; saved as PNG.
    ``x_label`` None: the x axis is env steps (``analysis.plots.steps_xlabel``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for group, c in curves.items():
        (line,) = ax.plot(c.grid, c.mean, label=f"{group} ({c.seeds} seed{'s' if c.seeds != 1 else ''})")
        if c.seeds >= 2:  # no band from one seed
            ax.fill_between(c.grid, c.low, c.high, color=line.get_color(), alpha=0.2, linewidth=0)
    # reference levels go in the legend (close levels would print their labels over each other)
    for i, (name, value) in enumerate(references):
        ax.axhline(value, color=("0.2", "0.45", "0.6", "0.75")[i % 4], linestyle=(0, (5, 1.5 + 1.5 * i)),
                   linewidth=1.1, label=f"{name} ({value:g})")
    if x_label is None:
        from analysis.plots import steps_xlabel  # imports matplotlib: only when a figure is drawn

        steps_xlabel(ax)
    else:
        ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.grid(alpha=0.3)
    banded = sorted({c.seeds for c in curves.values() if c.seeds >= 2})
    legend = (f"mean over seeds; shaded: 95% t-interval over {'/'.join(map(str, banded))} seeds,\n"
              "clipped at each x to the seeds' range") if banded else "1 seed per line: no band"
    ax.legend(title=legend, fontsize=9, title_fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def summary_table(runs: list[Run], threshold: Optional[float], window: int) -> list[str]:
    """Lines: per group, mean and 95% CI of final_return, eval_return and (optionally) x to threshold."""
    lines = []
    for group in sorted({r.group for r in runs}):
        members = [r for r in runs if r.group == group]
        parts = [f"{group}: {len(members)} seeds"]
        for key in ("final_return", "eval_return"):
            vals = np.array([r.summary.get(key) for r in members if r.summary.get(key) is not None], dtype=float)
            if len(vals):
                m, h = mean_and_ci(vals[:, None])
                parts.append(f"{key} {m[0]:.3f} ± {h[0]:.3f}")
        if threshold is not None:
            reach = [first_reach(r.x, trailing_mean(r.returns, window), threshold) for r in members]
            done = [v for v in reach if v is not None]
            text = ", ".join("never" if v is None else f"{v:.4g}" for v in reach)
            mean_text = f"{np.mean(done):.4g}" if done else "n/a"
            parts.append(f"x to reach {threshold}: mean {mean_text} over {len(done)}/{len(reach)} seeds [{text}]")
        lines.append("; ".join(parts))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Learning curves of runs grouped by a config key (COMA and its baselines), 95% bands over seeds, and a table."""
    p = argparse.ArgumentParser(prog="marlq coma", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="PNG file")
    p.add_argument("--by", default="algorithm.name", help="config key that names a curve")
    p.add_argument("--x", default="env_steps", choices=["env_steps", "t"], help="x axis: env steps or time (s)")
    p.add_argument("--window", type=int, default=None,
                   help="episodes in the trailing mean (default: the runs' run.solve_window, 100 unless set; "
                        "the window of steps_to_solve and of `marlq plot`)")
    p.add_argument("--threshold", type=float, help="report the x where each seed first reaches this return")
    p.add_argument("--title", default=None)
    p.add_argument("--reference", action="append", default=[], metavar="NAME=VALUE",
                   help="a dashed horizontal line at VALUE labelled NAME (e.g. a scripted policy's return); repeatable")
    p.add_argument("--ylabel", default=None, help="default: episode return, WINDOW-episode trailing mean")
    args = p.parse_args(argv)
    references = []
    for item in args.reference:
        name, _, value = item.rpartition("=")
        try:
            references.append((name, float(value)))
        except ValueError:
            name = ""
        if not name:
            p.error(f"--reference {item!r}: expected NAME=VALUE with a number, e.g. nearest=-53.6")
    try:
        runs = [load_run(d, args.by, args.x) for d in find_run_dirs(args.paths)]
    except RunDirError as exc:
        print(f"marlq coma: error: {exc}", file=sys.stderr)
        return 2
    if args.window is None:
        windows = sorted({r.solve_window for r in runs})
        args.window = windows[-1]
        if len(windows) > 1:
            print(f"marlq coma: the runs' run.solve_window differ ({windows}); smoothing over {args.window}",
                  file=sys.stderr)
    if args.window < 1:
        p.error(f"--window: must be at least 1, got {args.window}")
    curves = group_curves(runs, args.window)
    x_label = None if args.x == "env_steps" else "time (s; virtual in sim)"
    scenario = runs[0].summary.get("scenario", "?")
    title = args.title or f"{scenario}: return by {args.by}, mean of {args.window}-episode window"
    y_label = args.ylabel or f"episode return, {args.window}-episode trailing mean"
    print(f"plot: {plot_curves(curves, args.out, title, x_label, y_label, references)}")
    for line in summary_table(runs, args.threshold, args.window):
        print(line)
    return 0


COMMANDS = {"coma": main}  # marlq coma ...

if __name__ == "__main__":
    sys.exit(main())
