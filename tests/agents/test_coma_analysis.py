"""analysis/coma.py: trailing means, t intervals and threshold times against hand computations."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.coma import find_run_dirs, first_reach, group_curves, main, mean_and_ci, trailing_mean
from marl_q.errors import RunDirError


def test_trailing_mean_equals_a_direct_loop() -> None:
    values = np.random.default_rng(0).normal(size=37)
    got = trailing_mean(values, 5)
    for i in range(37):
        assert got[i] == pytest.approx(values[max(0, i - 4): i + 1].mean())


def test_t_interval_by_hand() -> None:
    mean, half = mean_and_ci(np.array([[1.0], [2.0], [3.0]]))
    # sd 1, sem 1/sqrt(3), t(0.975, 2 dof) = 4.302653
    assert mean[0] == pytest.approx(2.0)
    assert half[0] == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
    assert mean_and_ci(np.array([[4.0]]))[1][0] == 0.0


def test_first_reach() -> None:
    x = np.array([10.0, 20.0, 30.0])
    assert first_reach(x, np.array([0.0, 5.0, 9.0]), 5.0) == 20.0
    assert first_reach(x, np.array([0.0, 1.0, 2.0]), 5.0) is None


def _fake_run(root: Path, algo: str, seed: int, slope: float) -> None:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"name": algo}, "run": {"seed": seed}}))
    (root / "summary.json").write_text(json.dumps({"scenario": "team_cue", "final_return": slope, "eval_return": slope}))
    lines = ["t,worker,env_steps,episode,return"] + [f"{i},w0,{10 * (i + 1)},{i + 1},{slope * i}" for i in range(50)]
    (root / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_grouping_and_plot_from_run_directories(tmp_path: Path, capsys) -> None:
    for seed in range(2):
        _fake_run(tmp_path / "sweep" / "algorithm.name=coma" / f"seed{seed}", "coma", seed, 1.0 + seed)
        _fake_run(tmp_path / "sweep" / "algorithm.name=iac" / f"seed{seed}", "iac", seed, 0.5)
    from analysis.coma import load_run

    runs = [load_run(d, "algorithm.name", "env_steps") for d in find_run_dirs([tmp_path / "sweep"])]
    curves = group_curves(runs, window=1, points=50)
    grid, mean, ci, n, low, high = curves["coma"]
    assert n == 2 and grid[0] == 10.0 and grid[-1] == 500.0
    assert mean[-1] == pytest.approx(1.5 * 49)  # mean of slopes 1 and 2 at episode 49
    # two seeds: the t-interval (t = 12.7) reaches far past both; the band drawn is the seeds' own range
    assert mean[-1] + ci[-1] > 2 * 49 and (low[-1], high[-1]) == pytest.approx((49.0, 2 * 49.0))
    assert curves["iac"][2].max() == pytest.approx(0.0)  # identical seeds: no band
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "c.png"), "--window", "1", "--threshold", "40",
                 "--reference", "scripted=-3.5"]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "coma: 2 seeds" in out and "iac: 2 seeds" in out and "never" in out


def test_a_malformed_reference_line_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--reference", "nearest=low"])
    assert exit_info.value.code == 2
    assert "--reference 'nearest=low': expected NAME=VALUE" in capsys.readouterr().err


def test_a_path_without_runs_is_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no run directory"):
        find_run_dirs([tmp_path])


def test_curves_grouped_by_another_key_are_named_key_equals_value_as_the_config_spells_it(tmp_path: Path) -> None:
    """A null, a boolean or a list under --by reads as it does in config.yaml, with the key's name: a legend
    entry 'None' (what str() gave) did not say it was the feed-forward run."""
    from analysis.coma import load_run

    for i, (recurrent, flag) in enumerate([(None, True), ("gru", False)]):
        root = tmp_path / f"r{i}"
        _fake_run(root, "mappo", 0, 1.0)
        config = yaml.safe_load((root / "config.yaml").read_text())
        config["actor"] = {"recurrent": recurrent, "hidden": [64, 64], "ortho_init": flag}
        (root / "config.yaml").write_text(yaml.safe_dump(config))
    groups = {key: [load_run(tmp_path / f"r{i}", key, "env_steps").group for i in range(2)]
              for key in ("actor.recurrent", "actor.ortho_init", "actor.hidden", "algorithm.name")}
    assert groups == {"actor.recurrent": ["recurrent=null", "recurrent=gru"],
                      "actor.ortho_init": ["ortho_init=true", "ortho_init=false"],
                      "actor.hidden": ["hidden=[64, 64]"] * 2, "algorithm.name": ["mappo", "mappo"]}
