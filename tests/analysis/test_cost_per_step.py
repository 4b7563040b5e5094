"""analysis/peers/cost_per_step.py's command line: bad values exit 2 with one line naming them, before any run."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "analysis" / "peers" / "cost_per_step.py"


@pytest.fixture(scope="module")
def cost_per_step():
    spec = importlib.util.spec_from_file_location("cost_per_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("short", ["3000", "5000", "-1"])
def test_a_short_budget_outside_the_run_is_refused(cost_per_step, short, capsys, monkeypatch):
    monkeypatch.chdir(SCRIPT.parents[2])  # the default --trees after=. is this checkout
    monkeypatch.setattr(cost_per_step.subprocess, "run", lambda *a, **k: pytest.fail("a run was started"))
    assert cost_per_step.main(["scenarios/spread_mappo.yaml", "--steps", "3000", "--short", short]) == 2
    assert f"--short {short} must lie in (0, --steps 3000)" in capsys.readouterr().err


def test_trees_that_are_not_checkouts_are_refused(cost_per_step, capsys, tmp_path):
    assert cost_per_step.main(["scenarios/spread_mappo.yaml", "--trees", f"x={tmp_path}"]) == 2
    assert "not a marl-q checkout" in capsys.readouterr().err
