"""scenarios.native: what the native ports share (the per-port behaviour is tested in test_lbf_native.py and
test_rware_native.py)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from scenarios import lbf_native, rware_native
from scenarios.native import bench_main, check_engine, team_rewards


def test_team_rewards_are_each_copys_mean_summed_in_agent_order():
    r = np.array([[0.1, 0.2, 0.7], [1.0, 0.0, 0.0]])
    assert team_rewards(r, False) is r
    common = team_rewards(r, True)
    assert common.shape == (2, 3) and (common[0] == ((0.0 + 0.1) + 0.2 + 0.7) / 3).all() and (common[1] == 1 / 3).all()


def test_check_engine_names_the_choices():
    check_engine("native", ("native", "x"))
    with pytest.raises(ValueError, match="scenario.engine must be one of native, x, got 'y'"):
        check_engine("y", ("native", "x"))


@pytest.mark.parametrize("port, task", [(lbf_native, "Foraging-5x5-2p-1f-v3"), (rware_native, "rware-tiny-2ag-v2")])
def test_bench_reports_every_engine_and_its_command_prints_them(port, task, monkeypatch, capsys):
    rates = port.bench(task, steps=400, copies=4)
    package = "lbforaging" if port is lbf_native else "rware"
    assert {"native", "native batch of 4"} <= set(rates) <= {"native", "native batch of 4", package}
    assert all(v > 0 for v in rates.values())
    monkeypatch.setattr(sys, "argv", ["bench", "--task", task, "--steps", "200", "--copies", "2"])
    bench_main(port.bench, "pkg", task)
    out = capsys.readouterr().out
    assert "native batch of 2" in out and "env steps per CPU second" in out


def assert_engine_refused_without_package(scenario_file: str, package: str, tmp_path, monkeypatch, capsys) -> None:
    """``engine: <package>`` where the package cannot be found: exit 2 naming the package and the extra, and no
    run directory made."""
    import importlib.util

    from marl_q.cli import main
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find(name, *a))
    code = main(["run", scenario_file, "--set", f"scenario.engine={package}", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and f"{package} package" in err and "epymarl-envs" in err and not (tmp_path / "run").exists()
