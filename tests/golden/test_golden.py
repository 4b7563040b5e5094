"""Behaviour unchanged: every shipped scenario file, run briefly on sim, writes what it wrote when its
golden was recorded (tests/golden/goldens.py says how, and why there are two kinds of golden).

- On every machine the first half of each file's rows must match the recorded trace: integers and
  text exactly, floats within a tolerance.
- On a machine of a recorded numerics class the files must also be byte-identical to the recorded
  hashes. The pytest header names this machine's class and whether its bytes are recorded.
- On any machine, the same config and seed give byte-identical files twice (the sim contract): on a recorded
  class the recorded run is the other run; elsewhere the file runs twice.

A change of behaviour records again with ``python -m tests.golden.goldens --record --trace NAME``
in the same commit and says why; a change that only moves last bits records ``--record NAME``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.golden.goldens import (EXTRA_OF, NEEDS, check, compare_trace, load_hashes, numerics_class,
                                  recorded_hashes, run_golden, scenario_files, sha256, trace_of, trace_path)

# bytes of each golden run in this session, for the rerun test (keyed by scenario file)
_RUNS: dict[str, dict[str, bytes]] = {}

# one scenario file per family of code path, run a second time (the sim contract on one machine)
RERUN = ["cartpole_a2c_sync.yaml", "cartpole_a3c.yaml", "cartpole_qa2c_quantum_both.yaml", "cartpole_skolik.yaml",
         "cartpole_diffqas_a3c.yaml", "linear_mdp_regret.yaml", "penalty_cue_coma.yaml", "pendulum_ppo.yaml",
         "routing_amarl.yaml", "spread_mappo.yaml", "vehicular_a3c.yaml"]


def _needs_extra(name: str) -> None:
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        module = NEEDS[name]
        pytest.skip(f"{name} needs the optional extra [{EXTRA_OF[module]}] ({module} is not installed): "
                    f"pip install -e '.[{EXTRA_OF[module]}]'")


def _run(name: str, tmp_path: Path) -> dict[str, bytes]:
    if name not in _RUNS:
        _RUNS[name] = run_golden(name, tmp_path / "run")
    return _RUNS[name]


def test_every_scenario_file_has_a_trace_and_recorded_bytes():
    recorded = {n for cls in load_hashes().values() for n in cls["scenarios"]}
    traced = {n for n in scenario_files() if list(trace_path(n, "x").parent.glob("*.csv"))}
    assert traced == set(scenario_files()), f"no trace: {sorted(set(scenario_files()) - traced)}"
    assert recorded >= set(scenario_files()), f"no recorded bytes: {sorted(set(scenario_files()) - recorded)}"


def test_the_command_line_probes_the_class_before_it_runs_anything(monkeypatch):
    # a run's circuit executors set numpy's BLAS to one thread, which moves the probe's last bits: the class
    # of `python -m tests.golden.goldens NAME` is probed before its first run, as a test process probes it
    # at its start (tests/conftest.py)
    from tests.golden import goldens

    probed_first = numerics_class()
    seen = []

    def run(name, out):
        seen.append(goldens._CLASS)
        return out

    monkeypatch.setattr(goldens, "run_golden", run)
    monkeypatch.setattr(goldens, "check", lambda name, out: ([], "stubbed"))
    monkeypatch.setattr(goldens, "_CLASS", None)
    assert goldens.main(["spread_mappo.yaml", "cartpole_skolik.yaml"]) == 0
    assert seen == [probed_first, probed_first]


def test_the_numerics_class_is_stable_within_a_process(monkeypatch):
    # probed twice in the same state (this process's BLAS threads may differ from its start's: the class it
    # checks goldens by was probed then, and is put back after the test)
    from tests.golden import goldens

    monkeypatch.setattr(goldens, "_CLASS", None)
    a = numerics_class()
    goldens._CLASS = None
    assert numerics_class() == a
    assert len(a.name) == 12 and a.versions["torch"] != "absent"


@pytest.mark.parametrize("name", scenario_files())
def test_short_sim_run_matches_its_golden(name: str, tmp_path: Path):
    _needs_extra(name)
    problems, what = check(name, _run(name, tmp_path))
    assert not problems, f"{name} ({what}):\n" + "\n".join(problems)


@pytest.mark.parametrize("name", RERUN)
def test_sim_rerun_is_byte_identical(name: str, tmp_path: Path):
    """Two runs of one config and seed on this machine give the same bytes. Where this numerics class has
    the scenario's bytes recorded, the recorded run is the other run (another process, another day), so
    the scenario runs once; elsewhere it runs a second time here."""
    first = _run(name, tmp_path / "first")
    exact = recorded_hashes(name)
    if exact is not None:
        got = {file: sha256(data) for file, data in first.items()}
        assert got == exact, f"{name}: this run's files differ from the run recorded on this numerics class"
        return
    second = run_golden(name, tmp_path / "second")
    assert sorted(first) == sorted(second)
    for file in first:
        assert first[file] == second[file], f"{name}: {file} differs between two runs of the same config and seed"


def test_goldens_hold_on_another_mkl_branch():
    """The failure this design answers: the two goldens whose bits move with MKL's kernels, run on MKL's
    AVX2 branch (another numerics class on an AVX-512 machine; elsewhere what the machine has)."""
    import os
    import subprocess
    import sys

    from tests.golden.goldens import ROOT

    names = ["pendulum_ppo.yaml"]  # of the two the issue found (with penalty_cue_coma): one is the check
    env = {**os.environ, "MKL_CBWR": "AVX2", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tests.golden.goldens", *names], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert [line.split(":")[0] for line in out.stdout.splitlines() if ": ok (" in line] == names, out.stdout


def test_rerun_list_names_shipped_files():
    assert set(RERUN) <= set(scenario_files())


# ------------------------------------------------------------------ the trace comparison itself

HEADER = "t,worker,env_steps,episode,return\n"


def test_trace_accepts_last_bit_differences_and_a_longer_run():
    want = (HEADER + "0.5,w0,100,1,-843.2207108135729\n").encode()
    got = (HEADER + "0.5,w0,100,1,-843.220741286339\n0.7,w0,200,2,-10.0\n").encode()  # MKL AVX2 branch
    assert compare_trace("metrics.csv", got, want) == []


def test_trace_refuses_a_changed_value_a_changed_count_and_a_short_run():
    want = (HEADER + "0.5,w0,100,1,-843.2207\n0.6,w0,200,2,-800.0\n").encode()
    assert compare_trace("metrics.csv", (HEADER + "0.5,w0,100,1,-843.4\n0.6,w0,200,2,-800.0\n").encode(), want)
    assert compare_trace("metrics.csv", (HEADER + "0.5,w0,101,1,-843.2207\n0.6,w0,200,2,-800.0\n").encode(), want)
    assert compare_trace("metrics.csv", (HEADER + "0.5,w1,100,1,-843.2207\n0.6,w0,200,2,-800.0\n").encode(), want)
    assert compare_trace("metrics.csv", (HEADER + "0.5,w0,100,1,-843.2207\n").encode(), want)
    assert compare_trace("metrics.csv", b"t,worker\n0.5,w0\n", want)
    # an empty cell where a number was, and NaN against a number
    assert compare_trace("metrics.csv", (HEADER + "0.5,w0,100,1,\n0.6,w0,200,2,-800.0\n").encode(), want)
    assert compare_trace("metrics.csv", (HEADER + "0.5,w0,100,1,nan\n0.6,w0,200,2,-800.0\n").encode(), want)


def test_diagnostics_are_held_to_their_column_scale():
    head = "t,policy_loss\n"
    want = (head + "0.1,-0.0007973890169523656\n0.2,0.05\n").encode()
    got = (head + "0.1,-0.0007944994140416384\n0.2,0.05\n").encode()  # 0.4% apart, 6e-5 of the column's scale
    assert compare_trace("train.csv", got, want) == []
    assert compare_trace("metrics.csv", got, want)  # returns get no such allowance
    assert compare_trace("train.csv", (head + "0.1,-0.0009\n0.2,0.05\n").encode(), want)


def test_trace_keeps_the_first_half_of_the_rows():
    data = (HEADER + "".join(f"{i},w0,{i},{i},0.{i}\n" for i in range(10))).encode()
    kept = trace_of(data).decode().splitlines()
    assert kept[0] == HEADER.strip() and len(kept) == 1 + 5 and kept[-1].startswith("4,")
    assert trace_of((HEADER + "0,w0,0,0,0.0\n").encode()).decode().count("\n") == 2  # one row stays
