"""`marlq bench startup`: how long the CLI takes to start, in fresh processes.

Four command lines, each run ``--repeats`` times in a new interpreter and timed from the parent
(wall seconds from start to exit, and the CPU seconds the process used, user + system: on a busy
machine the wall time grows with the load, the CPU time much less):
``marlq --help``, a config mistake (``marlq run CONFIG --set run.nope=1``, which
exits 2), ``marlq list``, and ``marlq run CONFIG`` up to its first env step. The last goes through
``python -m marl_q.bench.startup CONFIG --out DIR``, the first-step probe: it registers a copy of the
config's scenario whose environment's first ``step`` prints the top-level packages imported so far
(one JSON line) and ends the process; tests read that line to check what a run imports before it
steps. Timings are printed, never asserted.

``--against DIR`` times another checkout of marl-q too (a git worktree of an earlier commit, say), each
command line run in turn from this one and from DIR (``PYTHONPATH``), alternating which goes first, so
both see the same load; the table then gives both medians and their ratio. ``--only`` picks command
lines by their label (``--only list``: the ones whose label contains "list").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

# the shipped file, found beside the installed scenarios package (so the bench runs from any folder)
DEFAULT_CONFIG = str(Path(__file__).resolve().parents[2] / "scenarios" / "cartpole_a3c.yaml")
PROBE_SCENARIO = "startup_probe"  # the name the probe registers its copy of the config's scenario under


def startup_main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI start-up: medians over fresh processes of marlq --help, a config mistake, marlq list, and marlq
    run up to its first env step."""
    p = argparse.ArgumentParser(prog="marlq bench startup", description=startup_main.__doc__)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="scenario file to start (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="processes per command line (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--against", metavar="DIR", help="another checkout of marl-q, timed interleaved with this one")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="only the command lines whose label contains TEXT (repeatable)")
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    if args.repeats < 1:
        raise ConfigError(f"--repeats: must be at least 1, got {args.repeats}")
    if not Path(args.config).is_file():
        raise ConfigError(f"--config: {args.config}: no such config file")
    if args.against is not None and not (Path(args.against) / "marl_q" / "cli.py").is_file():
        raise ConfigError(f"--against: {args.against}: not a checkout of marl-q (no marl_q/cli.py)")
    config = str(Path(args.config).resolve())  # the processes run in a temporary folder
    here = str(Path(__file__).resolve().parents[2])
    sides = {"this": here} if args.against is None else {"this": here, "against": str(Path(args.against).resolve())}
    cli = [sys.executable, "-m", "marl_q.cli"]
    cases = [("python -c pass", [sys.executable, "-c", "pass"], 0),
             ("marlq --help", cli + ["--help"], 0),
             ("marlq run (config mistake)", cli + ["run", config, "--set", "run.nope=1"], 2),
             ("marlq list", cli + ["list"], 0),
             ("marlq run (to first env step)", None, 0)]
    if args.only:
        cases = [c for c in cases if any(text in c[0] for text in args.only)]
        if not cases:
            raise ConfigError(f"--only: no command line's label contains {' or '.join(map(repr, args.only))}")
    rows = []
    for label, cmd, code in cases:
        times: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(args.repeats):
            for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [sides[side], *filter(None, [os.environ.get("PYTHONPATH")])]))
                with tempfile.TemporaryDirectory(prefix="marlq-startup-") as tmp:
                    line = cmd or [sys.executable, "-m", "marl_q.bench.startup", config,
                                   "--out", str(Path(tmp) / "run")]
                    used = _children_cpu_s()
                    t0 = time.perf_counter()
                    done = subprocess.run(line, capture_output=True, text=True, env=env, cwd=tmp)
                    times[side].append(time.perf_counter() - t0)
                    cpu[side].append(_children_cpu_s() - used)
                if done.returncode != code:
                    print(f"marlq bench startup: {' '.join(line)} ({sides[side]}) exited {done.returncode} "
                          f"(expected {code}):\n{done.stderr.strip()}", file=sys.stderr)
                    return 1
        row = {"command": label, "median_s": statistics.median(times["this"]), "min_s": min(times["this"]),
               "max_s": max(times["this"]), "cpu_median_s": statistics.median(cpu["this"]), "repeats": args.repeats}
        if "against" in sides:
            row.update(against_median_s=statistics.median(times["against"]), against_min_s=min(times["against"]),
                       against_max_s=max(times["against"]), against_cpu_median_s=statistics.median(cpu["against"]),
                       ratio=statistics.median(times["this"]) / statistics.median(times["against"]))
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"CLI start-up, {args.repeats} fresh processes each (wall seconds, start to exit; CPU: user + system)")
    if "against" in sides:
        print(f"this: {sides['this']}; against: {sides['against']} (interleaved; ratio = this / against, medians)")
        print(f"{'command':<32} {'median':>8} {'min':>8} {'max':>8} {'CPU med':>8} | {'against':>8} {'min':>8} "
              f"{'max':>8} {'CPU med':>8} | {'ratio':>6}")
        for r in rows:
            print(f"{r['command']:<32} {r['median_s']:>8.3f} {r['min_s']:>8.3f} {r['max_s']:>8.3f} "
                  f"{r['cpu_median_s']:>8.3f} | {r['against_median_s']:>8.3f} {r['against_min_s']:>8.3f} "
                  f"{r['against_max_s']:>8.3f} {r['against_cpu_median_s']:>8.3f} | {r['ratio']:>6.2f}")
        return 0
    print(f"{'command':<32} {'median':>8} {'min':>8} {'max':>8} {'CPU med':>8}")
    for r in rows:
        print(f"{r['command']:<32} {r['median_s']:>8.3f} {r['min_s']:>8.3f} {r['max_s']:>8.3f} "
              f"{r['cpu_median_s']:>8.3f}")
    return 0


def _children_cpu_s() -> float:
    """User + system CPU seconds of the waited-for child processes so far."""
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


# ----------------------------------------------------------------------------- the first-step probe
def probe_main(argv: Sequence[str]) -> int:
    """``marlq run CONFIG [--set ...] --out DIR`` until its environment's first step, which prints
    {"packages": [top-level packages imported]} and ends the process (exit 0)."""
    p = argparse.ArgumentParser(prog="python -m marl_q.bench.startup")
    p.add_argument("config")
    p.add_argument("--out", required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    from marl_q.cli import main
    from marl_q.config import read_yaml
    from marl_q.registry import SCENARIOS

    name = (read_yaml(args.config).get("scenario") or {}).get("name")
    spec = SCENARIOS.get(str(name), key="scenario.name").obj

    def make(cfg: Any, seed: int) -> Any:
        env = spec.make(cfg, seed=seed)
        env.step = _report_and_exit
        return env

    SCENARIOS.add(PROBE_SCENARIO, spec._replace(make=make), config=spec.config, help=spec.help)
    overrides = [f"scenario.name={PROBE_SCENARIO}", "run.plots=false", *args.overrides]
    return main(["run", args.config, "--out", args.out, "--quiet", *[a for o in overrides for a in ("--set", o)]])


def _report_and_exit(*args: Any, **kwargs: Any) -> None:
    packages = sorted({name.split(".")[0] for name in list(sys.modules)})
    print(json.dumps({"packages": packages}), flush=True)
    os._exit(0)


BENCHES = {"startup": startup_main}  # marlq bench startup

if __name__ == "__main__":
    sys.exit(probe_main(sys.argv[1:]))
