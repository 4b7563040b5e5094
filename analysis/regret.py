"""Regret and communication of the LSVI family, read from run directories: four plots and the figures.

Plots (docs/lsvi.md), each with a 95% band over seeds (Student t):
1. cumulative regret vs K for the four algorithms, with a fitted c sqrt(K) reference;
2. communication rounds and bytes vs K, with a fitted a + b log K reference for async;
3. rounds vs M for async at alpha = 1/M^2 (log-log), with an M^2 reference and the fitted slope;
4. regret (and rounds) vs alpha for async (the trade-off).

Usage: ``marlq regret SWEEP_DIR`` draws from every LSVI run below SWEEP_DIR;
``marlq regret --run CONFIG --seeds 5 --out SWEEP_DIR`` first runs the three sweeps
(algorithms at M=10; async over M; async over alpha) through ``marlq sweep``, then draws.
Run directories only: this module never trains.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from analysis.stats import mean_ci
import yaml

from marl_q.rundir import open_run_text

FAMILY = ("async_coop_lsvi", "coop_lsvi", "lsvi_ucb_pooled", "lsvi_ucb_independent")
LABELS = {"async_coop_lsvi": "Async-Coop-LSVI (alpha = 1/M^2)", "coop_lsvi": "Coop-LSVI (sync)",
          "lsvi_ucb_pooled": "LSVI-UCB pooled (a round every episode)",
          "lsvi_ucb_independent": "LSVI-UCB independent (no communication)"}
COLORS = {"async_coop_lsvi": "tab:blue", "coop_lsvi": "tab:purple", "lsvi_ucb_pooled": "tab:green",
          "lsvi_ucb_independent": "tab:red"}
UPLOAD = "upload"


@dataclass
class RegretRun:
    """One LSVI run: its settings and per-episode curves (index k-1 = after episode k)."""

    path: Path
    algorithm: str
    workers: int
    alpha: Optional[float]
    schedule: str
    seed: int
    episode_regret: np.ndarray
    cum_regret: np.ndarray
    comm_rounds: np.ndarray
    comm_bytes: np.ndarray
    wall_clock_s: np.ndarray
    summary: dict


def _column(rows: list[dict], key: str) -> Optional[np.ndarray]:
    """A numeric column, or None if the column is missing or empty in any row."""
    if not rows or key not in rows[0] or any(r[key] == "" for r in rows):
        return None
    return np.array([float(r[key]) for r in rows])


def _ledger_curves(comm_csv: Path, episode_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rounds (uploads reaching the server) and bytes (all traffic) up to each episode, from comm.csv.

    An episode's messages carry the virtual time of its step, which is unique per episode under a
    schedule, so counting messages with t <= the episode's t gives the totals after that episode.
    """
    upload_t, all_t, sizes = [], [], []
    with open_run_text(comm_csv) as f:  # plain or compressed (run.compress_logs)
        for row in csv.DictReader(f):
            t = float(row["t"])
            all_t.append(t)
            sizes.append(int(row["bytes"]))
            if row["dst"] == "server" and row["kind"] == UPLOAD:
                upload_t.append(t)
    keys = np.round(episode_t, 6) + 5e-7
    rounds = np.searchsorted(np.sort(upload_t), keys, side="right")
    order = np.argsort(all_t, kind="stable")
    cumulative = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64)[order])])
    comm_bytes = cumulative[np.searchsorted(np.asarray(all_t)[order], keys, side="right")]
    return rounds.astype(float), comm_bytes.astype(float)


def load_run(path: Path) -> RegretRun:
    """Read one run directory (config.yaml, summary.json, metrics.csv, comm.csv)."""
    path = Path(path)
    for name in ("config.yaml", "summary.json", "metrics.csv"):
        if not (path / name).is_file():
            raise ValueError(f"{path}: not a run directory (no {name})")
    config = yaml.safe_load((path / "config.yaml").read_text())
    summary = json.loads((path / "summary.json").read_text())
    algorithm = config["algorithm"]["name"]
    if algorithm not in FAMILY:
        raise ValueError(f"{path}: algorithm {algorithm!r} is not of the LSVI family {FAMILY}")
    with open(path / "metrics.csv", newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["episode"]))
    if not rows:
        raise ValueError(f"{path}/metrics.csv: no episodes")
    regret = _column(rows, "regret")
    if regret is None:
        raise ValueError(f"{path}/metrics.csv: no per-episode regret column")
    cum = _column(rows, "cum_regret")
    rounds, comm_bytes = _column(rows, "comm_rounds"), _column(rows, "bytes")
    if rounds is None or comm_bytes is None:
        rounds, comm_bytes = _ledger_curves(path / "comm.csv", _column(rows, "t"))
    wall = _wall_clock(path, [int(r["episode"]) for r in rows])
    return RegretRun(path, algorithm, int(config["backend"]["workers"]), summary.get("alpha"),
                     str(config["backend"].get("schedule", "")), int(config["run"]["seed"]), regret,
                     np.cumsum(regret) if cum is None else cum, rounds, comm_bytes,
                     np.zeros(len(rows)) if wall is None else wall, summary)


def _wall_clock(path: Path, episodes: list[int]) -> Optional[np.ndarray]:
    """Wall seconds at the end of each episode, from the runtime's metrics_wall.csv sidecar."""
    side = path / "metrics_wall.csv"
    if not side.is_file():
        return None
    with open(side, newline="") as f:
        walls = {int(r["episode"]): float(r["wall_s"]) for r in csv.DictReader(f) if r.get("episode")}
    if not all(e in walls for e in episodes):
        return None
    return np.array([walls[e] for e in episodes])


def find_runs(root: Path) -> list[RegretRun]:
    """Every completed LSVI-family run directory below ``root`` (other runs are skipped)."""
    runs = []
    for summary in sorted(Path(root).rglob("summary.json")):
        run_dir = summary.parent
        try:
            status = json.loads(summary.read_text()).get("status")
            algorithm = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("algorithm", {}).get("name")
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if status == "completed" and algorithm in FAMILY:
            runs.append(load_run(run_dir))
    return runs


# ----------------------------------------------------------------------------- statistics
def mean_band(curves: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds and the half-width of its 95% confidence interval (Student t; 0 for one seed)."""
    return mean_ci(np.vstack([np.asarray(c, dtype=float) for c in curves]))


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def regret_exponent(cum_regret: np.ndarray, start_fraction: float = 0.5) -> float:
    """Fitted exponent p of R(K) ~ K^p over episodes from ``start_fraction * K`` to K."""
    k = np.arange(1, len(cum_regret) + 1)
    keep = k >= max(1, int(start_fraction * len(k)))
    return loglog_slope(k[keep], cum_regret[keep])


def rounds_in(rounds: np.ndarray, first: int, last: int) -> float:
    """Rounds during episodes first..last (1-based, inclusive)."""
    before = rounds[first - 2] if first >= 2 else 0.0
    return float(rounds[last - 1] - before)


def sqrt_reference(k: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """c sqrt(K) with c fitted by least squares to ``curve``."""
    root = np.sqrt(k)
    return float(root @ curve / (root @ root)) * root


def log_reference(k: np.ndarray, curve: np.ndarray, start: int = 1000) -> np.ndarray:
    """a + b log K fitted by least squares to ``curve`` over K >= start."""
    keep = k >= min(start, len(k) // 2)
    b, a = np.polyfit(np.log(k[keep]), curve[keep], 1)
    return a + b * np.log(k)


# ----------------------------------------------------------------------------- selection
def _group(runs: list[RegretRun]) -> dict[tuple, list[RegretRun]]:
    groups: dict[tuple, list[RegretRun]] = defaultdict(list)
    for run in runs:
        groups[(run.algorithm, run.workers, None if run.alpha is None else round(run.alpha, 12),
                run.schedule)].append(run)
    return groups


def _default_alpha(run: RegretRun) -> bool:
    return run.alpha is None or math.isclose(run.alpha, 1.0 / run.workers ** 2)


def headline_runs(runs: list[RegretRun], workers: int, schedule: str = "uniform") -> dict[str, list[RegretRun]]:
    """The four algorithms at M = ``workers`` (async at alpha = 1/M^2), one list of seeds each."""
    chosen: dict[str, list[RegretRun]] = defaultdict(list)
    for run in runs:
        if run.workers == workers and run.schedule == schedule and _default_alpha(run):
            chosen[run.algorithm].append(run)
    return _dedupe(chosen)


def _dedupe(groups: dict) -> dict:
    """One run per seed per group (the same setting may come from two sweeps)."""
    out = {}
    for key, group in groups.items():
        by_seed = {}
        for run in group:
            by_seed.setdefault(run.seed, run)
        out[key] = [by_seed[s] for s in sorted(by_seed)]
    return out


def runs_over_workers(runs: list[RegretRun], schedule: str = "uniform") -> dict[int, list[RegretRun]]:
    """Async runs at alpha = 1/M^2, by M."""
    groups: dict[int, list[RegretRun]] = defaultdict(list)
    for run in runs:
        if run.algorithm == "async_coop_lsvi" and run.schedule == schedule and _default_alpha(run):
            groups[run.workers].append(run)
    return dict(sorted(_dedupe(groups).items()))


def runs_over_alpha(runs: list[RegretRun], workers: int, schedule: str = "uniform") -> dict[float, list[RegretRun]]:
    """Async runs at M = ``workers``, by alpha."""
    groups: dict[float, list[RegretRun]] = defaultdict(list)
    for run in runs:
        if run.algorithm == "async_coop_lsvi" and run.workers == workers and run.schedule == schedule:
            alpha = 1.0 / workers ** 2 if run.alpha is None else run.alpha
            groups[round(alpha, 12)].append(run)
    return dict(sorted(_dedupe(groups).items()))


# ----------------------------------------------------------------------------- figures
def acceptance_figures(runs: list[RegretRun], workers: int = 10) -> dict:
    """The headline numbers (docs/lsvi.md), from whichever of the sweeps are present (mean over seeds)."""
    out: dict = {}
    head = headline_runs(runs, workers)

    def mean(values):
        return float(np.mean(values))

    for name, group in head.items():
        k = len(group[0].cum_regret)
        entry = {"seeds": len(group), "K": k,
                 "regret": mean([r.cum_regret[-1] for r in group]),
                 "regret_exponent_second_half": mean([regret_exponent(r.cum_regret) for r in group]),
                 "comm_rounds": mean([r.comm_rounds[-1] for r in group]),
                 "bytes_up": mean([r.summary.get("bytes_up", float("nan")) for r in group]),
                 "bytes_down": mean([r.summary.get("bytes_down", float("nan")) for r in group]),
                 "theory_dHM2logK": mean([r.summary.get("comm_rounds_theory", float("nan")) for r in group])}
        if k >= 20000:
            early = [rounds_in(r.comm_rounds, 2001, 4000) for r in group]
            late = [rounds_in(r.comm_rounds, 18001, 20000) for r in group]
            entry["rounds_2001_4000"] = mean(early)
            entry["rounds_18001_20000"] = mean(late)
            entry["late_over_early"] = mean(late) / mean(early) if mean(early) > 0 else float("nan")
        if k >= 2000 and np.any(group[0].wall_clock_s):
            entry["wall_s_first_1000"] = mean([r.wall_clock_s[999] - r.wall_clock_s[0] for r in group])
            entry["wall_s_last_1000"] = mean([r.wall_clock_s[-1] - r.wall_clock_s[-1000] for r in group])
            entry["wall_s_run"] = mean([r.summary.get("wall_s", float("nan")) for r in group])
        out[name] = entry
    if "async_coop_lsvi" in out and "lsvi_ucb_pooled" in out:
        out["async_over_pooled"] = out["async_coop_lsvi"]["regret"] / out["lsvi_ucb_pooled"]["regret"]
    if "async_coop_lsvi" in out and "lsvi_ucb_independent" in out:
        out["async_over_independent"] = out["async_coop_lsvi"]["regret"] / out["lsvi_ucb_independent"]["regret"]
    over_m = runs_over_workers(runs)
    if len(over_m) >= 2:
        rounds = {m: mean([r.comm_rounds[-1] for r in g]) for m, g in over_m.items()}
        out["rounds_by_M"] = rounds
        out["rounds_vs_M_loglog_slope"] = loglog_slope(list(rounds), list(rounds.values()))
    over_alpha = runs_over_alpha(runs, workers)
    if len(over_alpha) >= 2:
        out["by_alpha"] = {a: {"rounds": mean([r.comm_rounds[-1] for r in g]),
                               "regret": mean([r.cum_regret[-1] for r in g]), "seeds": len(g)}
                           for a, g in over_alpha.items()}
        rounds = [v["rounds"] for v in out["by_alpha"].values()]
        out["rounds_fall_monotonically_in_alpha"] = bool(all(b < a for a, b in zip(rounds, rounds[1:])))
    return out


def _seeds_note(groups) -> str:
    counts = sorted({len(g) for g in groups})
    return "/".join(map(str, counts))


def _thin(n: int, points: int = 400) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, points)).astype(int))


def plot_regret_vs_k(runs: list[RegretRun], out: Path, workers: int = 10) -> Optional[Path]:
    """Plot 1: cumulative regret vs K, four algorithms, bands over seeds, fitted sqrt(K) reference."""
    import matplotlib.pyplot as plt

    head = headline_runs(runs, workers)
    if not head:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name in FAMILY:
        if name not in head:
            continue
        group = head[name]
        mean, half = mean_band([r.cum_regret for r in group])
        k = np.arange(1, len(mean) + 1)
        idx = _thin(len(k))
        on_top = 3 if name == "async_coop_lsvi" else 2  # async is the subject; draw it above the rest
        ax.plot(k[idx], mean[idx], color=COLORS[name], zorder=on_top, label=f"{LABELS[name]} ({len(group)} seeds)")
        ax.fill_between(k[idx], (mean - half)[idx], (mean + half)[idx], color=COLORS[name], alpha=0.2)
        if name == "lsvi_ucb_pooled":
            ref = sqrt_reference(k, mean)
            ax.plot(k[idx], ref[idx], "k--", lw=1, label=f"fitted {ref[-1] / math.sqrt(k[-1]):.2f} sqrt(K) (to pooled)")
    ax.set_xlabel("episodes K (all agents together)")
    ax.set_ylabel("cumulative regret  sum_k V*_1(s_1) - V^pi_k_1(s_1)  (reward units)")
    ax.set_title(f"LSVI family on a linear MDP, M = {workers} agents, uniform schedule\n"
                 "mean and 95% band over seeds")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, out / "regret_vs_K.png")


def plot_communication_vs_k(runs: list[RegretRun], out: Path, workers: int = 10) -> Optional[Path]:
    """Plot 2: rounds and bytes vs K (log y), bands over seeds, fitted a + b log K reference for async."""
    import matplotlib.pyplot as plt

    head = headline_runs(runs, workers)
    if not head:
        return None
    fig, (ax_rounds, ax_bytes) = plt.subplots(1, 2, figsize=(12, 5))
    for name in FAMILY:
        group = head.get(name)
        if not group or group[0].comm_rounds[-1] == 0:
            continue
        for ax, attr, scale in ((ax_rounds, "comm_rounds", 1.0), (ax_bytes, "comm_bytes", 1e-6)):
            mean, half = mean_band([getattr(r, attr) * scale for r in group])
            k = np.arange(1, len(mean) + 1)
            idx = _thin(len(k))
            ax.plot(k[idx], mean[idx], color=COLORS[name], label=f"{LABELS[name]} ({len(group)} seeds)")
            # on a log axis, a band reaching zero would swamp the plot: floor it at half the mean
            ax.fill_between(k[idx], np.maximum(mean - half, 0.5 * mean)[idx], (mean + half)[idx],
                            color=COLORS[name], alpha=0.2)
            if name == "async_coop_lsvi":
                ref = log_reference(k, mean)
                shown = idx[(k[idx] >= 1000) & (ref[idx] > 0)]
                ax.plot(k[shown], ref[shown], "k--", lw=1.5, label="a + b log K fitted to async over K >= 1000")
    if "lsvi_ucb_independent" in head:
        ax_rounds.plot([], [], color=COLORS["lsvi_ucb_independent"], label="independent: 0 rounds, 0 bytes")
    for ax, what in ((ax_rounds, "communication rounds (uploads reaching the server)"),
                     (ax_bytes, "bytes exchanged, up + down (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("episodes K (all agents together, log scale)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Communication of the LSVI family, M = {workers} agents: async grows like log K\n"
                 "mean and 95% band over seeds")
    return _save(fig, out / "communication_vs_K.png")


def plot_rounds_vs_m(runs: list[RegretRun], out: Path) -> Optional[Path]:
    """Plot 3: async rounds vs M at alpha = 1/M^2 (log-log) with a fitted slope and an M^2 reference."""
    import matplotlib.pyplot as plt

    over_m = runs_over_workers(runs)
    if len(over_m) < 2:
        return None
    ms = np.array(list(over_m), dtype=float)
    stats_ = [mean_band([[r.comm_rounds[-1]] for r in g]) for g in over_m.values()]
    mean = np.array([s[0][0] for s in stats_])
    half = np.array([s[1][0] for s in stats_])
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.errorbar(ms, mean, yerr=half, fmt="o-", color=COLORS["async_coop_lsvi"], capsize=4,
                label=f"Async-Coop-LSVI, alpha = 1/M^2 (mean, 95% CI; {_seeds_note(over_m.values())} seeds)")
    slope = loglog_slope(ms, mean)
    ax.plot(ms, mean[0] * (ms / ms[0]) ** 2, "k--", lw=1, label="M^2 reference (through the first point)")
    ax.plot([], [], " ", label=f"fitted log-log slope {slope:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(ms, [str(int(m)) for m in ms])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("agents M (log scale)")
    ax.set_ylabel("communication rounds over the whole run (log scale)")
    k = len(next(iter(over_m.values()))[0].cum_regret)
    ax.set_title(f"Rounds vs number of agents, K = {k} episodes, uniform schedule")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, out / "rounds_vs_M.png")


def plot_regret_vs_alpha(runs: list[RegretRun], out: Path, workers: int = 10) -> Optional[Path]:
    """Plot 4: async regret and rounds vs alpha (log x): fewer rounds cost regret."""
    import matplotlib.pyplot as plt

    over_alpha = runs_over_alpha(runs, workers)
    if len(over_alpha) < 2:
        return None
    alphas = np.array(list(over_alpha))
    regret = [mean_band([[r.cum_regret[-1]] for r in g]) for g in over_alpha.values()]
    rounds = [mean_band([[r.comm_rounds[-1]] for r in g]) for g in over_alpha.values()]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.errorbar(alphas, [m[0] for m, _ in regret], yerr=[h[0] for _, h in regret], fmt="o-",
                color="tab:blue", capsize=4, label="cumulative regret (left axis)")
    ax.set_xscale("log")
    ax.set_xlabel("alpha of the determinant trigger (log scale; 1/M^2 = %.3g)" % (1.0 / workers ** 2))
    ax.set_ylabel("cumulative regret at the end of the run (reward units)", color="tab:blue")
    twin = ax.twinx()
    twin.errorbar(alphas, [m[0] for m, _ in rounds], yerr=[h[0] for _, h in rounds], fmt="s--",
                  color="tab:orange", capsize=4, label="communication rounds (right axis, log)")
    twin.set_yscale("log")
    twin.set_ylabel("communication rounds over the run (log scale)", color="tab:orange")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper center")
    k = len(next(iter(over_alpha.values()))[0].cum_regret)
    ax.set_title(f"Async-Coop-LSVI trade-off, M = {workers}, K = {k}: mean and 95% CI over "
                 f"{_seeds_note(over_alpha.values())} seeds")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, out / "regret_vs_alpha.png")


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def regret_report(root: Path, out: Optional[Path] = None, workers: int = 10) -> tuple[list[Path], dict]:
    """Draw every plot the runs below ``root`` allow and compute the acceptance figures.

    The lead can wire this as ``marlq regret SWEEP_DIR``. Raises ValueError if no LSVI run is found.
    """
    import matplotlib

    matplotlib.use("Agg")
    runs = find_runs(root)
    if not runs:
        raise ValueError(f"{root}: no completed LSVI-family run directories found")
    out = Path(out) if out else Path(root) / "plots"
    drawn = [plot_regret_vs_k(runs, out, workers), plot_communication_vs_k(runs, out, workers),
             plot_rounds_vs_m(runs, out), plot_regret_vs_alpha(runs, out, workers)]
    figures = acceptance_figures(runs, workers)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regret_figures.json").write_text(json.dumps(figures, indent=2, default=str))
    return [p for p in drawn if p is not None], figures


def sweep_commands(config: str, root: Path, seeds: int, jobs: int) -> list[list[str]]:
    """The three ``marlq sweep`` calls behind the four plots (algorithms at M=10, async over M and alpha)."""
    base = [sys.executable, "-m", "marl_q.cli", "sweep", config, "--seeds", str(seeds), "--jobs", str(jobs),
            "--no-plot"]
    return [
        base + ["--out", str(root / "algorithms"), "--set", "backend.workers=10",
                "--grid", "algorithm.name=" + ",".join(FAMILY)],
        base + ["--out", str(root / "workers"), "--set", "algorithm.name=async_coop_lsvi",
                "--grid", "backend.workers=2,5,20"],
        base + ["--out", str(root / "alpha"), "--set", "algorithm.name=async_coop_lsvi",
                "--set", "backend.workers=10", "--grid", "algorithm.alpha=0.1,1,10"],
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Regret and communication plots of the LSVI family from a sweep folder (--run CONFIG runs the sweeps first)."""
    parser = argparse.ArgumentParser(prog="marlq regret", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", nargs="?", help="folder holding LSVI run directories")
    parser.add_argument("--run", metavar="CONFIG", help="first run the sweeps for CONFIG into --out")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", help="sweep folder (with --run) or plot folder")
    parser.add_argument("--workers", type=int, default=10, help="M of the headline plots")
    args = parser.parse_args(argv)
    if args.run:
        root = Path(args.out or "sweeps/regret")
        for cmd in sweep_commands(args.run, root, args.seeds, args.jobs):
            print("$ " + " ".join(cmd[1:]), flush=True)
            code = subprocess.call(cmd)
            if code != 0:
                return code
        plots_dir = root / "plots"
    elif args.sweep_dir:
        root, plots_dir = Path(args.sweep_dir), Path(args.out) if args.out else None
    else:
        parser.error("give SWEEP_DIR, or --run CONFIG")
        return 2
    try:
        paths, figures = regret_report(root, plots_dir, args.workers)
    except ValueError as exc:
        print(f"regret: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"plot: {path}")
    print(json.dumps(figures, indent=2, default=str))
    return 0


COMMANDS = {"regret": main}

if __name__ == "__main__":
    sys.exit(main())
