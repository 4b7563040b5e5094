"""The vehicular relay PettingZoo environment: API and seed conformance, agents entering and leaving, rendering, bad input."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios.vehicular_relay import FEATURE_NAMES, VehicularRelayEnv
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


def test_feature_observation_matches_the_road():
    env = VehicularRelayEnv(observation="grid_features", **SMALL)
    obs, _ = env.reset(seed=4)
    for _ in range(8):
        obs, *_ = env.step({})
    cfg, road, relay = env.cfg, env.road, env.relay
    assert env.obs_dim == VehicularRelayEnv(**SMALL).obs_dim + len(FEATURE_NAMES)
    connected = {int(v) for v, c in zip(relay.node_vehicle, relay.connected) if v >= 0 and c}
    for name, o in obs.items():
        k = int(np.nonzero(road.agent_id == int(name.split("_")[1]))[0][0])
        f = dict(zip(FEATURE_NAMES, o[-len(FEATURE_NAMES):]))
        x = road.cell_centres[road.cell[k]]
        rsu = road.rsu_x[np.argmin(np.abs(road.rsu_x - x))]
        assert f["rsu_offset"] == pytest.approx(np.clip((x - rsu) / (cfg.rsu_spacing_m / 2), -1, 1) / 2 + 0.5)
        assert f["downstream"] == float(x > rsu)
        # the relay end on this side of this RSU, by a plain loop over the connected vehicles
        end = 0.0
        for j in connected:
            xj = road.cell_centres[road.cell[j]]
            if road.rsu_x[np.argmin(np.abs(road.rsu_x - xj))] == rsu and (xj > rsu) == (x > rsu):
                end = max(end, abs(xj - rsu))
        assert f["beyond_relay_end"] == pytest.approx(np.clip((abs(x - rsu) - end) / (cfg.rsu_spacing_m / 2), 0, 1))
        # own-lane gaps by a plain scan of the lane
        same = [road.cell[j] for j in range(len(road.lane)) if road.lane[j] == road.lane[k] and j != k]
        ahead = min([c - road.cell[k] - 1 for c in same if c > road.cell[k]], default=10 ** 6)
        behind = min([road.cell[k] - c - 1 for c in same if c < road.cell[k]], default=10 ** 6)
        assert f["gap_ahead"] == pytest.approx(min(ahead / cfg.view_cells, 1.0))
        assert f["gap_behind"] == pytest.approx(min(behind / cfg.view_cells, 1.0))
        if road.lane[k] == 0:
            assert f["gap_ahead_right"] == 0.0 and f["gap_behind_right"] == 0.0  # no lane to the right
    assert all(0.0 <= v <= 1.0 for o in obs.values() for v in o)


def _rewards_after(seed: int, steps: int, **cfg) -> tuple[VehicularRelayEnv, dict[str, float]]:
    env = VehicularRelayEnv(**SMALL, **cfg)
    env.reset(seed=seed)
    rew = {}
    for _ in range(steps):
        _, rew, *_ = env.step({})
    return env, rew


def test_reward_choices_are_their_formulas():
    scale = SMALL["road_length_m"] / (2 * 100.0)
    base, base_rew = _rewards_after(3, 12)
    for kind, team, slow in (("difference", 0.0, 0.0), ("marginal_coverage", 0.5, 0.0), ("difference", 0.2, 0.3)):
        env, rew = _rewards_after(3, 12, reward=kind, reward_team=team, penalty_slow=slow)
        road, relay = env.road, env.relay
        assert np.array_equal(road.cell, base.road.cell)  # rewards never change the traffic
        ids = np.sort(road.agent_id[road.agent_id >= 0])
        vehicles = env._vehicle_of(ids)
        per_agent = (road.difference_coverage(relay, vehicles) if kind == "difference"
                     else road.marginal_coverage(relay, vehicles))
        for k, i in enumerate(ids.tolist()):
            v = vehicles[k]
            want = per_agent[k] * scale + team * relay.coverage * scale + 0.1 * env._connected_vehicles()[v]
            if road.gap_ahead()[v] >= env.cfg.vmax:
                want -= slow * (1 - road.speed[v] / env.cfg.vmax)
            assert rew[f"vehicle_{i}"] == pytest.approx(want)
    # the default is the old marginal-coverage reward
    env, rew = _rewards_after(3, 12, reward="marginal_coverage")
    assert rew == base_rew


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
                                      "scenario.road_length_m=50", "scenario.reward=coverage",
                                      "scenario.penalty_slow=-1", "scenario.observation=image"])
def test_cli_exits_2_naming_the_key_and_writes_nothing(tmp_path, capsys, override):
    from marl_q.cli import main

    out = tmp_path / "run"
    code = main(["run", str(REPO / "scenarios/vehicular_a3c.yaml"), "--set", override, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    section, key = override.split("=")[0].split(".")
    # e.g. "scenario.penetration: 1.5 is outside [0, 1]"; a value outside a Literal's choices is caught
    # by the config loader first ("scenario.reward: unknown value ...")
    assert f"{section}: {key}:" in err or f"{section}.{key}:" in err
    assert not out.exists()
