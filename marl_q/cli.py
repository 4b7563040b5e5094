"""`marlq`: run, resume, sweep, plot, list, bench. Exit codes: 0 ok, 2 bad input (named), 1 failure
(a worker that keeps failing, or a run file that cannot be written: no space, directory removed or
read-only, named with the last good checkpoint), 130 interrupted (the run directory keeps what was
computed; the one line printed says whether `marlq resume` can continue it)."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

from marl_q.errors import ConfigError, RunLost, RunWriteError, UserError

EXIT_OK, EXIT_FAIL, EXIT_USER, EXIT_INTERRUPTED = 0, 1, 2, 130
BUILTIN = {"run", "resume", "sweep", "plot", "list", "bench"}
TENSORBOARD_HELP = "also write TensorBoard event files into each run directory (run.tensorboard=true)"


class _Parser(argparse.ArgumentParser):
    """argparse that raises (so usage mistakes exit 2 through one path) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="marlq", description="Asynchronous multi-agent RL with optional quantum heads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run one scenario file")
    r.add_argument("config", help="scenario YAML file")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted), e.g. --set server.aggregation=sync")
    r.add_argument("--out", help="run directory (default: runs/<config>/seed<N>-<time>)")
    r.add_argument("--seed", type=int, help="shorthand for --set run.seed=N")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--tensorboard", action="store_true", help=TENSORBOARD_HELP)

    rs = sub.add_parser("resume", help="continue a stopped or interrupted run from its latest checkpoint")
    rs.add_argument("run_dir", help="the run directory")
    rs.add_argument("--from", dest="checkpoint", metavar="CKPT",
                    help="a checkpoint file (default: the newest in RUN_DIR/checkpoints)")
    rs.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="change the budget or bookkeeping, e.g. --set run.total_env_steps=200000")
    rs.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("sweep", help="run a grid x seeds in parallel processes; rerun to continue")
    s.add_argument("config")
    s.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    s.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="values of one key to cross with the others")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--out", help="sweep folder (default: sweeps/<config>)")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    s.add_argument("--no-plot", action="store_true",
                   help="skip the sweep's own figures at the end (each run still draws its own: --set run.plots=false)")
    s.add_argument("--tensorboard", action="store_true",
                   help=TENSORBOARD_HELP + "; `tensorboard --logdir SWEEP` names runs by their grid cell")
    s.add_argument("--batch-seeds", action="store_true",
                   help="run the seeds of each grid cell side by side in --jobs processes (one-step A2C: "
                        "agents/batched_a2c.py; MAPPO/IPPO/IA2C/MAA2C with one worker: agents/batched_ppo.py), "
                        "each seed's run directory as if it had run alone")

    pl = sub.add_parser("plot", help="plot run directories or sweep folders")
    pl.add_argument("paths", nargs="+")
    pl.add_argument("--out", help="folder for the PNGs (default: <path>/plots)")
    pl.add_argument("--label", action="append", default=[], metavar="KEY=TEXT",
                    help="legend text for one group; KEY is a path given (or a run directory in the group) or "
                         "the group's automatic label; repeatable")
    pl.add_argument("--title", help="figure title (default: built from what was run and what differs)")

    sub.add_parser("list", help="list registered algorithms, heads, scenarios, backends, rules")

    b = sub.add_parser("bench", help="benchmarks: marlq bench NAME [args]")
    b.add_argument("name")
    b.add_argument("args", nargs=argparse.REMAINDER)

    # the discovered commands (analysis reports) parse their own arguments; listed here for `marlq --help`
    # by name and help, read from their modules' source (none is imported)
    from marl_q.registry import COMMANDS

    for name, help in COMMANDS.describe():
        if name not in BUILTIN:
            sub.add_parser(name, help=(help or f"see marlq {name} --help").replace("%", "%%"), add_help=False)
    return p


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's Python stack of a running ``marlq`` to stderr and lets it
    go on: where a run that seems stuck (a slow shutdown, a wait on a worker) is waiting."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def interrupt_on_sigint() -> None:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt even when the process started with SIGINT ignored, as a
    non-interactive shell starts a background job (`marlq run ... &` in a script) and then `kill -INT`
    did nothing on the sim and ray backends (local installs its own handler): every backend stops,
    checkpoints and prints how to resume the same way."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:  # run as a program (the `marlq` script, python -m marl_q.cli), not called from Python
        dump_stacks_on_sigusr1()
        interrupt_on_sigint()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench" and len(argv) >= 2 and not argv[1].startswith("-"):
            return cmd_bench(argv[1], argv[2:])
        if argv and argv[0] not in BUILTIN and not argv[0].startswith("-"):
            from marl_q.registry import COMMANDS

            if argv[0] in COMMANDS:  # imports that command's module only
                return int(COMMANDS.get(argv[0]).obj(argv[1:]) or 0)
        args = build_parser().parse_args(argv)
        commands = {"run": cmd_run, "resume": cmd_resume, "sweep": cmd_sweep, "plot": cmd_plot, "list": cmd_list}
        return commands[args.command](args)
    except UserError as exc:
        print(f"marlq: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except (RunWriteError, RunLost) as exc:  # the disk or a node failed the run (no space, server's node lost)
        print(f"marlq: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt as exc:  # one line: whether and how the run can be continued
        print(str(exc) if str(exc).startswith("marlq:") else "marlq: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `marlq ... | head`: the reader left; the run itself is saved
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception:  # a bug or a failure of the run itself
        traceback.print_exc()
        return EXIT_FAIL


# ----------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from marl_q.config import load_config

    out_arg = out_dir(args.out) if args.out else None
    cfg = load_config(args.config, args.overrides + (["run.tensorboard=true"] if args.tensorboard else []),
                      seed=args.seed)
    # after the config: a mistake in it shows without the runtime's imports
    from marl_q.experiment import run_experiment

    if args.quiet:
        cfg.run.progress = False
    out = out_arg or default_run_dir(args.config, cfg.run.seed)
    return _report(run_experiment(cfg, out), out)


def cmd_resume(args: argparse.Namespace) -> int:
    from marl_q.experiment import resume_experiment

    overrides = list(args.overrides) + (["run.progress=false"] if args.quiet else [])
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    from agents.batched_a2c import BATCHED_SNAPSHOT, resume_batched_seeds

    if _snapshot_kind(Path(args.run_dir), ckpt) == BATCHED_SNAPSHOT:  # a seed of `marlq sweep --batch-seeds`
        [summary] = resume_batched_seeds([Path(args.run_dir)], list(args.overrides), checkpoint=ckpt,
                                         progress=not args.quiet)
        return _report(summary, Path(args.run_dir))
    return _report(resume_experiment(Path(args.run_dir), overrides, checkpoint=ckpt), Path(args.run_dir))


def _snapshot_kind(run_dir: Path, checkpoint: Optional[Path] = None) -> Optional[str]:
    """The snapshot kind of the checkpoint a resume of ``run_dir`` would start from (None without one, or
    when it cannot be read: the resume itself then says why)."""
    from marl_q.experiment import snapshot_kind
    from marl_q.rundir import latest_checkpoint, load_checkpoint

    try:
        path = checkpoint if checkpoint is not None else latest_checkpoint(run_dir)
        if path is not None and not path.is_absolute() and not path.exists():
            path = run_dir / "checkpoints" / path
        return snapshot_kind(load_checkpoint(path)[1]) if path is not None else None
    except (UserError, OSError):
        return None


def _report(summary: dict, out: Path) -> int:
    keys = ["status", "env_steps", "episodes", "final_return", "steps_to_solve", "wall_s", "virtual_s",
            "messages", "rejected", "dropped_stale"]
    shown = {k: summary[k] for k in keys if k in summary}
    print(json.dumps(shown))
    print(f"run directory: {out}")
    if summary.get("status") == "stopped":
        print(f"stopped at run.stop_after_updates; continue with `marlq resume {out}`")
        return EXIT_OK
    return EXIT_OK if summary.get("status") == "completed" else EXIT_FAIL


def out_dir(value: str, option: str = "--out") -> Path:
    """A directory to write into (new or existing): a path at or above it that is a file is a user error."""
    path = Path(value)
    for p in [path, *path.parents]:
        if p.exists() and not p.is_dir():
            what = "" if p == path else f" ({p} is a file)"
            raise UserError(f"{option}: {path} is not a directory{what}; give a folder to write into")
    return path


def default_run_dir(config: str, seed: int) -> Path:
    return Path("runs") / Path(config).stem / f"seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"


# ----------------------------------------------------------------------------- sweep
def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid: expected KEY=V1,V2,..., got {item!r}")
        key, values = item.split("=", 1)
        vals = [v for v in values.split(",") if v != ""]
        if not key or not vals:
            raise ConfigError(f"--grid: expected KEY=V1,V2,..., got {item!r}")
        grid.append((key.strip(), vals))
    return grid


def cmd_sweep(args: argparse.Namespace) -> int:
    from marl_q.config import load_config

    grid = parse_grid(args.grid)
    out_arg = out_dir(args.out) if args.out else None
    if args.tensorboard:
        args.overrides = list(args.overrides) + ["run.tensorboard=true"]
    if args.seeds < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {args.seeds}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1, got {args.jobs}")
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in grid])) or [()]
    # validate every combination before starting anything
    for combo in combos:
        cfg = load_config(args.config, list(args.overrides) + [f"{k}={v}" for k, v in combo], seed=0)
        if args.batch_seeds:
            from agents.batched_a2c import BATCHED_SNAPSHOT, check_batchable

            check_batchable(cfg)
        if cfg.run.tensorboard:
            from marl_q.tracking import require_tensorboard

            require_tensorboard()
    root = out_arg or Path("sweeps") / Path(args.config).stem
    # a run another marlq is still writing (a second sweep into the same folder) is neither resumed nor
    # moved aside: its process would go on writing into the moved folder while a new run starts in its place
    from marl_q.rundir import run_dir_holder

    for combo in combos:
        cell = ",".join(f"{k}={v}" for k, v in combo) or "base"
        for seed in range(args.seeds):
            holder = run_dir_holder(root / cell / f"seed{seed}")
            if holder is not None:
                raise UserError(f"marlq sweep: {root / cell / f'seed{seed}'} is in use by a running marlq ({holder}); "
                                "wait for it or stop it first")
    root.mkdir(parents=True, exist_ok=True)
    jobs = []
    for combo in combos:
        cell = ",".join(f"{k}={v}" for k, v in combo) or "base"
        fresh: list[int] = []  # --batch-seeds: the seeds of this cell to start, run side by side below
        resumed: list[int] = []  # --batch-seeds: the seeds to continue from batched checkpoints, side by side
        for seed in range(args.seeds):
            out = root / cell / f"seed{seed}"
            if _completed(out):
                continue
            if args.batch_seeds and _resumable(out) and _snapshot_kind(out) == BATCHED_SNAPSHOT:
                print(f"sweep: {out} was incomplete; resuming it with its batch from its latest checkpoint")
                resumed.append(seed)
                continue
            if _resumable(out):
                print(f"sweep: {out} was incomplete; resuming it from its latest checkpoint")
                jobs.append((out, [sys.executable, "-m", "marl_q.cli", "resume", str(out), "--quiet"]))
                continue
            if out.exists():
                keep = out.with_name(out.name + ".interrupted")
                if keep.exists():
                    shutil.rmtree(keep)
                out.rename(keep)
                print(f"sweep: {out} was incomplete; kept it as {keep.name} and starting it again")
            if args.batch_seeds:
                fresh.append(seed)
                continue
            cmd = [sys.executable, "-m", "marl_q.cli", "run", args.config, "--out", str(out), "--seed", str(seed),
                   "--quiet"]
            for ov in list(args.overrides) + [f"{k}={v}" for k, v in combo]:
                cmd += ["--set", ov]
            jobs.append((out, cmd))
        if resumed:
            from agents.batched_a2c import resume_jobs

            jobs += resume_jobs(resumed, root / cell, args.jobs)
        if fresh:
            from agents.batched_a2c import batch_jobs

            jobs += batch_jobs(args.config, list(args.overrides) + [f"{k}={v}" for k, v in combo], fresh,
                               root / cell, args.jobs)
    total = len(combos) * args.seeds
    to_run = len(jobs) if not args.batch_seeds else sum(len(cmd[cmd.index("--seeds") + 1].split(",")) if "--seeds" in cmd
                                                        else 1 for _, cmd in jobs)
    print(f"sweep: {total} runs in {root}, {total - to_run} already complete, {to_run} to run")
    failed = _run_pool(jobs, args.jobs)
    if not args.no_plot:
        for path in _plotter()([root], root / "plots"):
            print(f"plot: {path}")
    if failed:
        print(f"sweep: {len(failed)} runs failed: " + ", ".join(str(f) for f in failed), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _resumable(out: Path) -> bool:
    """An incomplete run whose newest checkpoint reads back and is short of the run's budget (a sweep
    continues it rather than start it again)."""
    from marl_q.config import read_yaml
    from marl_q.rundir import is_run_dir, latest_checkpoint, load_checkpoint
    from marl_q.runtime import CHECKPOINT_FORMAT

    if not is_run_dir(out) or latest_checkpoint(out) is None:
        return False
    try:
        meta = load_checkpoint(latest_checkpoint(out))[1]
        run = read_yaml(out / "config.yaml").get("run", {})
    except UserError:
        return False
    short = [(run.get(key) is None or meta.get(have, 0) < run[key])
             for key, have in (("total_env_steps", "env_steps"), ("total_episodes", "episodes"))]
    return meta.get("format") == CHECKPOINT_FORMAT and all(short)


def _completed(out: Path) -> bool:
    try:
        return json.loads((out / "summary.json").read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def _run_pool(jobs: list[tuple[Path, list[str]]], width: int) -> list[Path]:
    """Run the jobs `width` at a time under one progress bar over the runs (done/total, elapsed, ETA)."""
    from marl_q.progress import Progress

    running: list[tuple[Path, subprocess.Popen, float]] = []
    failed: list[Path] = []
    queue = list(jobs)
    # each run records how many the sweep runs at once (its wall time was measured beside them)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MARLQ_SWEEP_JOBS=str(min(width, len(jobs)) or 1))
    bar = Progress(len(jobs), "run", "sweep",
                   rate_from="start",  # runs begun together: the rate since the start (marl_q.progress)
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} runs "
                              "[{elapsed} elapsed, ETA {remaining}]{postfix}")
    try:
        while queue or running:
            while queue and len(running) < width:
                out, cmd = queue.pop(0)
                out.parent.mkdir(parents=True, exist_ok=True)
                log = open(out.parent / f"{out.name}.log", "w")
                running.append((out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                                time.perf_counter()))
                bar.postfix(f"running {len(running)}", refresh=True)
            time.sleep(0.2)
            for item in list(running):
                out, proc, start = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if proc.returncode != 0:
                    failed.append(out)
                    bar.write(f"sweep: {out} FAILED (exit {proc.returncode}, see {out.name}.log)")
                bar.postfix(f"last {out.parent.name}/{out.name} {time.perf_counter() - start:.0f}s"
                            + (f", {len(failed)} failed" if failed else ""))
                bar.update(1)
    finally:
        bar.close()
    return failed


# ----------------------------------------------------------------------------- plot, list, bench
def _plotter():
    """The standard plots, found through the registry (marl_q does not import analysis directly)."""
    from marl_q.registry import PLOTS

    return PLOTS.get("standard").obj


def parse_labels(items: list[str]) -> list[str]:
    """--label KEY=TEXT items, checked for form; the plotter matches KEY (which may hold '=' itself, like an
    automatic label `lr=0.01`) against the groups."""
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise UserError(f"--label: expected KEY=TEXT, got {item!r}")
    return list(items)


def cmd_plot(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.paths]
    out = out_dir(args.out) if args.out else None
    labels = parse_labels(args.label)
    for path in _plotter()(paths, out, labels=labels, title=args.title):
        print(f"plot: {path}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    """Every registered name with its whole one-line help, wrapped to the terminal under its column (the
    names and helps are read from the plugins' source; a module is imported only where that cannot tell)."""
    import textwrap

    from marl_q.registry import ALL, index_plugins

    index_plugins()  # every registry at once: each plugin module's source is searched and read once
    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    for title, reg in ALL.items():
        print(f"{title}:")
        for name, help in reg.describe():
            print(textwrap.fill(help, width, initial_indent=f"  {name:<24} ", subsequent_indent=" " * 27,
                                break_long_words=False, break_on_hyphens=False) if help else f"  {name}")
    return EXIT_OK


def cmd_bench(name: str, argv: list[str]) -> int:
    from marl_q.native import prepare_process
    from marl_q.registry import BENCHES

    prepare_process()  # benches run as runs do (marl_q.native)
    return int(BENCHES.get(name, key="bench").obj(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
