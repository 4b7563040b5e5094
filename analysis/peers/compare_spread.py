"""marl-q against BenchMARL on simple_spread (N=3, 25 cycles, local_ratio 0.5): returns at a budget
on both scales, and throughput from interleaved speed rounds.

    python analysis/peers/compare_spread.py --benchmarl OUT --marlq SWEEP_DIR [SWEEP_DIR ...] \
        [--at 300000] [--speed SPEED_OUT]

Returns: the mean of the last 100 training episodes finished at or before ``--at`` env steps (marl-q:
metrics.csv of each run; BenchMARL: the per-run JSON of benchmarl_spread.py, the last 100 episodes
of a run whose budget is ``--at``). Team sum = the 3 agents' rewards summed over the episode (the
scale of scenarios/spread_coma.yaml); per-agent mean = team sum / 3 (BenchMARL's episode_reward).
Mean and 95% t-interval over seeds. Speed: env steps per second of whole runs, from the rounds that
analysis/peers/speed_spread.sh ran one after the other on the same core; medians and ratio.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from scipy import stats

N_AGENTS = 3


def t_interval(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def marlq_return_at(run: Path, at: int, window: int = 100) -> float | None:
    """The mean of the last ``window`` episodes at or before ``at``; None if the run has not reached it."""
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    if not rows or int(rows[-1]["env_steps"]) < at:
        return None
    rows = [r for r in rows if int(r["env_steps"]) <= at]
    return float(np.mean([float(r["return"]) for r in rows[-window:]]))


def marlq_runs(sweeps: list[Path]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for sweep in sweeps:
        for run in sorted(sweep.glob("algorithm.name=*/seed*")):
            if (run / "metrics.csv").is_file():
                out.setdefault(run.parent.name.split("=", 1)[1], []).append(run)
    return out


def benchmarl_runs(folder: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*_s[0-9].json")):
        d = json.loads(path.read_text())
        out.setdefault(d["algorithm"], []).append(d)
    return out


def fmt(mean_hw: tuple[float, float]) -> str:
    m, hw = mean_hw
    return f"{m:7.1f} ± {hw:4.1f}" if np.isfinite(hw) else f"{m:7.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmarl", type=Path, required=True)
    ap.add_argument("--marlq", type=Path, nargs="+", required=True)
    ap.add_argument("--at", type=int, default=300_000)
    ap.add_argument("--speed", type=Path, default=None)
    args = ap.parse_args()
    print(f"simple_spread N=3, return at {args.at:,} env steps (mean of the last 100 episodes; "
          f"mean ± 95% t over seeds)")
    print(f"{'peer':10} {'algo':6} {'seeds':>5} {'team sum':>16} {'per agent':>16}")
    for algo, runs in sorted(marlq_runs(args.marlq).items()):
        team = [t for t in (marlq_return_at(r, args.at) for r in runs) if t is not None]
        if not team:
            continue
        print(f"{'marl-q':10} {algo:6} {len(team):5d} {fmt(t_interval(team)):>16} "
              f"{fmt(t_interval([t / N_AGENTS for t in team])):>16}")
    for algo, runs in sorted(benchmarl_runs(args.benchmarl).items()):
        runs = [d for d in runs if d["frames"] >= args.at]
        team = [d["final_return"]["team_sum"] for d in runs]
        agent = [d["final_return"]["per_agent_mean"] for d in runs]
        if not team:
            continue
        print(f"{'BenchMARL':10} {algo:6} {len(team):5d} {fmt(t_interval(team)):>16} {fmt(t_interval(agent)):>16}")
    if args.speed is not None:
        bm = [json.loads(p.read_text())["env_steps_per_s"] for p in sorted(args.speed.glob("mappo_s*_speed_r*.json"))]
        mq = []
        for p in sorted(args.speed.glob("marlq_speed_r*/summary.json")):
            s = json.loads(p.read_text())
            mq.append(s["env_steps"] / s["wall_s"])
        if bm and mq:
            print(f"\nthroughput, MAPPO, whole runs, one core, interleaved rounds ({len(bm)} BenchMARL, {len(mq)} marl-q)")
            print(f"  BenchMARL env steps/s: median {np.median(bm):8.0f}  (min {min(bm):.0f}, max {max(bm):.0f})")
            print(f"  marl-q    env steps/s: median {np.median(mq):8.0f}  (min {min(mq):.0f}, max {max(mq):.0f})")
            print(f"  ratio marl-q / BenchMARL: {np.median(mq) / np.median(bm):.1f}x")
        for name in ("uptime_before.txt", "uptime_after.txt"):
            if (args.speed / name).is_file():
                print(f"  {name[:-4]}: {(args.speed / name).read_text().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
