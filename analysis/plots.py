"""Plots from run directories alone: learning curves with 95% bands over seeds, traffic, staleness.

Runs whose resolved configs differ only in `run.seed` form one group (one line; a band only where the
group has at least two seeds). The legend names each group by the few keys that differ between groups;
the title says what was run (algorithms, scenario and env, heads, then aggregation, staleness rule and
stragglers where they have an effect, backend, seeds).
Returns are smoothed over the runs' `run.solve_window` episodes (100 by default), the window
`steps_to_solve` uses, so a curve crosses the solved line where the summary says it does.
"""
from __future__ import annotations

import csv
import json
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from analysis.stats import clipped_band, mean_ci  # noqa: E402
import yaml  # noqa: E402

from marl_q.errors import RunDirError  # noqa: E402
from marl_q.rundir import open_run_text, run_file  # noqa: E402
from marl_q.teams import RETURNS_FILE  # noqa: E402

SMOOTH_EPISODES = 100  # the default of run.solve_window; each run's own solve_window is used when set
GRID_POINTS = 200
LABEL_KEYS_MAX = 3  # keys named in a legend label; more are counted ("+2 more")
LABEL_CHARS_MAX = 40
IGNORED_KEYS = {"run.seed", "run.progress", "run.plots"}
QUANTUM_HEADS = {"vqc", "hybrid", "diffqas"}


@dataclass
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]
    metrics: dict[str, np.ndarray]
    summary: dict[str, Any]
    comm: Optional[dict[str, np.ndarray]] = None
    flat: dict[str, Any] = field(default_factory=dict)
    quantum: Optional[dict[str, np.ndarray]] = None  # quantum.csv: the circuit heads' resource ledger
    returns: Optional[dict[str, np.ndarray]] = None  # returns.csv: per-team and per-agent returns (marl_q/teams.py)

    @property
    def algorithm(self) -> str:
        """The algorithm as titles and labels name it: ``algorithm.name``, or with one learner per team
        (``learners:``) each team's, ``mappo (good) vs ippo (adv)``."""
        name = str(self.config.get("algorithm", {}).get("name"))
        learners = self.config.get("learners")
        if not isinstance(learners, dict) or not learners:
            return name
        return " vs ".join(f"{(keys or {}).get('name', name)} ({team})" for team, keys in learners.items())

    @property
    def clock(self) -> str:
        return "virtual time (s)" if self.config.get("backend", {}).get("name") == "sim" else "wall time (s)"



def new_figure(figsize: tuple[float, float], nrows: int = 1, ncols: int = 1) -> tuple[Any, Any]:
    """A figure with constrained layout (legends and titles get their room; no tight-layout warnings)."""
    return plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, layout="constrained")


def save_figure(fig: Any, ax: Any, path: Path, legend_title: Optional[str] = None) -> Path:
    """The house finish of a one-axes plot: light grid, legend, PNG at 120 dpi; closed."""
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, title=legend_title, title_fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def steps_label(x: float, _pos: Any = None) -> str:
    """An env-step tick as people read it: 0, 500, 250k, 1.5M (not 1e6 in the axis corner)."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:g}M"
    return f"{x / 1e3:g}k" if abs(x) >= 1e3 else f"{x:g}"


def steps_axis(axis: Any) -> None:
    """Label an axis of env steps with ``steps_label``'s ticks (``ax.xaxis`` or ``ax.yaxis``)."""
    axis.set_major_formatter(FuncFormatter(steps_label))


STEPS_LABEL = "environment steps (all workers)"


def steps_xlabel(ax: Any, label: str = STEPS_LABEL) -> None:
    """An x axis of env steps: its label and ``steps_label``'s ticks (250k, 1M: no 1e6 in the corner)."""
    ax.set_xlabel(label)
    steps_axis(ax.xaxis)


def wrap(text: str, width: int = 90) -> str:
    """Each line of a title wrapped at `width` characters."""
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in text.splitlines())

def read_csv_columns(path: Path) -> dict[str, np.ndarray]:
    """A CSV file as column arrays (numeric where every value parses); a run file may be gzip-compressed
    (``marl_q.rundir.open_run_text``: run.compress_logs)."""
    with open_run_text(path) as fh:
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
    comm = read_csv_columns(path / "comm.csv") if with_comm and run_file(path / "comm.csv") is not None else None
    run = Run(path, config, read_csv_columns(path / "metrics.csv"), summary, comm)
    run.flat = flatten(config)
    if (path / "quantum.csv").is_file():
        run.quantum = read_csv_columns(path / "quantum.csv")
    if (path / RETURNS_FILE).is_file():
        run.returns = read_csv_columns(path / RETURNS_FILE)
    return run


def team_names(run: Run) -> list[str]:
    """The run's teams, in returns.csv's order (none without the file)."""
    return [c[len("team:"):] for c in (run.returns or {}) if c.startswith("team:")]


def agent_names(run: Run) -> list[str]:
    return [c[len("agent:"):] for c in (run.returns or {}) if c.startswith("agent:")]


def report_team(run: Run) -> Optional[str]:
    """The team whose return is the run's ``return`` (run.report_team, else the first); None without teams."""
    names = team_names(run)
    if not names:
        return None
    return run.config.get("run", {}).get("report_team") or names[0]


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


def _values(runs: list[Run], key: str) -> list[str]:
    """The distinct values of a flat config key over runs, in order of first appearance."""
    out: list[str] = []
    for r in runs:
        v = str(r.flat.get(key))
        if v not in out:
            out.append(v)
    return out


def differing_keys(groups: list[list[Run]]) -> list[str]:
    """The keys whose value differs between groups, less those a differing choice implies (when
    `actor.head` differs, the head's own options under `actor.` say nothing more), the title's keys first."""
    if len(groups) < 2:
        return []
    runs = [g[0] for g in groups]
    all_keys = set().union(*(r.flat for r in runs)) - IGNORED_KEYS
    differ = {k for k in all_keys if len({str(r.flat.get(k)) for r in runs}) > 1}
    for choice in ("scenario.name", "algorithm.name", "actor.head", "critic.head"):
        if choice in differ:
            section = choice.split(".")[0] + "."
            differ = {k for k in differ if k == choice or not k.startswith(section)}
    first = ["algorithm.name", "actor.head", "critic.head", "server.aggregation", "server.staleness.rule",
             "backend.compute.stragglers", "backend.compute.straggler_factor", "scenario.name"]
    return [k for k in first if k in differ] + sorted(differ - set(first))


def short_key(key: str) -> str:
    """`algorithm.name` -> algorithm, `actor.head` -> actor, `server.staleness.rule` -> staleness, else the last part."""
    parts = key.split(".")
    if parts[-1] in ("name", "head", "rule") and len(parts) > 1:
        return parts[-2]
    return parts[-1]


def _clip(text: str, limit: int = LABEL_CHARS_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Group by config minus the seed; label each group by the few keys that differ between groups
    (just the value when one key differs: its name is the legend's title, see `legend_key`)."""
    keyed: dict[tuple, list[Run]] = {}
    for r in runs:
        key = tuple(sorted((k, str(v)) for k, v in r.flat.items() if k not in IGNORED_KEYS))
        keyed.setdefault(key, []).append(r)
    groups = list(keyed.values())
    if len(groups) == 1:
        r = groups[0][0]
        return {f"{r.algorithm} on {scenario_label(r)}": groups[0]}
    keys = label_keys(groups, differing_keys(groups))
    out: dict[str, list[Run]] = {}
    for g in groups:
        if len(keys) == 1:
            label = str(g[0].flat.get(keys[0]))
        else:
            named = [f"{short_key(k)}={g[0].flat.get(k)}" for k in keys]

            def text(n: int) -> str:
                return ", ".join(named[:n]) + (f", +{len(named) - n} more" if n < len(named) else "")
            n = min(len(named), LABEL_KEYS_MAX)
            while n > 1 and len(text(n)) > LABEL_CHARS_MAX:  # fewer keys, counted, rather than cut text
                n -= 1
            label = text(n)
        label = _clip(label) if keys else f"group {len(out) + 1}"
        while label in out:  # two groups that read the same after clipping
            label += "'"
        out[label] = g
    return out


def label_keys(groups: list[list[Run]], keys: list[str]) -> list[str]:
    """The differing keys a group label names, less those that are zero where set and unset elsewhere
    (the zero sub-keys of a `noise:` section present in some groups, null in the rest), when the other
    keys alone tell every group apart."""
    def idle(key: str) -> bool:
        values = {str(g[0].flat.get(key)) for g in groups if g[0].flat.get(key) is not None}
        return values <= {"0", "0.0", "False", "[]", "{}"}

    telling = [k for k in keys if not idle(k)]
    if telling and len(telling) < len(keys):
        if len({tuple(str(g[0].flat.get(k)) for k in telling) for g in groups}) == len(groups):
            return telling
    return keys


def legend_key(runs: list[Run]) -> Optional[str]:
    """The one config key that tells the groups apart, when exactly one does (the legend's title)."""
    groups = {}
    for r in runs:
        groups.setdefault(tuple(sorted((k, str(v)) for k, v in r.flat.items() if k not in IGNORED_KEYS)), r)
    keys = differing_keys([[r] for r in groups.values()])
    return keys[0] if len(keys) == 1 else None


def _heads(runs: list[Run]) -> str:
    actor, critic = _values(runs, "actor.head"), _values(runs, "critic.head")
    if actor == ["mlp"] and critic == ["mlp"]:
        return "classical heads"

    def one(role: str, names: list[str]) -> str:
        if names == ["mlp"]:
            return f"classical {role}"
        if len(names) == 1:
            kind = "quantum" if names[0] in QUANTUM_HEADS else "classical"
            return f"{kind} {role} ({names[0]})"
        return f"{role} {'/'.join(names)}"
    return f"{one('actor', actor)}, {one('critic', critic)}"


def scenario_label(run: Run) -> str:
    """A run's scenario as titles name it (``marl_q.config.scenario_label``: the env id for the generic ones)."""
    from marl_q.config import scenario_label as label

    return label(run.flat.get("scenario.name"), run.flat.get("scenario.env"))


def effective_settings(run: Run) -> dict[str, Optional[str]]:
    """What a title says of a run's aggregation, staleness rule and stragglers; None for a setting that has
    no effect on it: with one worker the aggregation (unless buffered over K > 1 pushes), the staleness
    rule and stragglers; under `sync` the staleness rule (the barrier averages whole rounds, unweighted);
    stragglers off the sim backend (only its compute profile has them)."""
    f = run.flat
    workers = int(f.get("backend.workers") or 1)
    agg, k = str(f.get("server.aggregation")), f.get("server.buffer_k", 4)
    buffered = agg == "buffered"
    aggregation = None
    if workers > 1 or (buffered and int(k) > 1):
        aggregation = f"buffered (K={k}) aggregation" if buffered else f"{agg} aggregation"
    staleness = None
    if workers > 1 and agg != "sync":
        cap = f.get("server.max_staleness")
        staleness = f"staleness {f.get('server.staleness.rule')}" + (f" (max {cap})" if cap is not None else "")
    stragglers = None
    if workers > 1 and f.get("backend.name") == "sim":
        who = f.get("backend.compute.stragglers")
        factor = f.get("backend.compute.straggler_factor", 1.0)
        stragglers = "no stragglers" if who in (None, "[]") or factor == 1.0 else f"stragglers {who} x{factor:g}"
    return {"aggregation": aggregation, "staleness": staleness, "stragglers": stragglers}


def describe(runs: list[Run]) -> str:
    """A title from what was run: algorithms (all of them), scenario (with the env of a generic one), heads,
    then the aggregation, staleness rule and stragglers where they have an effect (`effective_settings`),
    backend, workers and seeds; a value that differs between runs is shown as `a/b/c`."""
    algos = list(dict.fromkeys(r.algorithm for r in runs))
    scen = list(dict.fromkeys(scenario_label(r) for r in runs))
    first = f"{' vs '.join(algos)} on {'/'.join(scen)}, {_heads(runs)}"
    backend = "/".join(_values(runs, "backend.name"))
    workers = _values(runs, "backend.workers")
    per_group: dict[tuple, set] = {}
    for r in runs:
        key = tuple(sorted((k, str(v)) for k, v in r.flat.items() if k not in IGNORED_KEYS))
        per_group.setdefault(key, set()).add(r.flat.get("run.seed"))
    counts = sorted({len(s) for s in per_group.values()})
    each = " each" if len(per_group) > 1 else ""
    seeds = f"{'/'.join(map(str, counts))} seed{'s' if counts != [1] else ''}{each}"
    said = [effective_settings(r) for r in runs]
    parts = []
    for slot in ("aggregation", "staleness", "stragglers"):
        values = list(dict.fromkeys(s[slot] for s in said if s[slot] is not None))
        if values:
            parts.append(" / ".join(values))
    parts += [f"{backend} x{'/'.join(workers)} worker{'' if workers == ['1'] else 's'}", seeds]
    return f"{first}\n{', '.join(parts)}"


def resolve_labels(items: list[str], groups: dict[str, list[Run]], paths: list[Path]) -> dict[str, str]:
    """--label KEY=TEXT items -> {group label: TEXT}. KEY names a group by its automatic label, by a run
    directory in it, or by a path given on the command line that holds runs of that group only."""
    from marl_q.errors import UserError

    out: dict[str, str] = {}
    for item in items:
        hit = None
        for i in [j for j, ch in enumerate(item) if ch == "="]:
            key, text = item[:i].strip(), item[i + 1:]
            if key in groups:
                hit = (key, text)
                break
            where = Path(key).resolve() if key else None
            owners = {label for label, runs in groups.items() for r in runs
                      if where is not None and (r.path.resolve() == where or where in r.path.resolve().parents)}
            if len(owners) == 1:
                hit = (owners.pop(), text)
                break
        if hit is None:
            names = ", ".join(repr(g) for g in groups)
            raise UserError(f"--label: {item!r} names no group (a path given, a run directory, or one of {names})")
        out[hit[0]] = hit[1]
    return out


def mean_band(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and the band drawn around it: the 95% t-interval over seeds, clipped at each x to the range
    the seeds themselves span there (`analysis.stats.clipped_band`), and NaN (no band) where fewer than
    two seeds have a value."""
    stack = np.vstack(curves)
    mean, half = mean_ci(stack)
    lo, hi = clipped_band(stack, mean, half)
    few = np.sum(np.isfinite(stack), axis=0) < 2
    lo, hi = np.where(few, np.nan, lo), np.where(few, np.nan, hi)
    return mean, lo, hi


def solve_window(run: Run) -> int:
    """The episodes of a run's trailing mean: its `run.solve_window` (what `steps_to_solve` uses)."""
    return int(run.config.get("run", {}).get("solve_window") or SMOOTH_EPISODES)


def smoothed(y: np.ndarray, window: int = SMOOTH_EPISODES) -> np.ndarray:
    """Trailing mean over the last `window` episodes (shorter at the start)."""
    c = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def _curve(run: Run, xkey: str, grid: np.ndarray) -> np.ndarray:
    x, y = run.metrics[xkey], smoothed(run.metrics["return"], solve_window(run))
    out = np.interp(grid, x, y)
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def band_text(counts: list[int]) -> Optional[str]:
    """What the shaded band is and over how many seeds (None when no group has two)."""
    banded = sorted({n for n in counts if n >= 2})
    if not banded:
        return None
    n = "/".join(map(str, banded))
    return f"shaded: 95% t-interval over {n} seeds,\nclipped at each x to the seeds' range"


def plot_learning(groups: dict[str, list[Run]], xkey: str, xlabel: str, title: str, path: Path,
                  labels: Optional[dict[str, str]] = None, legend_title: Optional[str] = None) -> Optional[Path]:
    if not any("return" in r.metrics and len(r.metrics["return"]) for g in groups.values() for r in g):
        return None
    labels = labels or {}
    fig, axes = new_figure((7.5, 4.8))
    ax = axes[0, 0]
    xmax = max(float(np.max(r.metrics[xkey])) for g in groups.values() for r in g if len(r.metrics[xkey]))
    grid = np.linspace(0.0, xmax, GRID_POINTS)
    counts = []
    for label, runs in groups.items():
        curves = [_curve(r, xkey, grid) for r in runs if len(r.metrics.get("return", []))]
        if not curves:
            continue
        counts.append(len(curves))
        mean, lo, hi = mean_band(curves)
        # the mean of "n seeds" only where all n have data: past the first seed's end it would be
        # the mean of the others, a jump that no run made
        partial = ~np.all(np.isfinite(np.vstack(curves)), axis=0)
        mean, lo, hi = (np.where(partial, np.nan, v) for v in (mean, lo, hi))
        n = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
        line, = ax.plot(grid, mean, label=f"{labels.get(label, label)} ({n})")
        if len(curves) > 1:
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    solve = next(iter(groups.values()))[0].config.get("run", {}).get("solve_return")
    if solve is not None:
        ax.axhline(solve, color="grey", linestyle=":", linewidth=1, label=f"solved ({solve:g})")
    windows = sorted({solve_window(r) for g in groups.values() for r in g})
    if xkey == "env_steps":
        steps_xlabel(ax, xlabel)
    else:
        ax.set_xlabel(xlabel)
    teams = sorted({str(report_team(r)) for g in groups.values() for r in g if len(team_names(r)) > 1})
    what = f"return of team {'/'.join(teams)}" if teams else "return"  # several teams: return is one team's
    ax.set_ylabel(f"{what}, mean of last {'/'.join(map(str, windows))} episodes\n(run.solve_window, as steps_to_solve)")
    ax.set_title(wrap(title), fontsize=10)
    band = band_text(counts)
    parts = [p for p in (legend_title, "line: mean over seeds" if band else None, band,
                         None if band else "1 seed per line: no band") if p]
    return save_figure(fig, ax, path, legend_title="\n".join(parts) or None)


def _column_curve(run: Run, column: str, grid: np.ndarray) -> np.ndarray:
    """returns.csv's ``column``, smoothed as ``return`` is (run.solve_window episodes), read on ``grid``
    (env steps); NaN outside the run. Episodes without the value (NaN: per-agent returns of episodes under
    way when a run from before returns.csv was resumed) are left out."""
    cols = run.returns or {}
    known = np.isfinite(np.asarray(cols[column], dtype=float))
    if not known.any():
        return np.full_like(grid, np.nan)
    x, y = cols["env_steps"][known], smoothed(np.asarray(cols[column], dtype=float)[known], solve_window(run))
    out = np.interp(grid, x, y)
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def plot_teams(groups: dict[str, list[Run]], title: str, path: Path, labels: Optional[dict[str, str]] = None,
               legend_title: Optional[str] = None) -> Optional[Path]:
    """Per-team returns (left: every team of every group in one axes) and per-agent returns (right)
    against env steps, from the runs' returns.csv; None when no run has one."""
    runs = [r for g in groups.values() for r in g if r.returns is not None and len(r.returns.get("env_steps", []))]
    if not runs:
        return None
    labels = labels or {}
    fig, axes = new_figure((12.5, 4.8), ncols=2)
    xmax = max(float(np.max(r.returns["env_steps"])) for r in runs)
    grid = np.linspace(0.0, xmax, GRID_POINTS)
    counts = []
    several = len(groups) > 1
    styles = ["-", "--", "-.", ":"]
    for ax, prefix, names_of in ((axes[0, 0], "team:", team_names), (axes[0, 1], "agent:", agent_names)):
        for g, (label, members) in enumerate(groups.items()):
            have = [r for r in members if r.returns is not None and len(r.returns.get("env_steps", []))]
            if not have:
                continue
            report = report_team(have[0]) if prefix == "team:" else None
            for k, name in enumerate(names_of(have[0])):
                curves = [_column_curve(r, prefix + name, grid) for r in have if prefix + name in r.returns]
                counts.append(len(curves))
                mean, lo, hi = mean_band(curves)
                partial = ~np.all(np.isfinite(np.vstack(curves)), axis=0)
                mean, lo, hi = (np.where(partial, np.nan, v) for v in (mean, lo, hi))
                n = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
                text = f"{name}{' (= return)' if name == report else ''}, {n}"
                if several:
                    text = f"{labels.get(label, label)}: {text}"
                # one group: a style per line, so that agents with equal rewards (simple_adversary's good
                # agents) show as a dashed line over a solid one; several: a style per group
                style = styles[(g if several else k) % len(styles)]
                line, = ax.plot(grid, mean, linestyle=style, label=_clip(text, 60))
                if len(curves) > 1:
                    ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        steps_xlabel(ax)
        ax.grid(alpha=0.3)
    windows = sorted({solve_window(r) for r in runs})
    mean_of = f"mean of last {'/'.join(map(str, windows))} episodes"
    axes[0, 0].set_ylabel(f"team return (its agents' rewards summed),\n{mean_of}")
    axes[0, 0].set_title("per team", fontsize=9)
    axes[0, 1].set_ylabel(f"agent return, {mean_of}")
    axes[0, 1].set_title("per agent", fontsize=9)
    band = band_text(counts)
    parts = [p for p in (legend_title, "line: mean over seeds" if band else None, band,
                         None if band else "1 seed per line: no band") if p]
    for ax in axes[0]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, title="\n".join(parts) or None, title_fontsize=8)
    fig.suptitle(wrap(title, 140), fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _cumulative_on(t: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A cumulative sum of `values` at times `t`, read at each grid time (step function)."""
    order = np.argsort(t, kind="stable")
    cum = np.concatenate([[0.0], np.cumsum(values[order])])
    return cum[np.searchsorted(t[order], grid, side="right")]


def workers_differ(per_worker: np.ndarray, tolerance: float = 0.05) -> bool:
    """Whether workers' cumulative curves (workers, grid) differ: their final totals spread by more than
    `tolerance` of the mean worker's (workers a step apart in time, with the same totals, are alike)."""
    if len(per_worker) < 2:
        return False
    final = per_worker[:, -1]
    return float(final.max() - final.min()) > tolerance * max(float(np.mean(final)), 1e-12)


RATE_WINDOW = (0.05, 0.25)  # traffic rates: a sliding window of 5-25% of the longest run's time ...
RATE_MESSAGES = 4  # ... wide enough to hold this many of a run's mean worker's uploads


def worker_totals(run: Run) -> dict[str, tuple[int, float]]:
    """Per worker of a run: its uploads (messages to the server) and its payload both ways in bytes, from
    comm.csv (injected faults are not traffic)."""
    c = run.comm
    traffic = np.array([not str(k).startswith("fault:") for k in c["kind"]], dtype=bool)
    src, dst, nbytes = c["src"].astype(str), c["dst"].astype(str), np.nan_to_num(c["bytes"])
    workers = sorted({w for w in np.concatenate([src, dst]) if w != "server"}, key=lambda w: (len(w), w))
    return {w: (int(np.sum(traffic & (src == w))), float(np.sum(nbytes[traffic & ((src == w) | (dst == w))])))
            for w in workers}


def rate_window(runs: list[Run], tmax: float, slowest: bool = False) -> float:
    """The sliding window of the traffic rates: `RATE_MESSAGES` intervals between the uploads of the mean
    worker (of the slowest worker with `slowest`) in the run where they are furthest apart, kept within
    `RATE_WINDOW` of the longest run's time (a window that holds one message or none draws spikes)."""
    widest = 0.0
    for r in runs:
        uploads = [n for n, _ in worker_totals(r).values()]
        n = (min(uploads) if slowest else float(np.mean(uploads))) if uploads else 0
        if n > 0:
            widest = max(widest, RATE_MESSAGES * float(np.max(r.comm["t"])) / n)
    return float(np.clip(widest, RATE_WINDOW[0] * tmax, RATE_WINDOW[1] * tmax))


def rate_on(t: np.ndarray, values: np.ndarray, grid: np.ndarray, width: float, end: float) -> np.ndarray:
    """`values` (events at times `t`) per unit time over a window of `width` centred on each grid time,
    moved inside [0, end] at the ends (same width throughout); NaN past `end` (the run had stopped)."""
    width = min(width, end) if end > 0 else width
    lo = np.clip(grid - width / 2, 0.0, max(end - width, 0.0))
    total = _cumulative_on(t, values, lo + width) - _cumulative_on(t, values, lo)
    # events at t = 0 (the first hellos) belong to the first window
    total = total + np.where(lo <= 0.0, np.sum(values[t <= 0.0]), 0.0)
    return np.where(grid <= end, total / width, np.nan)


def worker_rates(run: Run, grid: np.ndarray, width: float) -> dict[str, dict[str, np.ndarray]]:
    """Per worker: its payload (bytes/s) and messages per second up to the server and down from it, from
    comm.csv on the run's clock (injected faults are not traffic)."""
    c = run.comm
    t, nbytes = c["t"], np.nan_to_num(c["bytes"])
    traffic = np.array([not str(k).startswith("fault:") for k in c["kind"]], dtype=bool)
    workers = sorted({str(w) for w in np.concatenate([c["src"], c["dst"]]) if w != "server"},
                     key=lambda w: (len(w), w))
    end = float(np.max(t)) if len(t) else 0.0
    out = {}
    for w in workers:
        rates = {}
        for direction, col in (("up", "src"), ("down", "dst")):
            m = traffic & (c[col].astype(str) == w)
            rates[f"bytes_{direction}"] = rate_on(t[m], nbytes[m], grid, width, end)
            rates[f"messages_{direction}"] = rate_on(t[m], np.ones(int(m.sum())), grid, width, end)
        out[w] = rates
    return out


def _payload_unit(peak: float) -> tuple[str, float]:
    """The unit a payload rate peaking at `peak` bytes/s reads best in, and its size in bytes/s."""
    for unit, size in (("MB/s", 1e6), ("kB/s", 1e3)):
        if peak >= size:
            return unit, size
    return "B/s", 1.0


def plot_traffic(groups: dict[str, list[Run]], title: str, path: Path,
                 labels: Optional[dict[str, str]] = None, legend_title: Optional[str] = None) -> Optional[Path]:
    """Traffic rates per worker against time: payload (top) and messages (bottom), up to the server (left)
    and down from it (right), each a rate over a sliding window. One line per group, its mean worker (the
    mean over workers), or, for one group whose workers differ (stragglers), one line per worker; each line
    the mean over seeds, with the 95% band over seeds (`mean_band`) where a group has two or more."""
    labels = labels or {}
    shown = {label: [r for r in runs if r.comm is not None and len(r.comm.get("t", []))] for label, runs in groups.items()}
    shown = {label: runs for label, runs in shown.items() if runs}
    if not shown:
        return None
    tmax = max(float(np.max(r.comm["t"])) for runs in shown.values() for r in runs) or 1.0
    grid = np.linspace(0.0, tmax, GRID_POINTS)
    per_worker = False
    if len(shown) == 1:  # one group: a line per worker when its workers' traffic differs (a straggler)
        summed: dict[str, float] = {}
        for r in next(iter(shown.values())):
            for w, (_, nbytes) in worker_totals(r).items():
                summed[w] = summed.get(w, 0.0) + nbytes
        per_worker = workers_differ(np.array(list(summed.values()))[:, None])
    width = rate_window([r for runs in shown.values() for r in runs], tmax, slowest=per_worker)
    rates = {label: [worker_rates(r, grid, width) for r in runs] for label, runs in shown.items()}
    keys = ("bytes_up", "bytes_down", "messages_up", "messages_down")
    # lines: (legend text, {key: one curve per seed})
    lines: list[tuple[str, dict[str, list[np.ndarray]]]] = []
    one = next(iter(rates.values()))
    names = sorted({w for per_run in one for w in per_run}, key=lambda w: (len(w), w))
    if per_worker:
        for w in names:
            lines.append((w, {k: [per_run[w][k] for per_run in one if w in per_run] for k in keys}))
    else:
        for label, per_runs in rates.items():
            mean_worker = {k: [np.mean([rs[k] for rs in per_run.values()], axis=0) for per_run in per_runs] for k in keys}
            lines.append((_clip(labels.get(label, label), 60), mean_worker))
    drawn = {}
    for text, curves in lines:
        drawn[text] = {}
        for k in keys:
            stack = np.vstack(curves[k])
            mean, lo, hi = mean_band(list(stack))
            partial = ~np.all(np.isfinite(stack), axis=0)  # a group's mean only where all its seeds ran
            drawn[text][k] = (len(stack), *(np.where(partial, np.nan, v) for v in (mean, lo, hi)))
    peak = max((float(np.nanmax(v[1], initial=0.0)) for d in drawn.values() for k, v in d.items() if k.startswith("bytes")),
               default=0.0)
    unit, size = _payload_unit(peak)
    fig, axes = new_figure((11, 7.2), 2, 2)
    for col, direction in enumerate(("up", "down")):
        for row, what in enumerate(("bytes", "messages")):
            ax = axes[row, col]
            if col:
                ax.sharey(axes[row, 0])
            for i, (text, d) in enumerate(drawn.items()):
                n, mean, lo, hi = d[f"{what}_{direction}"]
                scale = size if what == "bytes" else 1.0
                color = f"C{i % 10}"
                ax.plot(grid, mean / scale, color=color, label=f"{text} ({n} seed{'s' if n > 1 else ''})")
                if n > 1:
                    ax.fill_between(grid, lo / scale, hi / scale, color=color, alpha=0.2, linewidth=0)
            ax.grid(alpha=0.3)
        axes[0, col].set_title("up: worker → server" if direction == "up" else "down: server → worker", fontsize=10)
        axes[1, col].set_xlabel(next(iter(shown.values()))[0].clock)
    for row in range(2):  # from 0, with room above the highest line of either panel (they share the scale)
        top = max(float(np.nanmax(np.concatenate([ln.get_ydata() for ln in ax.lines]), initial=0.0)) for ax in axes[row])
        axes[row, 0].set_ylim(0.0, 1.08 * top or 1.0)
    axes[0, 0].set_ylabel(f"payload per worker ({unit})")
    axes[1, 0].set_ylabel("messages per worker per s")
    counts = [v["bytes_up"][0] for v in drawn.values()]
    band = band_text(counts)
    single = all(len(per_run) == 1 for per_runs in rates.values() for per_run in per_runs)
    who = "each worker" if per_worker else ("the one worker" if single else "the mean worker (mean over workers)")
    parts = [p for p in (None if per_worker else legend_title,) if p]
    parts += [f"{who}; rates over a sliding {width:.3g} s window ({width / tmax:.0%} of the longest run)",
              f"line: mean over seeds; {band.replace(chr(10), ' ')}" if band else "1 seed per line: no band"]
    handles, texts = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncol=min(len(texts), 4 if per_worker else 2),
               fontsize=8, title="\n".join(parts), title_fontsize=8)
    fig.suptitle(wrap(f"Traffic per worker: {title}", 110), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_staleness(groups: dict[str, list[Run]], title: str, path: Path,
                   labels: Optional[dict[str, str]] = None, legend_title: Optional[str] = None) -> Optional[Path]:
    """Distribution of the staleness of updates that reached the server (all seeds of a group)."""
    labels = labels or {}
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
    fig, axes = new_figure((7.5, 4.5))
    ax = axes[0, 0]
    top = int(max(v.max() for v, _ in data.values()))
    bins = np.arange(-0.5, top + 1.5, 1.0)
    # groups whose histograms are the same would draw exactly on top of each other: one line, naming all
    alike: dict[tuple, list[str]] = {}
    for label, (values, dropped) in data.items():
        fractions = np.histogram(values, bins=bins)[0] / len(values)
        alike.setdefault((tuple(np.round(fractions, 12)), dropped), []).append(label)
    for names in alike.values():
        values, dropped = data[names[0]]
        shown = ", ".join(labels.get(n, n) for n in names)
        same = f"{len(names)} groups alike: " if len(names) > 1 else ""
        ax.hist(values, bins=bins, density=True, histtype="step", linewidth=1.8,
                label=f"{same}{shown} (mean {values.mean():.2f}, rejected {dropped})")
    ax.set_xlim(-0.5, top + 0.5)
    # staleness counts versions: whole-number ticks only (MaxNLocator alone falls back to -0.4, 0.25, ...
    # when fewer than two integers fit, as for a sync run where every update has staleness 0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("staleness (server versions between pull and push)")
    ax.set_ylabel("fraction of accepted updates")
    ax.set_title(wrap(f"Staleness of updates: {title}"), fontsize=10)
    return save_figure(fig, ax, path, legend_title=legend_title)


def _shots_column(run: Run) -> tuple[np.ndarray, str]:
    """Cumulative shots of a run's quantum.csv; for exact heads, circuits x the qpu profile's assumed shots
    (or the circuit executions when the run has no qpu: profile), with what was drawn."""
    q = run.quantum
    if np.nanmax(q["shots"], initial=0.0) > 0:
        return q["shots"], "shots"
    assumed = run.summary.get("qpu_profile", {}).get("assumed_shots")
    if assumed:
        return q["circuits"] * assumed, f"shots (exact heads: {assumed} per circuit assumed)"
    return q["circuits"], "circuit executions (exact heads: no shots)"


def plot_quantum(groups: dict[str, list[Run]], title: str, path: Path,
                 labels: Optional[dict[str, str]] = None) -> Optional[Path]:
    """Cumulative shots and estimated QPU hours against env steps, from quantum.csv (the resource ledger):
    one line per group, the mean over its seeds with the min-max range over seeds shaded."""
    labels = labels or {}
    shown = {label: [r for r in runs if r.quantum is not None and len(r.quantum.get("env_steps", []))]
             for label, runs in groups.items()}
    shown = {label: runs for label, runs in shown.items() if runs}
    if not shown:
        return None
    with_qpu = any(np.isfinite(r.quantum["qpu_s"]).any() for runs in shown.values() for r in runs)
    fig, axes = new_figure((11 if with_qpu else 6.5, 4.4), 1, 2 if with_qpu else 1)
    ylabels = set()
    for label, runs in shown.items():
        xmax = min(float(np.max(r.quantum["env_steps"])) for r in runs)
        grid = np.linspace(0.0, xmax, GRID_POINTS)
        n = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        columns = [[_shots_column(r) for r in runs]]
        if with_qpu:
            columns.append([(r.quantum["qpu_s"] / 3600.0, "QPU hours") for r in runs])
        for col, series in enumerate(columns):
            ax = axes[0, col]
            curves = np.array([np.interp(grid, r.quantum["env_steps"], y, left=0.0) for r, (y, _) in zip(runs, series)])
            line, = ax.plot(grid, curves.mean(axis=0), label=f"{_clip(labels.get(label, label), 60)} ({n})")
            if len(runs) > 1:
                ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.2,
                                linewidth=0)
            ylabels.add((col, series[0][1]))
    names = {0: "cumulative shots", 1: "estimated QPU time, cumulative (hours)"}
    for col in range(axes.shape[1]):
        what = sorted(text for c, text in ylabels if c == col)
        # several kinds of count on one axis (exact heads' circuits beside shots) make a long label: wrapped
        axes[0, col].set_ylabel(names[col] if col else wrap("cumulative " + "; ".join(what), 45))
        steps_xlabel(axes[0, col])
        axes[0, col].grid(alpha=0.3)
    several = any(len(runs) > 1 for runs in shown.values())
    axes[0, 0].legend(fontsize=8, title="mean over seeds, shaded: min-max over seeds" if several else None,
                      title_fontsize=8)
    profile = next((r.summary.get("qpu_profile") for runs in shown.values() for r in runs if r.summary.get("qpu_profile")), None)
    note = (f"; QPU model: {profile['shot_s']:g} s/shot, {profile['circuit_s']:g} s/circuit, {profile['job_s']:g} s/job"
            if profile else "")
    # a title that fits the figure's width (one panel without a QPU profile, two with)
    fig.suptitle(wrap(f"Quantum resources (act + gradient circuits of every circuit head){note}: {title}",
                      110 if with_qpu else 70), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_paths(paths: list[Path], out: Optional[Path] = None, labels: Optional[list[str]] = None,
               title: Optional[str] = None) -> list[Path]:
    """Draw every standard plot for the runs at or below `paths`; return the PNG paths.

    `labels`: ``KEY=TEXT`` items renaming groups in legends (see `resolve_labels`); `title` replaces the
    title built from what was run."""
    run_dirs = find_runs([Path(p) for p in paths])
    runs = [load_run(p) for p in run_dirs]
    if out is None:
        out = Path(paths[0]) / "plots"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    names = resolve_labels(list(labels or []), groups, [Path(p) for p in paths])
    title = title or describe(runs)
    key = legend_key(runs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No artists with labels found")
        made = [
            plot_learning(groups, "env_steps", STEPS_LABEL, title, out / "return_vs_steps.png",
                          names, key),
            plot_learning(groups, "t", runs[0].clock, title, out / "return_vs_time.png", names, key),
            plot_traffic(groups, title, out / "traffic.png", names, key),
            plot_staleness(groups, title, out / "staleness.png", names, key),
            plot_quantum(groups, title, out / "quantum.png", names),
            plot_teams(groups, title, out / "returns_by_team.png", names, key),
        ]
    return [p for p in made if p is not None]


PLOTS = {"standard": plot_paths}
