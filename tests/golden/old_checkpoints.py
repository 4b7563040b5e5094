"""Checkpoints written by an earlier version of marl-q, kept so that a change to the code cannot
silently stop old runs from resuming.

Each fixture in ``tests/golden/checkpoints/<scenario>/`` is a run directory of one shipped scenario
file at its golden budget (``goldens.overrides``), stopped after a quarter of its server updates
(``run.stop_after_updates``), with the checkpoint it wrote then. ``meta.json`` names the commit and
the numerics class that wrote it. The test (``test_old_checkpoints.py``) resumes a copy with today's
code. Stopping and resuming on sim changes nothing, so the resumed run must write what the golden
run writes: its trace on every machine, and its bytes on the numerics class that wrote the fixture
(the checkpoint holds that machine's floats; another class continues them with its own last bits),
while the golden's bytes are still those the fixture was written under (``golden_sha256``): a
commit that moves the last bits (and records the golden again) leaves the fixture's first part in
the old bits, so from then on only its trace is checked.

Write the fixtures with the code of the commit they should stand for (default: this checkout):

    python -m tests.golden.old_checkpoints [--code DIR] [NAMES...]

``--code`` is a checkout (a ``git worktree``) of that commit; the runs import marl-q from it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.golden.goldens import HERE, ROOT, SCENARIO_DIR, numerics_class, overrides, recorded_hashes

FIXTURES = HERE / "checkpoints"
# one scenario file per family of code path (the rerun test's list, less nothing)
NAMES = ["cartpole_a2c_sync.yaml", "cartpole_a3c.yaml", "cartpole_qa2c_quantum_both.yaml", "cartpole_skolik.yaml",
         "cartpole_diffqas_a3c.yaml", "linear_mdp_regret.yaml", "penalty_cue_coma.yaml", "pendulum_ppo.yaml",
         "routing_amarl.yaml", "spread_mappo.yaml", "vehicular_a3c.yaml", "cartpole_dqn.yaml"]
# what a run directory holds that a resume does not need
SKIP = (".lock", "plots")


def fixture_dir(name: str) -> Path:
    return FIXTURES / name.removesuffix(".yaml")


def _run(code: Path, name: str, out: Path, extra: list[str]) -> None:
    sets = [a for item in overrides(name) + extra for a in ("--set", item)]
    cmd = [sys.executable, "-m", "marl_q.cli", "run", str(SCENARIO_DIR / name), "--out", str(out), "--quiet", *sets]
    done = subprocess.run(cmd, cwd=code, env=_env(code), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def _env(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code)}


def _check_imports_from(code: Path) -> None:
    where = subprocess.run([sys.executable, "-c", "import marl_q; print(marl_q.__file__)"], cwd=code, env=_env(code),
                           capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(code):
        raise SystemExit(f"the runs would import marl_q from {where}, not from {code}")


def _updates(run_dir: Path) -> int:
    """The server version of the run's last checkpoint (``ckpt_<version>.npz``)."""
    versions = [int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("ckpt_*.npz")]
    if not versions:
        raise SystemExit(f"{run_dir}: wrote no checkpoint")
    return max(versions)


def write(code: Path, names: list[str]) -> None:
    _check_imports_from(code)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=code, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            whole = Path(tmp) / f"{name}.whole"
            _run(code, name, whole, [])
            stop = max(1, _updates(whole) // 4)
            part = Path(tmp) / f"{name}.part"
            _run(code, name, part, [f"run.stop_after_updates={stop}"])
            dest = fixture_dir(name)
            shutil.rmtree(dest, ignore_errors=True)
            (dest / "checkpoints").mkdir(parents=True)
            for f in part.iterdir():
                if f.is_file() and f.name not in SKIP:
                    shutil.copy2(f, dest / f.name)
            for f in (part / "checkpoints").iterdir():
                shutil.copy2(f, dest / "checkpoints" / f.name)
            meta = {"scenario": name, "commit": commit, "numerics_class": numerics_class().name,
                    "stopped_after_updates": stop, "updates_of_the_whole_run": _updates(whole),
                    "golden_sha256": recorded_hashes(name)}
            (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            print(f"{name}: stopped at update {stop} of {meta['updates_of_the_whole_run']}, {size / 1e6:.2f} MB",
                  flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.golden.old_checkpoints", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help=f"scenario files (default: {len(NAMES)} families)")
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose code writes the fixtures")
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(NAMES))
    if unknown:
        print(f"unknown fixture names: {unknown}; known: {NAMES}", file=sys.stderr)
        return 2
    write(args.code.resolve(), args.names or NAMES)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
