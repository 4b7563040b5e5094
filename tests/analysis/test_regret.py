"""analysis/regret.py: the statistics against hand-computed values, ledger reconstruction, and the plots."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.regret import (acceptance_figures, find_runs, load_run, loglog_slope, main, mean_band,
                             regret_exponent, regret_report, rounds_in, sqrt_reference)
from marl_q.cli import main as marlq

CONFIG = str(Path(__file__).resolve().parents[2] / "scenarios" / "linear_mdp_regret.yaml")


def test_regret_exponent_recovers_the_power_of_a_power_law():
    k = np.arange(1, 4001)
    assert regret_exponent(3.0 * k ** 0.5) == pytest.approx(0.5, abs=1e-9)
    assert regret_exponent(k ** 0.3 + 0.0) == pytest.approx(0.3, abs=1e-9)
    assert loglog_slope([2, 5, 10, 20], [4 * m ** 2 for m in (2, 5, 10, 20)]) == pytest.approx(2.0)


def test_mean_band_is_the_student_t_interval():
    mean, half = mean_band([np.array([1.0, 10.0]), np.array([3.0, 10.0])])
    np.testing.assert_allclose(mean, [2.0, 10.0])
    # two seeds: t_{0.975, 1} = 12.7062; std (ddof 1) of {1, 3} = sqrt(2); / sqrt(2) -> 12.7062
    assert half[0] == pytest.approx(12.7062047, rel=1e-6) and half[1] == 0.0
    assert mean_band([np.array([5.0])])[1][0] == 0.0


def test_rounds_in_a_window_and_the_sqrt_reference():
    rounds = np.array([1, 2, 2, 3, 5, 5], dtype=float)  # after episodes 1..6
    assert rounds_in(rounds, 1, 6) == 5 and rounds_in(rounds, 3, 5) == 3 and rounds_in(rounds, 6, 6) == 0
    k = np.arange(1, 101, dtype=float)
    np.testing.assert_allclose(sqrt_reference(k, 7 * np.sqrt(k)), 7 * np.sqrt(k))


def write_run(path: Path, algorithm: str, metrics: list[dict], comm: list[dict], workers: int = 2,
              seed: int = 0, alpha=None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": seed}, "backend": {"workers": workers,
                                                      "schedule": "uniform"}, "algorithm": {"name": algorithm}}))
    (path / "summary.json").write_text(json.dumps({"status": "completed", "alpha": alpha}))
    with open(path / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["t", "worker", "env_steps", "episode", "agent", "regret",
                                               "cum_regret", "comm_rounds", "bytes"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(metrics)
    if all(m.get("wall_clock_s") not in (None, "") for m in metrics):
        with open(path / "metrics_wall.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["episode", "wall_s"])
            writer.writerows([(m["episode"], m["wall_clock_s"]) for m in metrics])
    with open(path / "comm.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "t", "src", "dst", "kind", "bytes", "accepted"])
        writer.writeheader()
        writer.writerows(comm)
    return path


def test_rounds_and_bytes_are_rebuilt_from_the_ledger_when_the_columns_are_empty(tmp_path):
    metrics = [{"t": repr(0.0001 * (k + 1)), "worker": "w0", "env_steps": k, "episode": k + 1, "agent": 0,
                "regret": r, "cum_regret": "", "comm_rounds": "", "bytes": "", "wall_clock_s": ""}
               for k, r in enumerate([0.5, 0.25, 0.0, 1.0])]
    comm = [{"id": 0, "t": "0.000100", "src": "w0", "dst": "server", "kind": "upload", "bytes": 100, "accepted": 1},
            {"id": 1, "t": "0.000100", "src": "server", "dst": "w0", "kind": "statistics", "bytes": 40, "accepted": 1},
            {"id": 2, "t": "0.000300", "src": "w0", "dst": "server", "kind": "upload", "bytes": 7, "accepted": 1}]
    run = load_run(write_run(tmp_path / "r", "async_coop_lsvi", metrics, comm))
    np.testing.assert_array_equal(run.comm_rounds, [1, 1, 2, 2])
    np.testing.assert_array_equal(run.comm_bytes, [140, 140, 147, 147])
    np.testing.assert_allclose(run.cum_regret, [0.5, 0.75, 0.75, 1.75])


def test_columns_filled_by_the_runtime_are_used_as_they_are(tmp_path):
    metrics = [{"t": 1, "worker": "w0", "env_steps": 1, "episode": 1, "agent": 0, "regret": 0.5,
                "cum_regret": 0.5, "comm_rounds": 3, "bytes": 99, "wall_clock_s": 2.0}]
    run = load_run(write_run(tmp_path / "r", "lsvi_ucb_pooled", metrics, []))
    assert run.comm_rounds[0] == 3 and run.comm_bytes[0] == 99 and run.wall_clock_s[0] == 2.0


def test_non_lsvi_and_broken_directories_are_refused_or_skipped(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        load_run(tmp_path)
    write_run(tmp_path / "other", "a3c", [], [])
    assert find_runs(tmp_path) == []
    assert main([str(tmp_path)]) == 2


def test_tiny_sweep_through_the_runtime_draws_all_four_plots(tmp_path):
    small = ["scenario.horizon=3", "scenario.d=2", "scenario.n_states=4", "scenario.n_actions=2",
             "run.total_episodes=30"]
    cells = [("async_coop_lsvi", 2, None, 2), ("lsvi_ucb_pooled", 2, None, 2), ("coop_lsvi", 2, None, 1),
             ("lsvi_ucb_independent", 2, None, 1), ("async_coop_lsvi", 3, None, 1), ("async_coop_lsvi", 2, 1.0, 1)]
    for name, workers, alpha, seeds in cells:
        for seed in range(seeds):
            out = tmp_path / f"{name}-{workers}-{alpha}-{seed}"
            args = ["run", CONFIG, "--quiet", "--out", str(out), "--seed", str(seed),
                    "--set", f"algorithm.name={name}", "--set", f"backend.workers={workers}"]
            if alpha is not None:
                args += ["--set", f"algorithm.alpha={alpha}"]
            for item in small:
                args += ["--set", item]
            assert marlq(args) == 0
    paths, figures = regret_report(tmp_path, tmp_path / "plots", workers=2)
    assert sorted(p.name for p in paths) == ["communication_vs_K.png", "regret_vs_K.png", "regret_vs_alpha.png",
                                            "rounds_vs_M.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert figures["lsvi_ucb_pooled"]["comm_rounds"] == 30
    assert figures["lsvi_ucb_independent"]["comm_rounds"] == 0
    assert set(figures["rounds_by_M"]) == {2, 3}
    assert set(figures["by_alpha"]) == {0.25, 1.0}
    runs = find_runs(tmp_path)
    for run in runs:  # rebuilt rounds end at the server's own count
        summary = json.loads((run.path / "summary.json").read_text())
        assert run.comm_rounds[-1] == summary["comm_rounds"]
        assert run.comm_bytes[-1] == summary["bytes_up"] + summary["bytes_down"]
        assert math.isclose(run.cum_regret[-1], summary["regret"], rel_tol=1e-9)
    assert acceptance_figures(runs, workers=2)["async_over_pooled"] > 0
