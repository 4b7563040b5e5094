"""One self-contained HTML page of a run or a sweep: curves, tables with 95% intervals, aggregate metrics.

`marlq report RUN_OR_SWEEP [--out FILE.html]` writes the page (default RUN_OR_SWEEP/report.html): every
figure is a PNG embedded as a data: URI and the style is inline, so the one file can be sent on. It holds

- the learning curves per group with bands (`analysis.plots.plot_learning`, the figures `marlq plot` draws);
- a table per group: final return, steps to solve, wall and virtual time (and how many runs a sweep ran at
  once beside them), messages, bytes, rejected and dropped counts, each the mean over seeds with its 95%
  Student-t interval clipped to the range the seeds span (`mean_interval`);
- with two groups or more: the IQM and mean of the final return with 95% stratified bootstrap intervals,
  and the probability of improvement of each group over each other (`analysis.stats`; definitions of
  rliable, see docs/report.md), and the config keys that differ between groups;
- the ledger per worker (pushes sent, accepted, rejected, dropped as stale, duplicated; messages and bytes
  each way), mean over each group's seeds, from comm.csv (`marl_q.ledger.ledger_audit`);
- the traffic, staleness and regret figures where the runs have them (`analysis.plots`, `analysis.regret`);
- with circuit heads (quantum.csv): circuits, shots and estimated QPU hours per group, in the whole run
  and, with `--target R`, up to the first time the trailing mean return reached R; `--qpu PROFILE` costs
  runs recorded without a `qpu:` profile (`marl_q.quantum.estimate_qpu_rows`).
"""
from __future__ import annotations

import argparse
import base64
import html
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from analysis import compare, plots
from analysis.stats import clipped_band, iqm, mean_ci, probability_of_improvement, stratified_bootstrap_ci
from marl_q.errors import UserError
from marl_q.quantum import QPU_PROFILES, QPUConfig, QPUProfile, estimate_qpu_rows
from marl_q.rundir import run_file

BOOTSTRAP_REPS = 2000
# (summary.json key, column title, scale, digits)
TABLE = [("final_return", "final return (last solve_window episodes)", 1.0, 2),
         ("eval_return", "greedy eval return (end of run)", 1.0, 2),
         ("steps_to_solve", "env steps to solve", 1.0, 0),
         ("wall_s", "wall time (s)", 1.0, 1),
         ("virtual_s", "virtual time (s)", 1.0, 3),
         ("messages", "messages", 1.0, 0),
         ("bytes_up", "MB up", 1e-6, 2),
         ("bytes_down", "MB down", 1e-6, 2),
         ("rejected", "rejected", 1.0, 1),
         ("dropped_stale", "dropped as stale", 1.0, 1)]
LEDGER = [("sent", "pushes sent"), ("accepted", "accepted"), ("rejected", "rejected"),
          ("dropped_stale", "dropped stale"), ("duplicated", "duplicated"), ("messages_up", "messages up"),
          ("messages_down", "messages down"), ("mb_up", "MB up"), ("mb_down", "MB down")]
STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ccc}
h3{font-size:1em}table{border-collapse:collapse;margin:.6em 0;font-size:.85em}th,td{border:1px solid #ccc;
padding:.25em .6em;text-align:right;white-space:nowrap}th{background:#f3f3f3;white-space:normal;
vertical-align:bottom}div.t{overflow-x:auto}td.l,th.l{text-align:left}img{max-width:100%;
border:1px solid #eee;margin:.4em 0}p.note{color:#555;font-size:.85em;max-width:900px}code{background:#f6f6f6}"""


# ----------------------------------------------------------------------------- numbers
def group_values(runs: list[plots.Run], key: str) -> np.ndarray:
    """``summary[key]`` of each run, NaN where missing (an unsolved run has no steps_to_solve)."""
    out = []
    for r in runs:
        v = r.summary.get(key)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan)
    return np.array(out)


INTERVAL = "mean over seeds [95% Student-t interval, clipped to the range the seeds span]"


def mean_interval(values: np.ndarray, scale: float, digits: int) -> str:
    """'mean [low, high]' over the finite values: the 95% t-interval clipped to the values' own range
    (`analysis.stats.clipped_band`: a few seeds' interval can pass what any run scored, CartPole's 500);
    the mean alone for one value or values all alike; '(k of n)' when some runs have none."""
    ok = values[np.isfinite(values)] * scale
    if not len(ok):
        return "—"
    mean, half = mean_ci(ok)
    lo, hi = (float(v[0]) for v in clipped_band(ok[:, None], np.array([mean]), np.array([half])))
    text = f"{mean:,.{digits}f}"
    if len(ok) > 1 and f"{lo:,.{digits}f}" != f"{hi:,.{digits}f}":
        text += f" [{lo:,.{digits}f}, {hi:,.{digits}f}]"
    return text + (f" ({len(ok)} of {len(values)})" if len(ok) < len(values) else "")


def runs_at_once(runs: list[plots.Run]) -> str:
    """How many runs `marlq sweep` ran at once when these were measured (summary.json `sweep_jobs`, `a/b`
    when they differ); — for runs started alone (`marlq run`: nothing recorded)."""
    seen = sorted({int(r.summary["sweep_jobs"]) for r in runs if r.summary.get("sweep_jobs")})
    alone = sum(1 for r in runs if not r.summary.get("sweep_jobs"))
    text = "/".join(map(str, seen)) or "—"
    return text + (f" ({alone} of {len(runs)} started alone)" if seen and alone else "")


def ledger_rows(runs: list[plots.Run]) -> list[tuple[str, dict[str, float]]]:
    """Per worker, the mean over runs of its ledger counts (worker order w0, w1, ..., w10); a run with
    several services (one learner per team) has a row per worker and service, ``w0 (good)``."""
    from marl_q.ledger import ledger_audit

    per_worker: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in runs:
        if run_file(r.path / "comm.csv") is None:
            continue
        audit = ledger_audit(r.path)
        c = r.comm
        names = set(audit.workers) | ({str(w) for w in np.concatenate([c["src"], c["dst"]])} - {"server"}
                                      if c is not None else set())
        services = list(audit.services) or [""]
        for w in names:
            for service in services:
                row = {k: float(v) for k, v in (audit.services[service] if service else audit).worker(w).items()}
                if c is not None:
                    mine = np.array([not str(k).startswith("fault:") for k in c["kind"]])
                    if service:
                        mine &= np.array([str(v) == service for v in c["service"]])
                    up, down = (c["src"] == w) & mine, (c["dst"] == w) & mine
                    row.update(messages_up=float(up.sum()), messages_down=float(down.sum()),
                               mb_up=float(np.nansum(c["bytes"][up])) / 1e6,
                               mb_down=float(np.nansum(c["bytes"][down])) / 1e6)
                per_worker.setdefault((w, service), []).append(row)
    order = sorted(per_worker, key=lambda ws: (len(ws[0]), ws[0]))  # a worker's services in the run's order
    return [(f"{w} ({service})" if service else w,
             {k: float(np.mean([row.get(k, np.nan) for row in per_worker[(w, service)]])) for k, _ in LEDGER})
            for w, service in order]


def aggregates(groups: dict[str, list[plots.Run]], key: str = "final_return", reps: int = BOOTSTRAP_REPS,
               seed: int = 0) -> tuple[dict[str, dict[str, tuple[float, float, float]]], dict[tuple[str, str], tuple]]:
    """Per group: IQM and mean of ``summary[key]`` over its runs with 95% stratified bootstrap intervals
    (one task: the runs' scenario); per ordered pair of groups: P(X > Y) with its interval."""
    scores = {label: v[np.isfinite(v)] for label, v in ((lab, group_values(rs, key)) for lab, rs in groups.items())}
    scores = {label: v for label, v in scores.items() if len(v)}
    per_group = {label: {"iqm": stratified_bootstrap_ci(iqm, v, reps=reps, seed=seed),
                         "mean": stratified_bootstrap_ci(lambda a: float(np.mean(a)), v, reps=reps, seed=seed)}
                 for label, v in scores.items()}
    pairs = {(a, b): stratified_bootstrap_ci(probability_of_improvement, scores[a], scores[b], reps=reps, seed=seed)
             for a in scores for b in scores if a != b}
    return per_group, pairs


def sample_complexity_section(groups: dict[str, list[plots.Run]], reps: int, folder: Path, title: str) -> list[str]:
    """Meyer et al.'s sample-complexity table, pairs and figure (`analysis.compare` at its defaults)."""
    head = f"<h2>Sample complexity (Meyer et al. 2025), groups of {compare.REPORT_MIN_RUNS}+ seeds</h2>"
    try:
        c = compare.compare_groups(groups, reps=reps, rng=np.random.default_rng(0))
    except UserError as exc:
        return [head, f"<p class=note>Not computed: {esc(exc)}</p>"]
    rows = compare.table_rows(c)
    note = f"<p class=note>{esc(compare.describe(c))} Other ε, δ, optimum or metric: <code>marlq compare</code>.</p>"
    return [head, note, table(rows[0], rows[1])] + ([table(rows[2], rows[3], left=2)] if rows[3] else []) + [
        figure(compare.plot_comparison(c, folder / compare.FIGURE, title), "sample complexity per group")]


# ----------------------------------------------------------------------------- HTML
def esc(x: Any) -> str:
    return html.escape(str(x))


def table(header: list[str], rows: list[list[Any]], caption: Optional[str] = None, left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are text (left-aligned)."""
    def cell(tag: str, i: int, v: Any) -> str:
        return f"<{tag}{' class=l' if i < left else ''}>{esc(v)}</{tag}>"
    head = "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(header)) + "</tr>"
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<div class=t><table>{cap}{head}{body}</table></div>"


def figure(path: Optional[Path], alt: str) -> str:
    """A PNG file as an <img> with a data: URI (nothing when the figure was not drawn)."""
    if path is None or not Path(path).is_file():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def interval(est: tuple[float, float, float], digits: int = 2) -> str:
    return f"{est[0]:.{digits}f} [{est[1]:.{digits}f}, {est[2]:.{digits}f}]"


def qpu_timing(run: plots.Run, qpu: Optional[str]) -> Optional[tuple[QPUProfile, int, str]]:
    """The QPU model a run is costed with: its own ``qpu:`` profile (as recorded in summary.json), else
    ``--qpu``'s at the default assumed shots, else None; with where it comes from."""
    recorded = run.summary.get("qpu_profile")
    if recorded:
        return (QPUProfile(recorded["shot_s"], recorded["circuit_s"], recorded["job_s"], ""),
                int(recorded["assumed_shots"]), recorded.get("source", "the runs' qpu: profile"))
    if qpu:
        return QPU_PROFILES[qpu], QPUConfig().assumed_shots, f"--qpu {qpu}"
    return None


def apply_qpu(runs: list[plots.Run], qpu: Optional[str]) -> None:
    """Runs recorded without a ``qpu:`` profile get ``--qpu``'s estimate in their quantum.csv columns and
    summary (in memory), so the quantum figure and table show QPU hours for them too."""
    if not qpu:
        return
    for run in runs:
        if run.quantum is None or run.summary.get("qpu_profile"):
            continue
        timing, assumed, _ = qpu_timing(run, qpu)
        run.quantum["qpu_s"] = estimate_qpu_rows(run.quantum, timing, assumed)
        run.summary["qpu_profile"] = {"shot_s": timing.shot_s, "circuit_s": timing.circuit_s, "job_s": timing.job_s,
                                      "assumed_shots": assumed, "source": f"--qpu {qpu}"}


def quantum_costs(run: plots.Run, target: Optional[float]) -> dict[str, float]:
    """A run's circuits, shots and QPU hours in all and per env step, and (with ``target``) up to the first
    episode at which the trailing mean over run.solve_window episodes reached it (NaN: never, or no such
    number: an exact head has no shots, a run without a profile no QPU time)."""
    q = run.quantum
    steps = q["env_steps"]
    shots = q["shots"] if np.nanmax(q["shots"], initial=0.0) > 0 else np.full(len(steps), np.nan)
    qpu_h = q["qpu_s"] / 3600.0
    last = len(steps) - 1
    out = {"circuits_per_step": q["circuits"][last] / max(steps[last], 1.0), "shots_per_step": shots[last] / max(steps[last], 1.0),
           "qpu_h": qpu_h[last]}
    if target is not None:
        curve = plots.smoothed(run.metrics["return"], plots.solve_window(run))
        hit = np.flatnonzero(curve >= target)
        if len(hit):
            # quantum.csv has a row per metrics.csv row (the same episode); match by env steps to be safe
            row = int(np.searchsorted(steps, run.metrics["env_steps"][hit[0]], side="left"))
            row = min(row, last)
            out.update(target_steps=steps[row], target_circuits=q["circuits"][row], target_shots=shots[row],
                       target_qpu_h=qpu_h[row])
        else:
            out.update(target_steps=np.nan, target_circuits=np.nan, target_shots=np.nan, target_qpu_h=np.nan)
    return out


def quantum_section(groups: dict[str, list[plots.Run]], target: Optional[float], qpu: Optional[str]) -> Optional[str]:
    """The quantum-resource table (groups with quantum.csv only), or None."""
    shown = {g: [r for r in rs if r.quantum is not None and len(r.quantum.get("env_steps", []))] for g, rs in groups.items()}
    shown = {g: rs for g, rs in shown.items() if rs}
    if not shown:
        return None
    columns = [("circuits_per_step", "circuits per env step", 2), ("shots_per_step", "shots per env step", 0),
               ("qpu_h", "estimated QPU hours (whole run)", 1)]
    if target is not None:
        columns += [("target_steps", f"env steps to reach {target:g}", 0), ("target_circuits", f"circuits to reach {target:g}", 0),
                    ("target_shots", f"shots to reach {target:g}", 0), ("target_qpu_h", f"QPU hours to reach {target:g}", 1)]
    rows = []
    for label, rs in shown.items():
        costs = [quantum_costs(r, target) for r in rs]
        row = [label, len(rs)]
        if target is not None:
            row.append(f"{sum(np.isfinite(c['target_steps']) for c in costs)} of {len(rs)}")
        rows.append(row + [mean_interval(np.array([c[k] for c in costs], dtype=float), 1.0, d) for k, _, d in columns])
    sources = sorted({t[2] for rs in shown.values() for r in rs if (t := qpu_timing(r, qpu)) is not None})
    head = ["group", "n"] + (["reached"] if target is not None else []) + [name for _, name, _ in columns]
    note = ("<p class=note>Circuit executions and shots of every circuit head (acting and gradient circuits; an "
            "analytic gradient counts as its parameter-shift equivalent; see docs/hardware.md), mean over seeds "
            "[the 95% t-interval, clipped to the seeds' range]. Shots: — for exact (analytic) heads. QPU hours: the estimate of "
            + (", ".join(esc(x) for x in sources) if sources else "no profile (none recorded; give --qpu)")
            + "; exact heads costed at the profile's assumed shots per circuit."
            + (f" To reach {target:g}: up to the first episode at which the trailing mean return over "
               "run.solve_window episodes was at least that, over the runs that reached it." if target is not None else "")
            + "</p>")
    return note + table(head, rows, caption=f"each cell: {INTERVAL}")


def final_column(run: plots.Run, column: str) -> float:
    """The mean of returns.csv's ``column`` over the run's last run.solve_window episodes (as final_return)."""
    values = np.asarray((run.returns or {}).get(column, []), dtype=float)
    values = values[np.isfinite(values)]  # NaN: an episode under way at a resume from before returns.csv
    return float(values[-plots.solve_window(run):].mean()) if len(values) else np.nan


def teams_section(groups: dict[str, list[plots.Run]]) -> Optional[str]:
    """Each group's final per-team and per-agent returns (returns.csv), and which team ``return`` is."""
    rows, notes = [], []
    for label, rs in groups.items():
        have = [r for r in rs if r.returns is not None]
        if not have:
            continue
        first = have[0]
        report = plots.report_team(first)
        notes.append(f"{esc(label)}: return is team <code>{esc(report)}</code>'s "
                     f"({'run.report_team' if first.config.get('run', {}).get('report_team') else 'the first team'}; "
                     f"teams {', '.join(esc(t) for t in plots.team_names(first))})")
        for kind, names in (("team", plots.team_names(first)), ("agent", plots.agent_names(first))):
            for name in names:
                values = np.array([final_column(r, f"{kind}:{name}") for r in have])
                shown = f"{name} (= return)" if kind == "team" and name == report else name
                rows.append([label, kind, shown, len(have), mean_interval(values, 1.0, 2)])
    if not rows:
        return None
    return ("<p class=note>From each run's returns.csv: a team's return is its agents' rewards summed over the "
            "episode; final: the mean of the last run.solve_window episodes, as final return. "
            + "; ".join(notes) + ".</p>"
            + table(["group", "team or agent", "name", "n", "final return"], rows,
                    caption=f"each cell: {INTERVAL}", left=3))


def config_diff(groups: dict[str, list[plots.Run]]) -> Optional[str]:
    keys = plots.differing_keys(list(groups.values()))
    if not keys:
        return None
    rows = [[k] + [groups[g][0].flat.get(k) for g in groups] for k in keys]
    return table(["config key"] + list(groups), rows, left=len(groups) + 1)


def draw_figures(groups: dict[str, list[plots.Run]], runs: list[plots.Run], title: str, folder: Path,
                 root: Path) -> list[tuple[str, Optional[Path], str]]:
    """(section, PNG or None, alt text) of every figure the runs allow, drawn by the existing plot functions."""
    key = plots.legend_key(runs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No artists with labels found")
        made = [
            ("curves", plots.plot_learning(groups, "env_steps", plots.STEPS_LABEL, title,
                                           folder / "return_vs_steps.png", None, key), "return vs environment steps"),
            ("curves", plots.plot_learning(groups, "t", runs[0].clock, title, folder / "return_vs_time.png", None, key),
             f"return vs {runs[0].clock}"),
            ("traffic", plots.plot_traffic(groups, title, folder / "traffic.png", None, key), "traffic per worker"),
            ("staleness", plots.plot_staleness(groups, title, folder / "staleness.png", None, key),
             "staleness of accepted updates"),
            ("quantum", plots.plot_quantum(groups, title, folder / "quantum.png"), "cumulative shots and estimated QPU hours"),
            ("teams", plots.plot_teams(groups, title, folder / "returns_by_team.png", None, key),
             "per-team and per-agent returns vs environment steps"),
        ]
        if any("cum_regret" in r.metrics or "regret" in r.metrics for r in runs):
            from analysis import regret

            lsvi = regret.find_runs(root)
            if lsvi:
                workers = int(np.bincount([r.workers for r in lsvi]).argmax())
                made += [("regret", regret.plot_regret_vs_k(lsvi, folder, workers), "cumulative regret vs episodes"),
                         ("regret", regret.plot_communication_vs_k(lsvi, folder, workers), "communication vs episodes")]
    return made


def build_report(root: Path, reps: int = BOOTSTRAP_REPS, target: Optional[float] = None, qpu: Optional[str] = None) -> str:
    """The HTML page for the run or sweep at ``root``."""
    runs = [plots.load_run(p) for p in plots.find_runs([root])]
    apply_qpu(runs, qpu)
    groups = plots.group_runs(runs)
    title = plots.describe(runs)
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>marl-q report: {esc(root)}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>marl-q report: {esc(root)}</h1>",
             "<p>" + "<br>".join(esc(line) for line in title.splitlines()) + "</p>",
             f"<p class=note>{len(runs)} run{'s' if len(runs) != 1 else ''} in {len(groups)} "
             f"group{'s' if len(groups) != 1 else ''} (runs whose configs differ only in run.seed); "
             f"written {esc(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}.</p>"]
    with tempfile.TemporaryDirectory() as tmp:
        figs = draw_figures(groups, runs, title, Path(tmp), root)

        def section(name: str) -> str:
            return "".join(figure(p, alt) for s, p, alt in figs if s == name)

        parts += ["<h2>Learning curves</h2>", section("curves") or "<p>No episodes with a return.</p>"]
        parts.append("<h2>Results per group</h2><p class=note>Each cell: the mean over the group's seeds and, in "
                     "brackets, the 95% Student-t interval clipped to the range the seeds span (no interval: one "
                     "seed, or all alike); n is the number of seeds. Runs at once: how many runs marlq sweep ran "
                     "side by side on the machine when the wall times were measured (its --jobs; more than 1: the "
                     "runs shared the CPUs); —: runs started by marlq run, with nothing recorded. Steps to solve: the env steps at which the "
                     "trailing mean over run.solve_window episodes first reached run.solve_return (runs that "
                     "never did are left out and counted). —: no run has the value (no run.solve_return set, "
                     "none solved, or no evaluation).</p>")
        at = [k for k, *_ in TABLE].index("wall_s") + 1  # the wall time, then the runs measured beside it
        header = ["group", "n"] + [name for _, name, _, _ in TABLE]
        header.insert(2 + at, "runs at once (sweep --jobs)")
        rows = []
        for label, rs in groups.items():
            row = [label, len(rs)] + [mean_interval(group_values(rs, k), s, d) for k, _, s, d in TABLE]
            rows.append(row[:2 + at] + [runs_at_once(rs)] + row[2 + at:])
        parts.append(table(header, rows, caption=f"each cell: {INTERVAL}"))
        if len(groups) > 1:
            per_group, pairs = aggregates(groups, reps=reps)
            parts.append("<h2>Aggregate metrics (final return)</h2><p class=note>IQM: the mean of the middle 50% "
                         "of the runs' final returns (floor(25%) dropped at each end); mean: of all runs. In "
                         f"brackets: 95% percentile intervals of a stratified bootstrap ({reps} draws, runs "
                         "resampled within the one task). Definitions of Agarwal et al. (2021), as in rliable; "
                         "see docs/report.md.</p>")
            parts.append(table(["group", "n", "IQM [95% CI]", "mean [95% CI]"],
                               [[g, len(groups[g]), interval(v["iqm"]), interval(v["mean"])]
                                for g, v in per_group.items()]))
            labels = list(per_group)
            parts.append("<h3>Probability of improvement P(row &gt; column)</h3><p class=note>The chance that a "
                         "run of the row's group ends with a higher final return than a run of the column's "
                         "(ties count half), with its 95% stratified bootstrap interval.</p>")
            parts.append(table(["P(row > column)"] + labels,
                               [[a] + ["—" if a == b else interval(pairs[(a, b)]) for b in labels] for a in labels]))
            diff = config_diff(groups)
            parts += ["<h2>Config differences between groups</h2>", diff or "<p>None.</p>"]
        if min(len(rs) for rs in groups.values()) >= compare.REPORT_MIN_RUNS:
            parts += sample_complexity_section(groups, reps, Path(tmp), title)
        parts.append("<h2>Ledger per worker</h2><p class=note>From each run's comm.csv: pushes a worker sent "
                     "(the highest sequence number that arrived, per life), accepted, rejected, dropped as stale, "
                     "duplicated by an injected fault; all messages and payload each way. Mean over the group's "
                     "seeds.</p>")
        for label, rs in groups.items():
            rows = [[w] + [f"{vals[k]:,.2f}" if k.startswith("mb") else f"{vals[k]:,.1f}" for k, _ in LEDGER]
                    for w, vals in ledger_rows(rs)]
            if len(rows) > 2 and all(r[1:] == rows[0][1:] for r in rows):  # alike workers: one row says it
                rows = [[f"each of {rows[0][0]}..{rows[-1][0]} ({len(rows)} alike workers)"] + rows[0][1:]]
            if rows:
                parts += [f"<h3>{esc(label)} ({len(rs)} seed{'s' if len(rs) != 1 else ''})</h3>",
                          table(["worker"] + [name for _, name in LEDGER], rows)]
        teams = teams_section(groups)
        if teams:
            parts += ["<h2>Teams and agents</h2>", teams, section("teams")]
        quantum = quantum_section(groups, target, qpu)
        if quantum:
            parts += ["<h2>Quantum resources</h2>", quantum, section("quantum")]
        for name, heading in (("traffic", "Traffic"), ("staleness", "Staleness"), ("regret", "Regret")):
            body = section(name)
            if body:
                parts += [f"<h2>{heading}</h2>", body]
        parts.append("<h2>Runs</h2>")
        parts.append(table(["run directory", "group", "status", "final return"],
                           [[str(r.path.relative_to(root)) if r.path != root else ".", g, r.summary.get("status", "?"),
                             mean_interval(group_values([r], "final_return"), 1.0, 2)] for g, rs in groups.items() for r in rs],
                           left=3))
    parts.append("</body></html>")
    return "\n".join(parts)


def writable(out: Path) -> Path:
    """``out`` if a file can be written there (its folder is made); else a one-line UserError."""
    if out.is_dir():
        raise UserError(f"--out: {out} is a directory; give a file name such as {out / 'report.html'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a"):
            pass
    except OSError as exc:
        raise UserError(f"--out: cannot write {out} ({exc.strerror or exc})") from None
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """One self-contained HTML page of a run or sweep: curves, tables with 95% intervals, IQM, probability of improvement."""
    p = argparse.ArgumentParser(prog="marlq report", description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path, help="a run directory or a sweep folder")
    p.add_argument("--out", type=Path, help="the HTML file (default: PATH/report.html)")
    p.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help=f"bootstrap draws (default {BOOTSTRAP_REPS})")
    p.add_argument("--target", type=float, help="quantum resources (circuits, shots, QPU hours) up to the first time "
                   "the trailing mean return over run.solve_window episodes reached this")
    p.add_argument("--qpu", help=f"cost runs recorded without a qpu: profile with this one ({', '.join(QPU_PROFILES)})")
    args = p.parse_args(argv)
    try:
        if args.reps < 100:
            raise UserError(f"--reps: must be at least 100, got {args.reps}")
        if args.qpu is not None and args.qpu not in QPU_PROFILES:
            raise UserError(f"--qpu: unknown QPU profile {args.qpu!r}; choices: {', '.join(QPU_PROFILES)}")
        if args.target is not None and not np.isfinite(args.target):
            raise UserError(f"--target: must be a finite return, got {args.target}")
        if not args.path.is_dir():
            what = "no such file or directory" if not args.path.exists() else "not a directory"
            raise UserError(f"{args.path}: {what}; give a run directory or a sweep folder")
        plots.find_runs([args.path])  # no run below it: one line, before anything is written
        out = writable(args.out if args.out else args.path / "report.html")
        page = build_report(args.path, args.reps, args.target, args.qpu)
        out.write_text(page, encoding="utf-8")
    except UserError as exc:
        print(f"marlq report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {out}")
    return 0


COMMANDS = {"report": main}  # marlq report ...

if __name__ == "__main__":
    sys.exit(main())
