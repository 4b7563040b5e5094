"""analysis/vehicular.py: the 95% band and the acceptance ratios against hand computations."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.vehicular import (EdgeHold, acceptance_figures, mean_ci95, paired_ratios, placement_bound, plot_against_p,
                                plot_ratios)


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
