"""`marlq bench sim_scale`: the sim backend at 10, 100 and 1,000 workers (docs/runtime.md, "Many
workers on sim").

Each (variant, worker count) is one run of a scenario file in a fresh process, so that its peak
resident memory (VmHWM) is its own. Printed per run: the env steps it counted, wall and CPU seconds
(the process's user + system time, which a loaded machine disturbs less than the wall clock), both
per 1M env steps, the peak RSS, and the ratio of each to the first worker count of the same variant.

A run's fixed costs (building the workers, a first wave of steps computed at virtual time 0 at many
workers) weigh more in a short run than in 1M steps, so the run also times its second half alone (from
the first record of work at half its budget to its last, before the final checkpoint): that rate is
``steady_*_per_1M``, and ``wall_1M_est`` the run's wall time carried on to 1M env steps at it (the run's
own wall time when it counted 1M or more), a linear extrapolation which assumes the rate holds.

``--repeats N`` runs every (variant, worker count) N times, interleaved (round r runs every one of them
once, in order, before round r + 1), and prints the medians; each repeat of a run must write the bytes
of its first (metrics.csv, train.csv, comm.csv: the sim backend's promise on one machine), which the
``rerun`` column says (and the exit code is 1 if one differs). Timings are printed, never asserted;
the load average (``/proc/loadavg``) at the start and end is printed with them. ``--plot`` draws the
episode return against virtual time and against env steps for every run (a column per variant, one
line per worker count) from the first repeat's metrics.csv.

    marlq bench sim_scale --workers 10,100,1000 --steps 200000 --repeats 2 --out sweeps/sim_scale \
        --plot docs/img/sim_scale.png
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
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
    """The sim backend against worker count: wall and CPU time per 1M env steps (whole runs and their
    second halves), peak RSS, byte-identical reruns (--repeats), and the return against virtual time
    (--plot)."""
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
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every (variant, worker count), interleaved; medians printed, rerun bytes compared")
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: temporary)")
    p.add_argument("--plot", type=Path, default=None, help="draw return against virtual time and env steps to this PNG")
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
    if args.repeats < 1:
        raise ConfigError(f"--repeats: must be >= 1, got {args.repeats}")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    for name, overrides in variants.items():  # every run's config is valid before the first starts
        load_config(args.config, _overrides(args, overrides, max(counts)))
    tmp = None if args.out is not None else Path(tempfile.mkdtemp(prefix="marlq-sim-scale-"))
    root = args.out if args.out is not None else tmp
    load = {"loadavg_start": _loadavg()}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(name, w): [] for name in variants for w in counts}
    try:
        for r in range(args.repeats):  # interleaved: every run once per round
            for name, overrides in variants.items():
                for w in counts:
                    run_dir = root / _slug(name) / (f"w{w}" if r == 0 else f"w{w}-rerun{r}")
                    run_dir.parent.mkdir(parents=True, exist_ok=True)
                    one = _run_child(args, _overrides(args, overrides, w), run_dir)
                    one["run_dir"] = str(run_dir)
                    runs[(name, w)].append(one)
                    print(f"  {name} W={w} (repeat {r + 1}/{args.repeats}): {one['env_steps']:,} env steps, "
                          f"wall {one['wall_s']:.1f} s, cpu {one['cpu_s']:.1f} s, peak RSS {one['peak_rss_mb']:.0f} MB",
                          file=sys.stderr, flush=True)
        load["loadavg_end"] = _loadavg()
        rows = add_ratios([summarize_repeats(name, w, runs[(name, w)]) for name in variants for w in counts])
        if args.plot is not None:
            args.seed_label = load_config(args.config, _overrides(args, [], counts[0])).run.seed
            plot_returns(rows, args.plot, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps([dict(row, **load) for row in rows], indent=1))
    else:
        from marl_q.bench.runs import print_table

        unit = "episodes" if args.episodes is not None else "env steps"
        print_table(f"sim at scale: {args.config}, {args.episodes or args.steps:,} {unit} a run, "
                    f"{args.repeats} run(s) each, interleaved, medians (x: against the first worker count of the "
                    f"variant; steady: the second half of each run; load average {load['loadavg_start']} at the "
                    f"start, {load['loadavg_end']} at the end)",
                    rows, ["variant", "workers", "env_steps", "wall_per_1M", "wall_x", "cpu_per_1M", "cpu_x",
                           "steady_wall_per_1M", "steady_cpu_per_1M", "steady_cpu_x", "wall_1M_est", "wall_1M_x",
                           "peak_rss_mb", "rss_x", "rerun"])
    differ = [f"{r['variant']} W={r['workers']}: {r['rerun']}" for r in rows if r["rerun"] not in ("-", "identical")]
    if differ:
        print("sim_scale: reruns that did not write the bytes of their first run: " + "; ".join(differ), file=sys.stderr)
        return 1
    return 0


RUN_FILES = ("metrics.csv", "train.csv", "comm.csv")  # what a sim rerun must write byte for byte


def rerun_differences(first: Path, other: Path) -> list[str]:
    """The run files (RUN_FILES) of ``other`` whose bytes are not those of ``first``'s (or that only one
    of them wrote: an LSVI run writes no train.csv)."""
    def content(path: Path) -> Optional[bytes]:
        return path.read_bytes() if path.is_file() else None

    return [name for name in RUN_FILES if content(first / name) != content(other / name)]


def summarize_repeats(name: str, workers: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the repeats of one (variant, worker count): the first run's counts and directory,
    the median of each measured cost, and ``rerun``: "identical", what differed, or "-" for one run."""
    row: dict[str, Any] = {"variant": name, "workers": workers, **runs[0]}
    for key in runs[0]:
        if key in MEASURED and all(r.get(key) is not None for r in runs):
            row[key] = round(statistics.median(r[key] for r in runs), 2)
    row["repeats"] = len(runs)
    if len(runs) == 1:
        row["rerun"] = "-"
    else:
        differ = sorted({f for r in runs[1:] for f in rerun_differences(Path(runs[0]["run_dir"]), Path(r["run_dir"]))})
        row["rerun"] = "identical" if not differ else "DIFFER: " + ",".join(differ)
    return row


RATIOS = {"wall_per_1M": "wall_x", "cpu_per_1M": "cpu_x", "peak_rss_mb": "rss_x", "steady_wall_per_1M": "steady_wall_x",
          "steady_cpu_per_1M": "steady_cpu_x", "wall_1M_est": "wall_1M_x"}


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured cost of a row (RATIOS) divided by that of the first row of its variant (the first
    worker count), to 2 decimals; None where either is missing."""
    for row in rows:
        first = next(r for r in rows if r["variant"] == row["variant"])
        for key, ratio in RATIOS.items():
            row[ratio] = round(row[key] / first[key], 2) if row.get(key) and first.get(key) else None
    return rows


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


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


# what a child measures (medians over repeats); the rest of its line is what the run counted
MEASURED = ("wall_s", "cpu_s", "wall_per_1M", "cpu_per_1M", "peak_rss_mb", "steady_wall_per_1M",
            "steady_cpu_per_1M", "wall_1M_est", "rss_half_mb", "rss_end_mb")


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


class _HalfMark:
    """The clocks when a run's counted work first reaches half its budget, and at its last record of
    work (before the final checkpoint and summary, fixed costs of any run): ``Runtime.record_work`` is
    wrapped in this (bench) process only, and reads the counts the runtime keeps."""

    def __init__(self, cfg: Any) -> None:
        from marl_q import runtime

        self.budget = ("episodes", cfg.run.total_episodes) if cfg.run.total_episodes else \
            ("env_steps", cfg.run.total_env_steps)
        self.at: Optional[dict[str, float]] = None
        self.last: Optional[tuple[float, float, int]] = None  # (wall, cpu, env steps)
        real = runtime.Runtime.record_work
        mark = self

        def record_work(rt: Any, *a: Any, **k: Any) -> None:
            real(rt, *a, **k)
            if mark.at is not None:
                mark.last = (time.perf_counter(), _cpu_s(), rt.env_steps)
            elif getattr(rt, mark.budget[0]) * 2 >= mark.budget[1]:
                from marl_q.bench.memory import proc_status_kb

                mark.at = {"wall": time.perf_counter(), "cpu": _cpu_s(), "env_steps": rt.env_steps,
                           "rss_mb": (proc_status_kb("VmRSS") or 0) / 1024}

        runtime.Runtime.record_work = record_work


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
    half = _HalfMark(cfg)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    summary = run_experiment(cfg, args.run_dir, plots=False)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    steps = int(summary.get("env_steps") or 0)
    per = 1e6 / steps if steps else float("nan")
    out = {"env_steps": steps, "episodes": summary.get("episodes"), "updates": summary.get("updates"),
           "virtual_s": summary.get("virtual_s"), "final_return": summary.get("final_return"),
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "wall_per_1M": round(wall * per, 1),
           "cpu_per_1M": round(cpu * per, 1), "peak_rss_mb": round((proc_status_kb("VmHWM") or 0) / 1024, 1),
           "rss_end_mb": round((proc_status_kb("VmRSS") or 0) / 1024, 1)}
    if half.at is not None and half.last is not None and half.last[2] > half.at["env_steps"]:
        last_wall, last_cpu, last_steps = half.last
        rate = 1e6 / (last_steps - half.at["env_steps"])  # the second half, per 1M env steps
        steady_wall = (last_wall - half.at["wall"]) * rate
        out.update(steady_wall_per_1M=round(steady_wall, 1), steady_cpu_per_1M=round((last_cpu - half.at["cpu"]) * rate, 1),
                   wall_1M_est=round(wall + max(0, 1_000_000 - steps) * steady_wall / 1e6, 1),
                   rss_half_mb=round(half.at["rss_mb"], 1))
    print(json.dumps(out))
    return 0


def plot_returns(rows: list[dict[str, Any]], path: Path, args: argparse.Namespace, window: int = 100) -> Path:
    """Episode return (mean of the last ``window`` episodes, over all workers) against virtual time (top)
    and against env steps (bottom): one column per variant, one line per worker count."""
    import numpy as np

    from matplotlib.ticker import FuncFormatter, NullFormatter

    from analysis.plots import new_figure, plt, read_csv_columns, wrap

    variants = list(dict.fromkeys(r["variant"] for r in rows))
    width = max(7.0, 5.2 * len(variants))
    fig, axes = new_figure((width, 8.4), nrows=2, ncols=len(variants))
    for col, name in enumerate(variants):
        top, bottom = axes[0, col], axes[1, col]
        for i, r in enumerate(r for r in rows if r["variant"] == name):
            cols = read_csv_columns(Path(r["run_dir"]) / "metrics.csv")
            if "return" not in cols:  # (the LSVI family writes regret, not returns)
                print(f"sim_scale: {r['run_dir']}/metrics.csv has no return column: not drawn", file=sys.stderr)
                continue
            t, ret = np.asarray(cols["t"], float), np.asarray(cols["return"], float)
            steps = np.asarray(cols["env_steps"], float)
            if not len(t):
                continue
            order = np.argsort(t, kind="stable")  # rows are written in virtual-time order; stable for ties
            t, ret, steps = t[order], ret[order], steps[order]
            mean = np.convolve(ret, np.ones(window), "full")[: len(ret)] / np.minimum(np.arange(1, len(ret) + 1), window)
            label = f"{r['workers']:,} workers"
            top.plot(t, mean, label=label, lw=1.4, color=f"C{i}")
            bottom.plot(steps, mean, label=label, lw=1.4, color=f"C{i}")
        top.set_xscale("log")
        top.xaxis.set_minor_formatter(NullFormatter())
        top.set_xlabel("virtual time (s, log scale)")
        bottom.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e3:,.0f}k" if x else "0"))
        bottom.set_xlabel("env steps (all workers; k = thousand)")
        for ax in (top, bottom):
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
