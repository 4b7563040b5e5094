"""analysis/vehicular.py: the 95% band and the acceptance ratios by hand; a trained run evaluated; the CLI and bench."""
from __future__ import annotations

import numpy as np
import pytest

from agents.vehicular import BASELINES
from analysis.vehicular import (EdgeHold, acceptance_figures, evaluate_run, mean_ci95, paired_ratios, placement_bound,
                                plot_against_p, plot_ratios)
from marl_q.cli import main as cli
from marl_q.config import build_config
from marl_q.experiment import run_experiment
from tests.agents.test_vehicular import _raw


def test_mean_ci95_by_hand():
    # values 1..5: mean 3, sample sd sqrt(2.5), t_{0.975, 4} = 2.7764
    mean, half = mean_ci95([1, 2, 3, 4, 5])
    assert mean == 3.0
    assert half == pytest.approx(2.7764451 * np.sqrt(2.5) / np.sqrt(5), rel=1e-6)
    assert mean_ci95([0.4]) == (0.4, 0.0)


def _rows():
    rows = []
    for seed, (learned, none) in enumerate([(0.6, 0.5), (0.8, 0.5)]):
        for p, scale in ((0.2, 1.0), (0.5, 1.5)):
            rows.append({"policy": "learned", "penetration": p, "coverage": learned * scale,
                         "relay_length_m": 100.0 * scale, "run_seed": seed})
            rows.append({"policy": "no_control", "penetration": p, "coverage": none * scale,
                         "relay_length_m": 80.0, "run_seed": seed})
    return rows


def test_acceptance_ratio_is_ratio_of_seed_means():
    fig = acceptance_figures(_rows())
    assert fig["seeds"] == 2
    assert fig["ratio_at_train_p"] == pytest.approx(0.7 / 0.5)
    assert fig["target_1.3x_met"] and fig["never_below_no_control"]
    assert fig["per_p"]["0.5"]["coverage_learned"][0] == pytest.approx(1.05)


def test_plot_against_p_writes_a_png(tmp_path):
    path = plot_against_p(_rows(), "coverage", "coverage", "test", tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paired_ratios_divide_by_the_same_seeds_no_control():
    ratios = paired_ratios(_rows(), "learned")
    assert ratios[0.2] == pytest.approx([0.6 / 0.5, 0.8 / 0.5])
    fig = acceptance_figures(_rows())
    mean, half = fig["per_p"]["0.2"]["coverage_ratio_learned_per_seed"]
    assert mean == pytest.approx(1.4) and half > 0


def test_plot_ratios_writes_a_png(tmp_path):
    path = plot_ratios(_rows(), tmp_path / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_placement_bound_restores_the_road_and_never_loses_to_removing_the_agents():
    from scenarios.vehicular_relay import VehicularRelayEnv

    env = VehicularRelayEnv(road_length_m=400.0, rsu_spacing_m=400.0, radio_range_m=60.0, n_agents=3,
                            max_steps=20, warmup_steps=5, penetration=0.2)
    env.reset(seed=2)
    road = env.road
    before = {n: getattr(road, n).copy() for n in ("lane", "cell", "speed", "mmwave", "agent_id")}
    as_is, bound = placement_bound(road, step_cells=1)
    for name, value in before.items():
        assert np.array_equal(getattr(road, name), value)
    assert as_is == pytest.approx(road.relay_state().coverage)
    # the bound places each agent where it helps most; with one RSU and 3 agents on a 400 m road it
    # beats the traffic's own arrangement and the road without the agents
    keep = road.agent_id < 0
    road._reorder(keep)
    without = road.relay_state().coverage
    for name, value in before.items():
        setattr(road, name, value)
    assert bound >= max(as_is, without) and bound > without


def test_edge_hold_slows_only_connected_agents_at_the_outer_edge_of_a_relay():
    from scenarios.vehicular_relay import VehicularRelayEnv
    from scenarios.vehicular_road import DECELERATE

    env = VehicularRelayEnv(road_length_m=600.0, rsu_spacing_m=300.0, n_agents=5, max_steps=40, warmup_steps=10)
    obs, _ = env.reset(seed=0)
    policy = EdgeHold(env, min_speed=0, inward_cells=1)
    slowed = 0
    while env.agents:
        acts = policy({a: obs[a] for a in env.agents})
        road, connected = env.road, env._connected_vehicles()
        for name, act in acts.items():
            assert act == DECELERATE
            k = int(np.nonzero(road.agent_id == int(name.split("_")[1]))[0][0])
            rsu = road.rsu_x[np.argmin(np.abs(road.rsu_x - road.cell_centres[road.cell[k]]))] / road.cfg.cell_m
            out = 1 if road.cell[k] > rsu else -1
            farther = [j for j in np.nonzero(connected)[0] if 0 < (road.cell[j] - road.cell[k]) * out <= 20]
            assert connected[k] and road.speed[k] > 0 and not farther
            slowed += 1
        obs, *_ = env.step(acts)
    assert slowed > 0


def test_tiny_run_then_evaluation_of_learned_policy_and_baselines(tmp_path, capsys):
    out = tmp_path / "run"
    summary = run_experiment(build_config(_raw(steps=40)), out=out, plots=False)
    assert summary["status"] == "completed" and 0.0 <= summary["final_coverage"] <= 1.0
    rows, frame = evaluate_run(out, [0.1, 0.5], episodes=1)
    assert {r["policy"] for r in rows} == {"learned", *BASELINES}
    assert {r["penetration"] for r in rows} == {0.1, 0.5}
    assert all(0.0 <= r["coverage"] <= 1.0 for r in rows)
    assert frame.ndim == 3 and frame.dtype == np.uint8
    # the same through the CLI command the sweep runs per seed; a run directory that is not one exits 2
    csv_path = tmp_path / "eval" / "seed_0.csv"
    assert cli(["vehicular_eval", str(out), "--p", "0.1", "--episodes", "1", "--act", "argmax",
                "--out", str(csv_path)]) == 0
    assert csv_path.is_file() and csv_path.with_suffix(".frame.npy").is_file()
    assert cli(["vehicular_eval", str(tmp_path / "nowhere"), "--out", str(csv_path)]) == 2
    assert "nowhere: not a run directory" in capsys.readouterr().err


def test_vehicular_commands_and_bench_are_discovered(capsys):
    for command in ("vehicular", "vehicular_eval"):
        with pytest.raises(SystemExit) as exit_:
            cli([command, "--help"])
        assert exit_.value.code == 0
        assert "--p P [P ...]" in capsys.readouterr().out


def test_bench_reports_both_reward_settings(capsys):
    assert cli(["bench", "vehicular_env", "--steps", "3", "--agents", "4"]) == 0
    out = capsys.readouterr().out
    assert "marginal_coverage/grid" in out and "difference/grid_features" in out
    rates = [float(line.split()[1]) for line in out.splitlines() if "env steps/s" in line]
    assert len(rates) == 6 and all(r > 0 for r in rates)
