"""AMARL routing comparison: train both learners over seeds, then tabulate and plot (docs/routing.md).

    marlq routing --seeds 5 --out sweeps/routing

Runs `marlq run` for scenarios/routing_amarl.yaml and scenarios/routing_single_ppo.yaml once per
seed (one process at a time; finished runs are kept, so rerunning continues), then reads only the
run directories: summary.json (evaluation on nominal and shifted demand, heuristics, conflicts,
virtual training time) and metrics.csv (training curves). Writes comparison.json, comparison.md
and PNGs under --out. Bands and error bars are 95% t-intervals over seeds.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from analysis.stats import mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"amarl": ROOT / "scenarios" / "routing_amarl.yaml",
           "single_ppo": ROOT / "scenarios" / "routing_single_ppo.yaml"}
LABELS = {"amarl": "AMARL (PPO per service)", "single_ppo": "single-agent PPO",
          "shortest_path_first_fit": "shortest-path first-fit", "random_feasible": "random feasible path",
          "uniform_random": "uniformly random action"}
SHIFT_LABELS = {"none": "nominal", "urllc_surge": "URLLC surge", "embb_peak_moved": "eMBB peak moved"}
SERVICES = ["embb", "urllc", "mmtc"]
SERVICE_LABELS = {"embb": "eMBB", "urllc": "URLLC", "mmtc": "mMTC"}
HEURISTICS = ["shortest_path_first_fit", "random_feasible", "uniform_random"]


def ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval (half-width 0 for a single value)."""
    mean, half = mean_ci([np.nan if v is None else float(v) for v in values] or [np.nan])
    return float(mean), float(half)


def run_dir(out: Path, name: str, seed: int) -> Path:
    return out / name / f"seed{seed}"


def train(out: Path, seeds: int, overrides: list[str]) -> None:
    """Run every (algorithm, seed) that has no summary.json yet, one `marlq run` at a time."""
    for seed in range(seeds):
        for name, config in CONFIGS.items():
            target = run_dir(out, name, seed)
            if (target / "summary.json").is_file():
                continue
            extra = [] if name == "amarl" else ["--set", "algorithm.eval_baselines=false"]
            for o in overrides:
                extra += ["--set", o]
            cmd = [sys.executable, "-m", "marl_q.cli", "run", str(config), "--seed", str(seed), "--out", str(target),
                   "--quiet", *extra]
            print("+", " ".join(cmd), flush=True)
            if target.exists():
                for f in sorted(target.rglob("*"), reverse=True):
                    f.unlink() if f.is_file() else f.rmdir()
                target.rmdir()
            subprocess.run(cmd, check=True, cwd=ROOT)


def load(out: Path, name: str) -> list[dict[str, Any]]:
    """summary.json of every finished seed of one algorithm."""
    found = sorted((out / name).glob("seed*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    return [json.loads(p.read_text()) for p in found]


def training_curve(path: Path, bins: np.ndarray) -> np.ndarray:
    """Training GoS (all services pooled) in each virtual-time bin, from metrics.csv; NaN where empty."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    t = np.array([float(r["t"]) for r in rows])
    acc = np.array([float(r["gos"]) * float(r["requests"]) for r in rows])
    n = np.array([float(r["requests"]) for r in rows])
    which = np.digitize(t, bins) - 1
    out = np.full(len(bins) - 1, np.nan)
    for b in range(len(bins) - 1):
        sel = which == b
        if n[sel].sum() > 0:
            out[b] = acc[sel].sum() / n[sel].sum()
    return out


def agent_compute_s(path: Path) -> tuple[float, float]:
    """Real compute seconds of the busiest worker and of all workers together. ``path`` is a run's
    metrics.csv (which episode each worker finished); the seconds are in its metrics_wall.csv sidecar."""
    with open(path) as f:
        worker_of = {row["episode"]: row["worker"] for row in csv.DictReader(f)}
    last: dict[str, float] = {}
    side = Path(path).with_name("metrics_wall.csv")
    if side.is_file():
        with open(side) as f:
            for row in csv.DictReader(f):
                if row.get("compute_s") and row["episode"] in worker_of:
                    last[worker_of[row["episode"]]] = float(row["compute_s"])
    if not last:
        return float("nan"), float("nan")
    return max(last.values()), sum(last.values())


def compare(out: Path) -> dict[str, Any]:
    """The comparison figures (docs/routing.md) from the run directories, with 95% intervals over seeds."""
    amarl, single = load(out, "amarl"), load(out, "single_ppo")
    n = min(len(amarl), len(single))
    if n == 0:
        raise SystemExit(f"no finished runs under {out} (run without --plot-only first)")
    amarl, single = amarl[:n], single[:n]
    res: dict[str, Any] = {"seeds": n}

    def paired(key: str, scale: float = 1.0) -> dict[str, float]:
        a = [s[key] * scale for s in amarl]
        b = [s[key] * scale for s in single]
        d_mean, d_hw = ci95([x - y for x, y in zip(a, b)])
        (am, ah), (bm, bh) = ci95(a), ci95(b)
        return {"amarl": am, "amarl_ci": ah, "single": bm, "single_ci": bh, "diff": d_mean, "diff_ci": d_hw}

    for shift in SHIFT_LABELS:
        if f"eval_{shift}_gos" not in amarl[0]:
            continue
        res[f"gos_pp_{shift}"] = paired(f"eval_{shift}_gos", 100.0)
        res[f"latency_mean_ms_{shift}"] = paired(f"eval_{shift}_latency_mean_ms")
        res[f"latency_p95_ms_{shift}"] = paired(f"eval_{shift}_latency_p95_ms")
        for h in HEURISTICS:
            key = f"baseline_{h}_{shift}_gos"
            if key in amarl[0]:
                res[f"gos_pp_{shift}_{h}"] = ci95([s[key] * 100 for s in amarl])
                res[f"latency_mean_ms_{shift}_{h}"] = ci95([s[f"baseline_{h}_{shift}_latency_mean_ms"] for s in amarl])
    res["latency_ratio_nominal"] = ci95([a["eval_none_latency_mean_ms"] / b["eval_none_latency_mean_ms"]
                                         for a, b in zip(amarl, single)])
    res["virtual_train_s"] = paired("virtual_s")
    res["time_ratio"] = ci95([a["virtual_s"] / b["virtual_s"] for a, b in zip(amarl, single)])
    res["real_train_s"] = paired("wall_s")
    busiest = {name: [agent_compute_s(run_dir(out, name, seed) / "metrics.csv") for seed in range(n)]
               for name in CONFIGS}
    res["busiest_agent_compute_s"] = {"amarl": ci95([b for b, _ in busiest["amarl"]]),
                                      "single": ci95([b for b, _ in busiest["single_ppo"]])}
    res["all_agents_compute_s"] = {"amarl": ci95([t for _, t in busiest["amarl"]]),
                                   "single": ci95([t for _, t in busiest["single_ppo"]])}
    res["busiest_compute_ratio"] = ci95([a[0] / b[0] for a, b in zip(busiest["amarl"], busiest["single_ppo"])])
    res["conflict_rate_pct"] = {"amarl": ci95([100 * s["commit_conflict_rate"] for s in amarl]),
                                "single": ci95([100 * s["commit_conflict_rate"] for s in single])}
    res["commits_per_run"] = {"amarl": ci95([s["commits"] for s in amarl]), "single": ci95([s["commits"] for s in single])}
    res["env_steps"] = {"amarl": amarl[0]["env_steps"], "single": single[0]["env_steps"]}
    return res


def bar_group(ax, groups: list[str], series: dict[str, list[tuple[float, float]]], ylabel: str) -> None:
    """Grouped bars with 95% error bars."""
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for i, (label, values) in enumerate(series.items()):
        means = [m for m, _ in values]
        errs = [h for _, h in values]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, means, width, yerr=errs, capsize=3, label=label)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def plot(out: Path) -> list[Path]:
    """The comparison figures; returns the PNG paths."""
    amarl, single = load(out, "amarl"), load(out, "single_ppo")
    n = min(len(amarl), len(single))
    amarl, single = amarl[:n], single[:n]
    shifts = [s for s in SHIFT_LABELS if f"eval_{s}_gos" in amarl[0]]
    paths = []

    # 1. GoS per service and overall on nominal demand, learners and heuristics
    fig, ax = plt.subplots(figsize=(10, 4.8))
    groups = ["overall", *SERVICES]
    keys = ["", *[f"{s}_" for s in SERVICES]]
    series = {LABELS["amarl"]: [ci95([r[f"eval_none_{k}gos"] * 100 for r in amarl]) for k in keys],
              LABELS["single_ppo"]: [ci95([r[f"eval_none_{k}gos"] * 100 for r in single]) for k in keys]}
    for h in HEURISTICS:
        series[LABELS[h]] = [ci95([r[f"baseline_{h}_none_{k}gos"] * 100 for r in amarl]) for k in keys]
    bar_group(ax, [SERVICE_LABELS.get(g, g) for g in groups], series,
              "grade of service (% accepted)")
    lo = min(m - h for vals in series.values() for m, h in vals)
    ax.set_ylim(max(0, lo - 5), 100.5)
    ax.set_title(f"Routing on nominal demand: grade of service per service ({n} seeds, 95% CI)")
    legend_below(ax, ncol=5)
    paths.append(_save(fig, out / "gos_nominal.png"))

    # 2. GoS under the demand shifts the learners were not trained on
    fig, ax = plt.subplots(figsize=(9, 4.8))
    series = {LABELS["amarl"]: [ci95([r[f"eval_{s}_gos"] * 100 for r in amarl]) for s in shifts],
              LABELS["single_ppo"]: [ci95([r[f"eval_{s}_gos"] * 100 for r in single]) for s in shifts]}
    for h in HEURISTICS[:2]:
        series[LABELS[h]] = [ci95([r[f"baseline_{h}_{s}_gos"] * 100 for r in amarl]) for s in shifts]
    bar_group(ax, [SHIFT_LABELS[s] for s in shifts], series, "grade of service (% accepted)")
    lo = min(m - h for vals in series.values() for m, h in vals)
    ax.set_ylim(max(0, lo - 3), 100.5)
    ax.set_title(f"Grade of service under demand shifts unseen in training ({n} seeds, 95% CI)")
    legend_below(ax, ncol=4)
    paths.append(_save(fig, out / "gos_shifts.png"))

    # 3. latency of accepted requests
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, stat, name in ((axes[0], "latency_mean_ms", "mean"), (axes[1], "latency_p95_ms", "95th percentile")):
        series = {LABELS["amarl"]: [ci95([r[f"eval_{s}_{stat}"] for r in amarl]) for s in shifts],
                  LABELS["single_ppo"]: [ci95([r[f"eval_{s}_{stat}"] for r in single]) for s in shifts],
                  LABELS["shortest_path_first_fit"]: [ci95([r[f"baseline_shortest_path_first_fit_{s}_{stat}"]
                                                            for r in amarl]) for s in shifts]}
        bar_group(ax, [SHIFT_LABELS[s] for s in shifts], series, f"{name} end-to-end latency (ms)")
        ax.set_title(f"{name} latency of accepted requests")
    legend_below(axes[0], ncol=3)
    fig.suptitle(f"Routing latency ({n} seeds, 95% CI)")
    paths.append(_save(fig, out / "latency.png"))

    # 4. training: GoS over virtual time with bands, and the training clock
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [2, 1, 1]})
    t_max = max(max(r["virtual_s"] for r in amarl), max(r["virtual_s"] for r in single))
    bins = np.linspace(0.0, t_max, 13)
    centers = 0.5 * (bins[1:] + bins[:-1])
    for name, color in (("amarl", "C0"), ("single_ppo", "C1")):
        curves = np.array([training_curve(run_dir(out, name, s) / "metrics.csv", bins) * 100 for s in range(n)])
        ok = np.sum(~np.isnan(curves), axis=0) > 0
        bands = [ci95(curves[:, b]) for b in np.flatnonzero(ok)]
        mean = np.array([m for m, _ in bands])
        hw = np.array([h for _, h in bands])
        axes[0].plot(centers[ok], mean, color=color, marker="o", ms=3, label=LABELS[name])
        axes[0].fill_between(centers[ok], np.maximum(mean - hw, 0), np.minimum(mean + hw, 100), color=color, alpha=0.25)
    axes[0].set_xlabel("training time (virtual s, sim backend)")
    axes[0].set_ylabel("training grade of service (%)")
    axes[0].set_title("Learning curves, all services pooled\n(the training streams' load follows the time of day)")
    axes[0].legend()
    axes[0].grid(alpha=0.3)
    series = {LABELS["amarl"]: [ci95([r["virtual_s"] for r in amarl])],
              LABELS["single_ppo"]: [ci95([r["virtual_s"] for r in single])]}
    bar_group(axes[1], ["same number of decisions"], series, "training time (virtual s)")
    axes[1].set_title("Training wall-clock (virtual)")
    axes[1].legend(fontsize=8, loc="lower right")
    busiest = {name: [agent_compute_s(run_dir(out, name, s) / "metrics.csv")[0] for s in range(n)] for name in CONFIGS}
    series = {LABELS["amarl"]: [ci95(busiest["amarl"])], LABELS["single_ppo"]: [ci95(busiest["single_ppo"])]}
    bar_group(axes[2], ["busiest agent"], series, "real compute (s)")
    axes[2].set_title("Real compute of the busiest agent")
    axes[2].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Training: AMARL vs single-agent PPO ({n} seeds, 95% bands)")
    paths.append(_save(fig, out / "training.png"))
    return paths


def legend_below(ax, ncol: int) -> None:
    """A legend under the axes, where it cannot hide bars."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=ncol, frameon=False)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(res: dict[str, Any]) -> str:
    """The acceptance figures as Markdown."""
    def f(m: float, h: float, unit: str = "") -> str:
        return f"{m:.2f} ± {h:.2f}{unit}"

    lines = [f"# AMARL routing vs single-agent PPO ({res['seeds']} seeds; ± = 95% CI half-width)", "",
             f"Decisions per run: AMARL {res['env_steps']['amarl']}, single {res['env_steps']['single']}.", "",
             "| demand | AMARL GoS % | single GoS % | AMARL - single (pp) | SP first-fit GoS % | random feasible % | uniform random % |",
             "|---|---|---|---|---|---|---|"]
    for shift, label in SHIFT_LABELS.items():
        g = res.get(f"gos_pp_{shift}")
        if g is None:
            continue
        heur = [res.get(f"gos_pp_{shift}_{h}", (float("nan"), float("nan"))) for h in HEURISTICS]
        lines.append(f"| {label} | {f(g['amarl'], g['amarl_ci'])} | {f(g['single'], g['single_ci'])} | "
                     f"{f(g['diff'], g['diff_ci'])} | " + " | ".join(f(*h) for h in heur) + " |")
    lines += ["", "| demand | AMARL mean latency (ms) | single mean latency (ms) | AMARL p95 | single p95 |",
              "|---|---|---|---|---|"]
    for shift, label in SHIFT_LABELS.items():
        m, p = res.get(f"latency_mean_ms_{shift}"), res.get(f"latency_p95_ms_{shift}")
        if m is None:
            continue
        lines.append(f"| {label} | {f(m['amarl'], m['amarl_ci'])} | {f(m['single'], m['single_ci'])} | "
                     f"{f(p['amarl'], p['amarl_ci'])} | {f(p['single'], p['single_ci'])} |")
    v, r = res["virtual_train_s"], res["real_train_s"]
    lines += ["", f"- mean latency ratio AMARL/single (nominal): {f(*res['latency_ratio_nominal'])}",
              f"- training time, virtual (sim): AMARL {f(v['amarl'], v['amarl_ci'], ' s')}, single "
              f"{f(v['single'], v['single_ci'], ' s')}; ratio {f(*res['time_ratio'])}",
              f"- training time, real process time of the one sim process (not parallel): AMARL "
              f"{f(r['amarl'], r['amarl_ci'], ' s')}, single {f(r['single'], r['single_ci'], ' s')}",
              f"- real compute of the busiest agent (what parallel agents would wait for): AMARL "
              f"{f(*res['busiest_agent_compute_s']['amarl'], ' s')}, single {f(*res['busiest_agent_compute_s']['single'], ' s')}; "
              f"ratio {f(*res['busiest_compute_ratio'])}; all agents together: AMARL "
              f"{f(*res['all_agents_compute_s']['amarl'], ' s')}, single {f(*res['all_agents_compute_s']['single'], ' s')}",
              f"- commit conflict rate (refused commits planned on a stale snapshot, % of commits): AMARL "
              f"{f(*res['conflict_rate_pct']['amarl'], ' %')}, single {f(*res['conflict_rate_pct']['single'], ' %')} "
              f"(commits per run: AMARL {res['commits_per_run']['amarl'][0]:.0f}, single "
              f"{res['commits_per_run']['single'][0]:.0f})"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """AMARL routing comparison: train AMARL and single-agent PPO over seeds, then tabulate and plot."""
    p = argparse.ArgumentParser(prog="marlq routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per learner (default 5)")
    p.add_argument("--out", default="sweeps/routing", help="folder for the runs, tables and PNGs (default sweeps/routing)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override for both configs, e.g. run.total_env_steps=20000")
    p.add_argument("--plot-only", action="store_true", help="do not train; plot what is there")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds: must be at least 1, got {args.seeds}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.plot_only:
        train(out, args.seeds, args.overrides)
    res = compare(out)
    (out / "comparison.json").write_text(json.dumps(res, indent=2))
    text = report(res)
    (out / "comparison.md").write_text(text)
    for path in plot(out):
        print("wrote", path)
    print(text)
    return 0


COMMANDS = {"routing": main}  # marlq routing ...

if __name__ == "__main__":
    raise SystemExit(main())
