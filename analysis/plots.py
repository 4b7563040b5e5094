"""Plots from run directories alone: learning curves with 95% bands over seeds, traffic, staleness.

Runs whose resolved configs differ only in `run.seed` form one group (one line with a band); the
legend names each group by the keys that differ between groups.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from analysis.stats import mean_ci  # noqa: E402
import yaml  # noqa: E402

from marl_q.errors import RunDirError  # noqa: E402

SMOOTH_EPISODES = 20
GRID_POINTS = 200


@dataclass
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]
    metrics: dict[str, np.ndarray]
    summary: dict[str, Any]
    comm: Optional[dict[str, np.ndarray]] = None
    flat: dict[str, Any] = field(default_factory=dict)

    @property
    def clock(self) -> str:
        return "virtual time (s)" if self.config.get("backend", {}).get("name") == "sim" else "wall time (s)"



def save_figure(fig: Any, ax: Any, path: Path) -> Path:
    """The house finish of a one-axes plot: light grid, legend, tight layout, PNG at 120 dpi; closed."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

def read_csv_columns(path: Path) -> dict[str, np.ndarray]:
    """A CSV file as column arrays (numeric where every value parses)."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        cols: list[list[str]] = [[] for _ in header]
        for row in reader:
            for i, v in enumerate(row[: len(header)]):
                cols[i].append(v)
    out: dict[str, np.ndarray] = {}
    for name, values in zip(header, cols):
        try:
            out[name] = np.array([float(v) if v != "" else np.nan for v in values])
        except ValueError:
            out[name] = np.array(values, dtype=object)
    return out


def load_run(path: Path, with_comm: bool = True) -> Run:
    path = Path(path)
    if not (path / "config.yaml").is_file() or not (path / "metrics.csv").is_file():
        raise RunDirError(f"{path}: not a run directory (needs config.yaml and metrics.csv)")
    config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    comm = read_csv_columns(path / "comm.csv") if with_comm and (path / "comm.csv").is_file() else None
    run = Run(path, config, read_csv_columns(path / "metrics.csv"), summary, comm)
    run.flat = flatten(config)
    return run


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories at or below each path (a sweep folder holds many)."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise RunDirError(f"{p}: no such file or directory")
        if (p / "config.yaml").is_file():
            found.append(p)
        else:
            found.extend(sorted(c.parent for c in p.rglob("config.yaml") if (c.parent / "metrics.csv").is_file()))
    if not found:
        raise RunDirError(f"no run directories under {', '.join(str(p) for p in paths)}")
    return found


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else v
    return out


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Group by config minus the seed; label each group by the keys that differ between groups."""
    ignore = {"run.seed", "run.progress", "run.plots"}
    keyed: dict[tuple, list[Run]] = {}
    for r in runs:
        key = tuple(sorted((k, str(v)) for k, v in r.flat.items() if k not in ignore))
        keyed.setdefault(key, []).append(r)
    groups = list(keyed.values())
    if len(groups) == 1:
        c = groups[0][0].config
        label = f"{c['algorithm'].get('name')} on {c['scenario'].get('name')}"
        return {label: groups[0]}
    all_keys = set().union(*(r.flat for r in runs)) - ignore
    differing = sorted(k for k in all_keys if len({str(g[0].flat.get(k)) for g in groups}) > 1)
    out: dict[str, list[Run]] = {}
    for g in groups:
        label = ", ".join(f"{k}={g[0].flat.get(k)}" for k in differing) or str(len(out))
        out[label] = g
    return out


def mean_band(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and a 95% t-interval across rows (NaN where fewer than one value)."""
    mean, half = mean_ci(np.vstack(curves))
    return mean, mean - half, mean + half


def smoothed(y: np.ndarray, window: int = SMOOTH_EPISODES) -> np.ndarray:
    """Trailing mean over the last `window` episodes (shorter at the start)."""
    c = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def _curve(run: Run, xkey: str, grid: np.ndarray) -> np.ndarray:
    x, y = run.metrics[xkey], smoothed(run.metrics["return"])
    out = np.interp(grid, x, y)
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def plot_learning(groups: dict[str, list[Run]], xkey: str, xlabel: str, title: str, path: Path) -> Optional[Path]:
    if not any("return" in r.metrics and len(r.metrics["return"]) for g in groups.values() for r in g):
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    xmax = max(float(np.max(r.metrics[xkey])) for g in groups.values() for r in g if len(r.metrics[xkey]))
    grid = np.linspace(0.0, xmax, GRID_POINTS)
    for label, runs in groups.items():
        curves = [_curve(r, xkey, grid) for r in runs if len(r.metrics.get("return", []))]
        if not curves:
            continue
        mean, lo, hi = mean_band(curves)
        observed = np.vstack(curves)
        if np.isfinite(observed).any():
            lo = np.maximum(lo, np.nanmin(observed))
            hi = np.minimum(hi, np.nanmax(observed))
        line, = ax.plot(grid, mean, label=f"{label} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
    solve = next(iter(groups.values()))[0].config.get("run", {}).get("solve_return")
    if solve is not None:
        ax.axhline(solve, color="grey", linestyle=":", linewidth=1, label=f"solved ({solve:g})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"episode return (mean of last {SMOOTH_EPISODES}; band: 95% CI over seeds)")
    ax.set_title(title)
    return save_figure(fig, ax, path)


def plot_traffic(groups: dict[str, list[Run]], title: str, path: Path) -> Optional[Path]:
    """Cumulative messages and bytes vs time, per worker, uploads solid and downloads dashed."""
    shown = [(label, runs[0]) for label, runs in groups.items() if runs[0].comm is not None][:4]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 2, figsize=(11, 3.2 * len(shown)), squeeze=False)
    for row, (label, run) in enumerate(shown):
        c = run.comm
        t, nbytes = c["t"], c["bytes"]
        workers = sorted({w for w in np.concatenate([c["src"], c["dst"]]) if w != "server"},
                         key=lambda w: (len(str(w)), str(w)))
        for i, w in enumerate(workers):
            color = plt.cm.tab10(i % 10)
            for direction, mask, style in (("up", c["src"] == w, "-"), ("down", c["dst"] == w, "--")):
                if not mask.any():
                    continue
                axes[row, 0].plot(t[mask], np.arange(1, mask.sum() + 1), style, color=color,
                                  label=f"{w} {direction}")
                axes[row, 1].plot(t[mask], np.cumsum(nbytes[mask]) / 1e6, style, color=color)
        axes[row, 0].set_ylabel("messages (cumulative)")
        axes[row, 1].set_ylabel("payload (MB, cumulative)")
        axes[row, 0].set_title(f"{label}: messages", fontsize=9)
        axes[row, 1].set_title(f"{label}: bytes", fontsize=9)
        for ax in axes[row]:
            ax.set_xlabel(run.clock)
            ax.grid(alpha=0.3)
        axes[row, 0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{title}: traffic per worker (solid: up to the server, dashed: down)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_staleness(groups: dict[str, list[Run]], title: str, path: Path) -> Optional[Path]:
    """Distribution of the staleness of updates that reached the server (all seeds of a group)."""
    data = {}
    for label, runs in groups.items():
        values, dropped = [], 0
        for r in runs:
            if r.comm is None:
                continue
            s = r.comm["staleness"]
            ok = ~np.isnan(s) & (r.comm["accepted"] == 1)
            values.append(s[ok])
            dropped += int(np.sum(~np.isnan(s) & (r.comm["accepted"] == 0)))
        if values and sum(len(v) for v in values):
            data[label] = (np.concatenate(values), dropped)
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    top = int(max(v.max() for v, _ in data.values()))
    bins = np.arange(-0.5, top + 1.5, 1.0)
    for label, (values, dropped) in data.items():
        ax.hist(values, bins=bins, density=True, histtype="step", linewidth=1.8,
                label=f"{label} (mean {values.mean():.2f}, rejected {dropped})")
    ax.set_xlabel("staleness (server versions between pull and push)")
    ax.set_ylabel("fraction of accepted updates")
    ax.set_title(f"{title}: staleness of updates")
    return save_figure(fig, ax, path)


def plot_paths(paths: list[Path], out: Optional[Path] = None) -> list[Path]:
    """Draw every standard plot for the runs at or below `paths`; return the PNG paths."""
    run_dirs = find_runs([Path(p) for p in paths])
    runs = [load_run(p) for p in run_dirs]
    if out is None:
        out = Path(paths[0]) / "plots"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    c = runs[0].config
    seeds = sorted({r.config.get("run", {}).get("seed") for r in runs})
    title = (f"{c['algorithm'].get('name')} on {c['scenario'].get('name')}, "
             f"{c['backend'].get('name')} x{c['backend'].get('workers')} workers, "
             f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}")
    made = [
        plot_learning(groups, "env_steps", "environment steps (all workers)", title, out / "return_vs_steps.png"),
        plot_learning(groups, "t", runs[0].clock, title, out / "return_vs_time.png"),
        plot_traffic(groups, title, out / "traffic.png"),
        plot_staleness(groups, title, out / "staleness.png"),
    ]
    return [p for p in made if p is not None]


PLOTS = {"standard": plot_paths}
