"""`marlq compare RUNS_A RUNS_B [...]`: Meyer et al.'s sample complexity and outperformance test between
configurations, with the IQM and probability of improvement of their final returns.

Each argument is a sweep folder, a run directory or a (quoted) glob of run directories. The runs are
grouped as `marlq plot` and `marlq report` group them (configs that differ only in run.seed); when that
leaves one group but each argument holds two runs or more, each argument is a group. Per group: the number
of runs, the sample complexity Ŝ(epsilon, delta) with its cluster-bootstrap interval and the IQM of the
final returns with its interval; per pair: P(improvement) with its interval and the outperformance verdict.
The table is printed; the figure (Ŝ per group, and the fraction of runs above the level against env steps)
and the numbers as JSON are written to --out. Definitions: `analysis.sample_complexity`,
docs/statistics.md.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from analysis import plots
from analysis import sample_complexity as sc
from marl_q.errors import RunDirError, UserError

DEFAULT_EPSILON, DEFAULT_DELTA = 0.1, 0.5
BOOTSTRAP_REPS = 2000
GRID_POINTS = 500  # evaluation points when the runs do not share theirs
REPORT_MIN_RUNS = 20  # marlq report adds the table when every group has at least this many runs
METRICS = {"return": "training episode return, trailing mean over run.solve_window episodes (metrics.csv)",
           "eval_return": "mean greedy evaluation return (eval.csv, written with run.eval_every)"}
FIGURE, NUMBERS = "sample_complexity.png", "sample_complexity.json"


@dataclass
class Curve:
    """One run's metric against env steps: NaN where there is no value yet (a trailing mean before its
    first full window); ``final`` its last value, ``best`` the highest single value it recorded."""

    steps: np.ndarray
    values: np.ndarray
    final: float
    best: float


@dataclass
class GroupResult:
    label: str
    runs: int
    complexity: sc.Estimate
    fraction: np.ndarray  # (T,) fraction of runs above the level at each evaluation point
    band: tuple[np.ndarray, np.ndarray]  # its cluster-bootstrap percentile band
    finals: np.ndarray
    iqm: sc.Estimate


@dataclass
class PairResult:
    a: str
    b: str
    improvement: sc.Estimate  # P(final return of a run of a > that of a run of b)
    verdict: int  # 1: a outperforms b, -1: b outperforms a, 0: neither


@dataclass
class Comparison:
    metric: str
    epsilon: float
    delta: float
    optimum: float
    optimum_source: str
    baseline: float
    level: float
    steps: np.ndarray
    reps: int
    groups: list[GroupResult] = field(default_factory=list)
    pairs: list[PairResult] = field(default_factory=list)


# ----------------------------------------------------------------------------- runs
def expand(arg: str) -> list[Path]:
    """The run directories an argument names: a sweep folder or run directory, or a glob of them."""
    if Path(arg).exists():
        return plots.find_runs([Path(arg)])
    if any(ch in arg for ch in "*?["):
        found: list[Path] = []
        matches = sorted(glob.glob(arg))
        for m in matches:
            try:
                found.extend(plots.find_runs([Path(m)]))
            except RunDirError:
                continue
        if not found:
            raise UserError(f"{arg}: " + (f"none of its {len(matches)} matches holds a run directory" if matches
                                          else "matches no path"))
        return found
    raise UserError(f"{arg}: no such file or directory")


def load_groups(args: Sequence[str]) -> dict[str, list[plots.Run]]:
    """Runs of every argument, grouped as plot and report group them (or one group per argument when
    that leaves one group and each argument holds at least two runs)."""
    per_arg = [expand(a) for a in args]
    runs: dict[Path, plots.Run] = {}
    for dirs in per_arg:
        for d in dirs:
            if d.resolve() not in runs:
                runs[d.resolve()] = plots.load_run(d, with_comm=False)
    groups = plots.group_runs(list(runs.values()))
    owners = [{d.resolve() for d in dirs} for dirs in per_arg]
    disjoint = sum(len(o) for o in owners) == len(set().union(*owners))
    if len(groups) == 1 and len(args) > 1 and disjoint and all(len(o) >= 2 for o in owners):
        groups = {arg: [runs[p] for p in sorted(o)] for arg, o in zip(args, owners)}
    return groups


def curve(run: plots.Run, metric: str) -> Curve:
    """A run's ``metric`` against env steps (see METRICS); a UserError naming the run when it has none."""
    if metric == "return":
        m = run.metrics
        if "return" not in m or "env_steps" not in m:
            raise UserError(f"{run.path}: metrics.csv has no 'return' and 'env_steps' columns")
        ok = np.isfinite(m["return"].astype(float)) & np.isfinite(m["env_steps"].astype(float))
        x, raw = m["env_steps"][ok].astype(float), m["return"][ok].astype(float)
        window = plots.solve_window(run)
        y = plots.smoothed(raw, window) if len(raw) else raw
        final = float(y[-1]) if len(y) else np.nan  # the mean of the last window episodes: final_return
        y = np.where(np.arange(len(y)) < window - 1, np.nan, y)  # full windows only, as steps_to_solve
        best = raw
    else:
        path = run.path / "eval.csv"
        if not path.is_file():
            raise UserError(f"{run.path}: no eval.csv; --metric eval_return needs runs made with run.eval_every")
        cols = plots.read_csv_columns(path)
        x, y = cols.get("env_steps", np.array([])).astype(float), cols.get("eval_return", np.array([])).astype(float)
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        final = float(y[-1]) if len(y) else np.nan
        best = cols["eval_max"].astype(float)[ok] if "eval_max" in cols else y
    if not len(x):
        raise UserError(f"{run.path}: no {metric} values")
    order = np.argsort(x, kind="stable")
    return Curve(x[order], y[order], final, float(np.nanmax(best)))


def common_steps(curves: Sequence[Curve]) -> np.ndarray:
    """The evaluation points: the runs' own when all share them, else GRID_POINTS even steps; both up to
    the last step every run reached."""
    end = min(float(c.steps[-1]) for c in curves)
    first = np.unique(curves[0].steps)
    if all(np.array_equal(np.unique(c.steps), first) for c in curves) and len(first) <= 5 * GRID_POINTS:
        return first[first <= end]
    return np.unique(np.round(np.linspace(end / GRID_POINTS, end, GRID_POINTS)))


def on_steps(c: Curve, steps: np.ndarray) -> np.ndarray:
    """The run's value at each step: its last value at or before it (NaN before its first)."""
    idx = np.searchsorted(c.steps, steps, side="right") - 1
    return np.where(idx >= 0, c.values[np.maximum(idx, 0)], np.nan)


# ----------------------------------------------------------------------------- numbers
def check_options(epsilon: float, delta: float, metric: str) -> None:
    """A UserError for ε or δ outside (0, 1) or an unknown metric."""
    for name, value in (("--epsilon", epsilon), ("--delta", delta)):
        if not 0.0 < value < 1.0:
            raise UserError(f"{name}: must be in (0, 1), got {value:g}")
    if metric not in METRICS:
        raise UserError(f"--metric: unknown metric {metric!r} (choices: {', '.join(METRICS)})")


def compare_groups(groups: dict[str, list[plots.Run]], metric: str = "return", epsilon: float = DEFAULT_EPSILON,
                   delta: float = DEFAULT_DELTA, optimum: Optional[float] = None, baseline: float = 0.0,
                   reps: int = BOOTSTRAP_REPS, rng: Optional[np.random.Generator] = None) -> Comparison:
    """Every group's Ŝ and IQM with intervals and every pair's P(improvement) and verdict, on the evaluation
    points all runs share; bad input (ε or δ outside (0, 1), a group of one run, a metric a run lacks) is a
    UserError."""
    check_options(epsilon, delta, metric)
    for label, runs in groups.items():
        if len(runs) < 2:
            where = f" ({runs[0].path})" if runs else ""
            raise UserError(f"group {label!r} has {len(runs)} run{where}; the estimator and its bootstrap need "
                            "at least 2 runs per group")
    rng = np.random.default_rng(0) if rng is None else rng
    curves = {label: [curve(r, metric) for r in runs] for label, runs in groups.items()}
    every = [c for cs in curves.values() for c in cs]
    source = "--optimum"
    if optimum is None:
        optimum = max(c.best for c in every)
        source = f"the best {'episode return' if metric == 'return' else 'evaluation return'} of any run"
    if not optimum > baseline:
        raise UserError(f"--optimum {optimum:g} is not above --baseline {baseline:g}; give --baseline "
                        "(the return normalised to 0, e.g. a random policy's)")
    steps = common_steps(every)
    out = Comparison(metric, epsilon, delta, float(optimum), source, baseline, sc.level(epsilon, optimum, baseline),
                     steps, reps)
    for label, cs in curves.items():
        hits = sc.above_level(np.vstack([on_steps(c, steps) for c in cs]), epsilon, optimum, baseline)
        est, fractions = sc.bootstrap_sample_complexity(steps, hits, delta, rng, reps)
        finals = np.array([c.final for c in cs])
        band = sc.percentile_interval(fractions, sc.SC_LEVEL)
        out.groups.append(GroupResult(label, len(cs), est, hits.mean(axis=0), band, finals,
                                      sc.iqm_ci(finals, rng, reps)))
    for i, a in enumerate(out.groups):
        for b in out.groups[i + 1:]:
            better = sc.probability_of_improvement_ci(a.finals, b.finals, rng, reps)
            out.pairs.append(PairResult(a.label, b.label, better, sc.verdict(a.complexity, b.complexity)))
    return out


def steps_text(value: float, end: float) -> str:
    return f"{value:,.0f}" if np.isfinite(value) else f"not reached by {end:,.0f}"


def estimate_text(e: sc.Estimate, digits: int = 2) -> str:
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def complexity_text(e: sc.Estimate, end: float) -> str:
    hi = f"{e.high:,.0f}" if np.isfinite(e.high) else "not reached"
    lo = f"{e.low:,.0f}" if np.isfinite(e.low) else "not reached"
    return f"{steps_text(e.value, end)} [{lo}, {hi}]"


def verdict_text(p: PairResult) -> str:
    said = {1: f"{p.a} outperforms {p.b}", -1: f"{p.b} outperforms {p.a}", 0: "no verdict (intervals overlap)"}
    return said[p.verdict]


def table_rows(c: Comparison) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(header, rows) of the per-configuration table and of the pairs table."""
    end = float(c.steps[-1])
    pct = f"{sc.SC_LEVEL:.0%}"
    head = ["configuration", "runs", f"sample complexity Ŝ (env steps) [{pct} cluster bootstrap]",
            f"IQM final {c.metric} [{sc.AGGREGATE_LEVEL:.0%} CI]"]
    rows = [[g.label, str(g.runs), complexity_text(g.complexity, end), estimate_text(g.iqm)] for g in c.groups]
    pair_head = ["A", "B", f"P(A > B), final {c.metric} [{sc.AGGREGATE_LEVEL:.0%} CI]", "outperformance (Ŝ)"]
    pair_rows = [[p.a, p.b, estimate_text(p.improvement), verdict_text(p)] for p in c.pairs]
    return head, rows, pair_head, pair_rows


def describe(c: Comparison) -> str:
    """One paragraph: what was compared, at which level, on which evaluation points."""
    return (f"Metric: {METRICS[c.metric]}. Level: {c.level:g} = {c.baseline:g} + (1 - ε) × ({c.optimum:g} - "
            f"{c.baseline:g}) with ε = {c.epsilon:g}, optimum {c.optimum:g} ({c.optimum_source}), baseline "
            f"{c.baseline:g}. Ŝ: the env steps of the first evaluation point at which at least δ = {c.delta:g} of "
            f"the runs are above the level (Meyer et al. 2025), read at {len(c.steps)} points up to "
            f"{c.steps[-1]:,.0f} env steps (the last step every run reached; each run's latest value at or before "
            f"each); interval: {sc.SC_LEVEL:.0%} percentile interval of {c.reps} cluster-bootstrap draws (runs "
            "resampled). A outperforms B when A's interval lies wholly below B's. IQM and P(A > B): of each run's "
            f"final {c.metric}, {sc.AGGREGATE_LEVEL:.0%} bootstrap intervals (rliable's definitions). "
            "See docs/statistics.md.")


def format_table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left`` (text) and the last left-aligned."""
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(v.ljust(w) if i < left or i == len(r) - 1 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(r, widths))).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def as_dict(c: Comparison) -> dict[str, Any]:
    """The numbers of a comparison as JSON-ready values (inf as null: not reached)."""
    def num(v: float) -> Optional[float]:
        return float(v) if np.isfinite(v) else None

    def est(e: sc.Estimate) -> dict[str, Optional[float]]:
        return {"value": num(e.value), "low": num(e.low), "high": num(e.high)}
    return {"metric": c.metric, "epsilon": c.epsilon, "delta": c.delta, "optimum": c.optimum,
            "optimum_source": c.optimum_source, "baseline": c.baseline, "level": c.level,
            "last_step": float(c.steps[-1]), "points": len(c.steps), "reps": c.reps,
            "groups": [{"label": g.label, "runs": g.runs, "sample_complexity": est(g.complexity),
                        "iqm_final": est(g.iqm)} for g in c.groups],
            "pairs": [{"a": p.a, "b": p.b, "p_improvement": est(p.improvement), "verdict": p.verdict}
                      for p in c.pairs]}


# ----------------------------------------------------------------------------- figure
def plot_comparison(c: Comparison, path: Path, title: str = "") -> Path:
    """Left: Ŝ per group with its interval (a hollow marker at the last step: not reached; an arrow: the
    upper end not reached). Right: the fraction of runs above the level against env steps, its bootstrap
    band, δ and each group's Ŝ."""
    fig, axes = plots.new_figure((12.0, 4.8), 1, 2)
    left, right = axes[0]
    end = float(c.steps[-1])
    colors = [f"C{i % 10}" for i in range(len(c.groups))]
    for i, (g, color) in enumerate(zip(c.groups, colors)):
        e = g.complexity
        value = e.value if e.reached else end
        low = e.low if np.isfinite(e.low) else end
        high = e.high if np.isfinite(e.high) else end
        left.errorbar([i], [value], yerr=[[value - low], [high - value]], fmt="o", color=color, capsize=6,
                      markerfacecolor=color if e.reached else "white", markersize=8)
        if not np.isfinite(e.high):
            left.annotate("", xy=(i, end * 1.06), xytext=(i, end), arrowprops={"arrowstyle": "->", "color": color})
        if not e.reached:
            last = i == len(c.groups) - 1  # the rightmost label goes left of its marker, inside the axes
            left.annotate("not reached", (i, end), textcoords="offset points", xytext=(-8 if last else 8, -4),
                          ha="right" if last else "left", va="top", fontsize=8, color=color)
        right.plot(c.steps, g.fraction, color=color, label=f"{g.label} ({g.runs} runs)", drawstyle="steps-post")
        right.fill_between(c.steps, g.band[0], g.band[1], color=color, alpha=0.2, linewidth=0, step="post")
        if e.reached:
            right.axvline(e.value, color=color, linestyle="--", linewidth=1)
    left.axhline(end, color="grey", linestyle=":", linewidth=1, label=f"last step every run reached ({end:,.0f})")
    left.set_xticks(range(len(c.groups)), [plots.wrap(g.label, 18) for g in c.groups], fontsize=8)
    left.set_xlim(-0.6, len(c.groups) - 0.4)
    left.set_ylim(0, end * 1.12)
    left.set_ylabel("env steps")
    left.set_title(f"sample complexity Ŝ (ε={c.epsilon:g}, δ={c.delta:g}),\n{sc.SC_LEVEL:.0%} cluster-bootstrap "
                   "interval; lower is better", fontsize=9)
    right.axhline(c.delta, color="grey", linestyle=":", linewidth=1, label=f"δ = {c.delta:g}")
    right.set_ylim(0, 1.02)
    right.set_xlim(0, end)
    right.set_xlabel("env steps")
    right.set_ylabel(f"fraction of runs with {c.metric} > {c.level:g}")
    right.set_title(f"runs above the level (1-ε) of {c.optimum:g}; band: {sc.SC_LEVEL:.0%} cluster bootstrap,\n"
                    "dashed: Ŝ, the first step the fraction reaches δ", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    plots.steps_axis(left.yaxis)
    plots.steps_axis(right.xaxis)
    left.legend(fontsize=8, loc="lower right")
    right.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(plots.wrap(title, 120), fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plots.plt.close(fig)
    return path


# ----------------------------------------------------------------------------- command
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Meyer et al.'s sample complexity with cluster bootstrap intervals and their outperformance test
    between configurations, with IQM and P(improvement) of the final returns."""
    p = argparse.ArgumentParser(prog="marlq compare", description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("paths", nargs="+", metavar="RUNS",
                   help="a sweep folder, a run directory or a quoted glob of run directories")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON,
                   help=f"relative error: the level is (1 - ε) of the optimum (default {DEFAULT_EPSILON})")
    p.add_argument("--delta", type=float, default=DEFAULT_DELTA,
                   help="the fraction of runs that must be above the level (Meyer et al.'s threshold "
                        f"probability; default {DEFAULT_DELTA})")
    p.add_argument("--optimum", type=float, help="the optimal return (default: the best single value any run recorded)")
    p.add_argument("--baseline", type=float, default=0.0,
                   help="the return normalised to 0 (default 0; for negative returns, e.g. a random policy's)")
    p.add_argument("--metric", default="return", help=f"one of: {', '.join(METRICS)} (default return)")
    p.add_argument("--out", help="folder for the figure and JSON (default: the first RUNS folder's plots/)")
    p.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help=f"bootstrap draws (default {BOOTSTRAP_REPS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap's generator (default 0)")
    args = p.parse_args(argv)
    try:
        from marl_q.cli import out_dir

        if args.reps < 100:
            raise UserError(f"--reps: must be at least 100, got {args.reps}")
        for name in ("optimum", "baseline"):
            value = getattr(args, name)
            if value is not None and not np.isfinite(value):
                raise UserError(f"--{name}: must be a finite return, got {value}")
        check_options(args.epsilon, args.delta, args.metric)
        out = out_dir(args.out) if args.out else default_out(args.paths[0])
        groups = load_groups(args.paths)
        c = compare_groups(groups, args.metric, args.epsilon, args.delta, args.optimum, args.baseline, args.reps,
                           np.random.default_rng(args.seed))
        runs = [r for rs in groups.values() for r in rs]
        out.mkdir(parents=True, exist_ok=True)
        figure = plot_comparison(c, out / FIGURE, plots.describe(runs))
        (out / NUMBERS).write_text(json.dumps(as_dict(c), indent=1) + "\n")
    except UserError as exc:
        print(f"marlq compare: error: {exc}", file=sys.stderr)
        return 2
    head, rows, pair_head, pair_rows = table_rows(c)
    print(describe(c))
    print()
    print(format_table(head, rows))
    if pair_rows:
        print()
        print(format_table(pair_head, pair_rows, left=2))
    print()
    print(f"figure: {figure}")
    print(f"numbers: {out / NUMBERS}")
    return 0


def default_out(first: str) -> Path:
    """``plots/`` in the first argument's folder (for a glob: the folder before its first wildcard)."""
    if Path(first).is_dir():
        return Path(first) / "plots"
    cut = min((first.index(ch) for ch in "*?[" if ch in first), default=len(first))
    prefix = first[:cut]
    return (Path(prefix) if prefix.endswith("/") else Path(prefix).parent) / "plots"


COMMANDS = {"compare": main}  # marlq compare ...

if __name__ == "__main__":
    sys.exit(main())
