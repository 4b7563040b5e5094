"""`marlq bench sim_scale`: the sim backend at 10, 100 and 1,000 workers (docs/runtime.md, "Many
workers on sim").

Each (variant, worker count) is one run of a scenario file in a fresh process, so that its peak
resident memory (VmHWM) is its own. Printed per run: the env steps it counted, wall and CPU seconds
(the process's user + system time, which a loaded machine disturbs less than the wall clock), both
per 1M env steps, the peak RSS, and the ratio of each to the first worker count of the same variant.
Timings are printed, never asserted. ``--plot`` draws the episode return against virtual time for
every run (one panel per variant, one line per worker count) from the runs' metrics.csv.

    marlq bench sim_scale --workers 10,100,1000 --steps 200000 --out sweeps/sim_scale --plot docs/img/sim_scale.png
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

# name -> overrides; the default variants are the two aggregation rules of the figure
DEFAULT_VARIANTS = {
    "hogwild+poly": ["server.aggregation=hogwild", "server.staleness.rule=poly"],
    "buffered K=10": ["server.aggregation=buffered", "server.buffer_k=10"],
}


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, overrides); a ConfigError for a malformed one."""
    from marl_q.errors import ConfigError

    name, sep, rest = text.partition(":")
    overrides = [o.strip() for o in rest.split(",") if o.strip()]
    if not sep or not name.strip() or any("=" not in o for o in overrides):
        raise ConfigError(f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...], "
                          "e.g. 'hogwild+poly:server.aggregation=hogwild,server.staleness.rule=poly'")
    return name.strip(), overrides


def parse_workers(text: str) -> list[int]:
    from marl_q.errors import ConfigError

    try:
        counts = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ConfigError(f"--workers {text!r}: expected positive worker counts, comma-separated (e.g. 10,100,1000)")
    return counts


def sim_scale_main(argv: Optional[Sequence[str]] = None) -> int:
    """The sim backend against worker count: wall and CPU time per 1M env steps, peak RSS, and the
    return against virtual time (--plot)."""
    p = argparse.ArgumentParser(prog="marlq bench sim_scale", description=sim_scale_main.__doc__)
    p.add_argument("--config", default="scenarios/cartpole_a3c.yaml", help="the scenario file every run starts from")
    p.add_argument("--workers", default="10,100,1000", help="worker counts, comma-separated")
    p.add_argument("--steps", type=int, default=200_000, help="run.total_env_steps of every run")
    p.add_argument("--episodes", type=int, default=None,
                   help="run.total_episodes instead (a config budgeted in episodes, e.g. the LSVI family's)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="a named set of overrides (repeatable); default: " + "; ".join(
                       f"{k}: {','.join(v)}" for k, v in DEFAULT_VARIANTS.items()))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every run (e.g. backend.compute.speeds=lognormal)")
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: temporary)")
    p.add_argument("--plot", type=Path, default=None, help="draw return against virtual time to this PNG")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    from marl_q.config import load_config
    from marl_q.errors import ConfigError

    counts = parse_workers(args.workers)
    variants = dict(parse_variant(v) for v in args.variant) if args.variant else dict(DEFAULT_VARIANTS)
    if args.episodes is None and args.steps < 1 or args.episodes is not None and args.episodes < 1:
        raise ConfigError("--steps and --episodes: must be positive")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    for name, overrides in variants.items():  # every run's config is valid before the first starts
        load_config(args.config, _overrides(args, overrides, max(counts)))
    tmp = None if args.out is not None else Path(tempfile.mkdtemp(prefix="marlq-sim-scale-"))
    root = args.out if args.out is not None else tmp
    rows: list[dict[str, Any]] = []
    try:
        for name, overrides in variants.items():
            for w in counts:
                run_dir = root / _slug(name) / f"w{w}"
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                row = _run_child(args, _overrides(args, overrides, w), run_dir)
                row.update(variant=name, workers=w, run_dir=str(run_dir))
                first = next(r for r in rows + [row] if r["variant"] == name)
                for key in ("wall_per_1M", "cpu_per_1M", "peak_rss_mb"):
                    row[key.replace("per_1M", "x").replace("peak_rss_mb", "rss_x")] = round(row[key] / first[key], 2)
                rows.append(row)
                print(f"  {name} W={w}: {row['env_steps']:,} env steps, wall {row['wall_s']:.1f} s, "
                      f"cpu {row['cpu_s']:.1f} s, peak RSS {row['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
        if args.plot is not None:
            args.seed_label = load_config(args.config, _overrides(args, [], counts[0])).run.seed
            plot_returns(rows, args.plot, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        from marl_q.bench.runs import print_table

        unit = "episodes" if args.episodes is not None else "env steps"
        print_table(f"sim at scale: {args.config}, {args.episodes or args.steps:,} {unit} a run "
                    f"(x: against the first worker count of the variant)",
                    rows, ["variant", "workers", "env_steps", "wall_per_1M", "wall_x", "cpu_per_1M", "cpu_x",
                           "peak_rss_mb", "rss_x"])
    return 0


def _overrides(args: argparse.Namespace, variant: list[str], workers: int) -> list[str]:
    budget = [f"run.total_episodes={args.episodes}"] if args.episodes is not None else \
        [f"run.total_env_steps={args.steps}"]
    return [f"backend.workers={workers}", *budget, "run.progress=false", "run.plots=false",
            "run.checkpoint_every=0", *variant, *args.overrides]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") or "variant"


def _run_child(args: argparse.Namespace, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """One run in a fresh process (its own peak RSS); what it measured."""
    cmd = [sys.executable, "-m", "marl_q.bench.sim_scale", "--child", "--config", args.config,
           "--run-dir", str(run_dir), *[a for o in overrides for a in ("--set", o)]]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"sim_scale: the run with {' '.join(overrides)} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(args: argparse.Namespace) -> int:
    """Run one config into --run-dir; print one JSON line: what it counted and cost."""
    import torch

    from marl_q.bench.memory import proc_status_kb
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    torch.set_num_threads(1)
    cfg = load_config(args.config, args.overrides)
    if args.run_dir.exists():
        shutil.rmtree(args.run_dir)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    summary = run_experiment(cfg, args.run_dir, plots=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    steps = int(summary.get("env_steps") or 0)
    per = 1e6 / steps if steps else float("nan")
    print(json.dumps({"env_steps": steps, "episodes": summary.get("episodes"), "updates": summary.get("updates"),
                      "virtual_s": summary.get("virtual_s"), "final_return": summary.get("final_return"),
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "wall_per_1M": round(wall * per, 1),
                      "cpu_per_1M": round(cpu * per, 1), "peak_rss_mb": round((proc_status_kb("VmHWM") or 0) / 1024, 1)}))
    return 0


def plot_returns(rows: list[dict[str, Any]], path: Path, args: argparse.Namespace, window: int = 100) -> Path:
    """Episode return (mean of the last ``window`` episodes, over all workers) against virtual time:
    one panel per variant, one line per worker count."""
    import numpy as np

    from matplotlib.ticker import NullFormatter

    from analysis.plots import new_figure, plt, read_csv_columns, wrap

    variants = list(dict.fromkeys(r["variant"] for r in rows))
    width = max(7.0, 5.2 * len(variants))
    fig, axes = new_figure((width, 4.6), ncols=len(variants))
    for ax, name in zip(axes.ravel(), variants):
        for r in (r for r in rows if r["variant"] == name):
            cols = read_csv_columns(Path(r["run_dir"]) / "metrics.csv")
            t, ret = np.asarray(cols["t"], float), np.asarray(cols["return"], float)
            if not len(t):
                continue
            order = np.argsort(t, kind="stable")
            t, ret = t[order], ret[order]
            mean = np.convolve(ret, np.ones(window), "full")[: len(ret)] / np.minimum(np.arange(1, len(ret) + 1), window)
            ax.plot(t, mean, label=f"{r['workers']:,} workers", lw=1.4)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("virtual time (s, log scale)")
        ax.set_ylabel(f"episode return (mean of last {window} episodes)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="backend.workers", title_fontsize=8)
    budget = f"{args.episodes:,} episodes" if args.episodes is not None else f"{args.steps:,} env steps"
    fig.suptitle(wrap(f"sim backend at scale: {Path(args.config).name}, {budget} per run, "
                      f"seed {args.seed_label} (one run per line)", int(11 * width)), fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"figure: {path}", file=sys.stderr)
    return path


BENCHES = {"sim_scale": sim_scale_main}  # marlq bench sim_scale

if __name__ == "__main__":
    sys.exit(sim_scale_main(sys.argv[1:]))
