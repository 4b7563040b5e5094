"""Shared fixtures: one torch thread (2-core CI), registries loaded, small configs."""
from __future__ import annotations

import copy
import os
import zlib
from typing import Any

import pytest
import torch

torch.set_num_threads(1)


def _numerics_line() -> str:
    """The machine's numerics class, which decides whether the goldens check bytes or traces only."""
    from tests.golden.goldens import load_hashes, numerics_class

    cls = numerics_class()
    kind = "traces and bytes" if cls.name in load_hashes() else "traces only (no bytes recorded for this class)"
    return f"golden numerics class: {cls.describe()}: goldens check {kind}"


# ----------------------------------------------------------------------------- processes (pytest-xdist)
# The suite runs in one process per core (addopts: -n auto --dist loadgroup). Each test file is one
# group, so a file's module fixtures are built once and its tests run in their written order; the
# files that start Ray instances are one group, so two Ray clusters never start side by side; the golden
# runs are a group per scenario file (see _group).
MAX_PROCESSES = 4
RAY_FILES = ("test_ray_backend.py", "test_ray_cluster.py")  # the files that start Ray clusters


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One test process per core this process may use, at most MAX_PROCESSES (tests are single-threaded;
    more processes than cores only add contention)."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                      MAX_PROCESSES))


def _group(item: pytest.Item) -> str:
    """The xdist group of a test: its file, but for the Ray files (one group) and the golden runs, a group per
    scenario file: they are a quarter of the suite's time, and one group would leave them all to one process
    at the end (a scenario's golden check and its rerun stay together: the rerun reuses the first run's bytes)."""
    if item.path.name in RAY_FILES:
        return "ray"
    callspec = getattr(item, "callspec", None)
    if item.path.name == "test_golden.py" and callspec is not None and "name" in callspec.params:
        return f"golden:{callspec.params['name']}"
    return item.nodeid.split("::")[0]  # the file, as pytest names it


# The groups that take longest (measured: CPU seconds per test file, docs/performance.md), handed out first:
# xdist gives groups to processes in collection order (addopts: --no-loadscope-reorder, or it would order
# them by their number of tests), so a long group collected last (the Ray files were) runs alone at the
# end while the other process idles (longest-first is the classic fix for that tail).
FIRST = ("ray", "test_golden.py", "test_resume.py", "test_peers.py", "test_runtime.py", "test_sim_scale.py",
         "test_old_checkpoints.py", "test_run_interrupts.py", "test_local_faults.py", "test_tracking.py",
         "test_newcomer.py", "test_kernels.py")


def _rank(item: pytest.Item) -> int:
    group = _group(item)
    name = "ray" if group == "ray" else item.path.name
    return FIRST.index(name) if name in FIRST else len(FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks to name each test's group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    if hasattr(config, "workerinput"):  # in an xdist process, which collects; a plain run keeps the files' order
        items.sort(key=_rank)  # stable: each group's tests keep their written order


def pytest_configure(config: pytest.Config) -> None:
    """Each test process probes its numerics class before any test runs: every run sets numpy's BLAS to one
    thread for the rest of the process (``marl_q.native.single_thread_blas``), which moves the probe's last
    bits, so a class probed after a golden run named another class and that process's goldens checked
    traces only. ``goldens --record`` probes first too."""
    from tests.golden.goldens import numerics_class

    numerics_class()


def pytest_report_header(config: pytest.Config) -> str:
    return _numerics_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Said at the end too, where ``-q`` (the project's default) still prints it."""
    if any(str(getattr(r, "nodeid", "")).startswith("tests/golden") for r in terminalreporter.stats.get("passed", [])
           + terminalreporter.stats.get("failed", [])):
        terminalreporter.write_line(_numerics_line())

CARTPOLE_SMALL: dict[str, Any] = {
    "run": {"seed": 0, "total_env_steps": 1200, "progress": False, "plots": False, "checkpoint_every": 5},
    "backend": {"name": "sim", "workers": 2},
    "scenario": {"name": "cartpole", "num_envs": 4},
    "algorithm": {"name": "a3c", "n_steps": 5},
    "actor": {"head": "mlp", "hidden": [16, 16], "out_gain": 0.01},
    "critic": {"head": "mlp", "hidden": [16, 16]},
    "server": {"aggregation": "hogwild"},
}


@pytest.fixture
def param_seed(request: pytest.FixtureRequest) -> int:
    """A seed drawn from the test's parameters that is the same in every process: Python's ``hash`` of a
    string is salted per process (PYTHONHASHSEED), so a grid seeded from it ran on different draws each
    time, and a check that holds for most draws (a nonzero gradient) failed now and then."""
    callspec = getattr(request.node, "callspec", None)
    return zlib.crc32((callspec.id if callspec else request.node.name).encode()) % 2**31


@pytest.fixture
def small_raw() -> dict[str, Any]:
    """A tiny CartPole A3C config as a raw mapping (fresh copy per test)."""
    return copy.deepcopy(CARTPOLE_SMALL)


@pytest.fixture
def cli_run(tmp_path, capsys):
    """``cli_run(raw)``: ``marlq run`` on ``raw`` written as a YAML file, in this process; returns the exit
    code, what it printed on stderr and the run directory it was given (which a refused config leaves absent)."""
    import yaml

    from marl_q.cli import main

    def run(raw: dict[str, Any]) -> tuple[int, str, Any]:
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        out = tmp_path / "run"
        code = main(["run", str(cfg), "--out", str(out), "--quiet"])
        return code, capsys.readouterr().err, out

    return run


@pytest.fixture
def exact_resume(tmp_path):
    """``exact_resume(make_raw, stop_after)``: a run stopped after ``stop_after`` updates and resumed writes
    the bytes of the uninterrupted run (metrics, comm and train csv). ``make_raw()`` gives a fresh config."""
    from marl_q.config import build_config
    from marl_q.experiment import resume_experiment, run_experiment

    def check(make_raw, stop_after: int) -> None:
        full = run_experiment(build_config(make_raw()), tmp_path / "full")
        raw = make_raw()
        raw["run"]["stop_after_updates"] = stop_after
        part = run_experiment(build_config(raw), tmp_path / "part")
        assert part["status"] == "stopped" and part["env_steps"] < full["env_steps"]
        resumed = resume_experiment(tmp_path / "part")
        assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is True
        for fname in ("metrics.csv", "comm.csv", "train.csv"):
            assert (tmp_path / "part" / fname).read_bytes() == (tmp_path / "full" / fname).read_bytes(), fname

    return check
