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
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    if args.repeats < 1:
        raise ConfigError(f"--repeats: must be at least 1, got {args.repeats}")
    if not Path(args.config).is_file():
        raise ConfigError(f"--config: {args.config}: no such config file")
    cli = [sys.executable, "-m", "marl_q.cli"]
    cases = [("python -c pass", [sys.executable, "-c", "pass"], 0),
             ("marlq --help", cli + ["--help"], 0),
             ("marlq run (config mistake)", cli + ["run", args.config, "--set", "run.nope=1"], 2),
             ("marlq list", cli + ["list"], 0),
             ("marlq run (to first env step)", None, 0)]
    rows = []
    for label, cmd, code in cases:
        times, cpu = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="marlq-startup-") as tmp:
                line = cmd or [sys.executable, "-m", "marl_q.bench.startup", args.config,
                               "--out", str(Path(tmp) / "run")]
                used = _children_cpu_s()
                t0 = time.perf_counter()
                done = subprocess.run(line, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                cpu.append(_children_cpu_s() - used)
            if done.returncode != code:
                print(f"marlq bench startup: {' '.join(line)} exited {done.returncode} (expected {code}):\n"
                      f"{done.stderr.strip()}", file=sys.stderr)
                return 1
        rows.append({"command": label, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "cpu_median_s": statistics.median(cpu), "repeats": len(times)})
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"CLI start-up, {args.repeats} fresh processes each (wall seconds, start to exit; CPU: user + system)")
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
