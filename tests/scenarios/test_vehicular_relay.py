"""The vehicular relay PettingZoo environment: API and seed conformance, agents entering and leaving, rendering, bad input."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios.vehicular_relay import VehicularRelayEnv
from scenarios.vehicular_road import CHANNELS

SMALL = dict(road_length_m=600.0, rsu_spacing_m=300.0, n_agents=5, max_steps=60, warmup_steps=10)
REPO = Path(__file__).resolve().parents[2]


def test_parallel_api_with_a_changing_agent_set():
    with warnings.catch_warnings():
        # possible_agents holds names that may never enter; PettingZoo warns about those at the end
        warnings.filterwarnings("ignore", message="No agents present but not all possible_agents")
        parallel_api_test(VehicularRelayEnv(**SMALL), num_cycles=80)


def test_parallel_seed_test():
    parallel_seed_test(lambda: VehicularRelayEnv(**SMALL))


def test_registered_with_pettingzoo():
    import scenarios  # noqa: F401 - importing the package registers every scenario

    env = pettingzoo.make("parallel", "marlq/vehicular_relay-v0", **SMALL)
    obs, _ = env.reset(seed=1)
    assert len(obs) == SMALL["n_agents"]


def test_agents_leave_the_road_then_never_observe_again_and_new_ones_enter():
    env = VehicularRelayEnv(road_length_m=300.0, rsu_spacing_m=150.0, n_agents=4, max_steps=120, warmup_steps=5)
    obs, _ = env.reset(seed=5)
    gone: set[str] = set()
    entered = set(obs)
    left_seen = 0
    while env.agents:
        obs, rew, term, trunc, info = env.step({a: 1 for a in env.agents})  # everyone accelerates
        assert not (set(obs) & gone), "an agent that left was given an observation"
        assert not (set(env.agents) & gone)
        for name, done in term.items():
            if done:
                gone.add(name)
                left_seen += 1
                assert not obs[name].any()  # the final observation of a vehicle off the road is empty
        entered |= set(obs)
        assert len(env.agents) <= 4
    assert left_seen > 0 and len(entered) > 4  # on a 300 m road at top speed, vehicles leave and others join


def test_observation_matches_the_road():
    env = VehicularRelayEnv(**SMALL)
    obs, _ = env.reset(seed=2)
    cfg, road = env.cfg, env.road
    width = 2 * cfg.view_cells + 1
    for name, o in obs.items():
        vid = int(name.split("_")[1])
        k = int(np.nonzero(road.agent_id == vid)[0][0])
        grid = o[:len(CHANNELS) * cfg.lanes * width].reshape(len(CHANNELS), cfg.lanes, width)
        assert grid[0, road.lane[k], cfg.view_cells] == 1.0  # the ego vehicle sits in the centre
        lane_part = o[len(CHANNELS) * cfg.lanes * width:]
        assert int(np.argmax(lane_part[:cfg.lanes])) == road.lane[k]
        assert lane_part[cfg.lanes] == pytest.approx(road.speed[k] / cfg.vmax)
        # every vehicle within the window appears in the vehicle channel at its relative cell
        for j in range(len(road.lane)):
            offset = road.cell[j] - road.cell[k]
            if abs(offset) <= cfg.view_cells:
                assert grid[0, road.lane[j], cfg.view_cells + offset] == 1.0


def test_rgb_render_draws_the_road():
    env = VehicularRelayEnv(render_mode="rgb_array", **SMALL)
    env.reset(seed=0)
    img = env.render()
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert img.shape[1] == int(np.ceil(600.0 * 0.4)) + 1
    colours = {tuple(c) for c in img.reshape(-1, 3)}
    assert (0, 0, 0) in colours  # RSUs
    assert (220, 20, 20) in colours or (255, 165, 0) in colours  # controlled vehicles


@pytest.mark.parametrize("override", ["scenario.penetration=1.5", "scenario.n_agents=400",
                                      "scenario.road_length_m=50"])
def test_cli_exits_2_naming_the_key_and_writes_nothing(tmp_path, capsys, override):
    from marl_q.cli import main

    out = tmp_path / "run"
    code = main(["run", str(REPO / "scenarios/vehicular_a3c.yaml"), "--set", override, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    section, key = override.split("=")[0].split(".")
    assert f"{section}: {key}:" in err  # e.g. "scenario: penetration: 1.5 is outside [0, 1]"
    assert not out.exists()
