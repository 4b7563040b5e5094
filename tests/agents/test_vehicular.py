"""Vehicular relay policies: keep == no control, the greedy heuristic by hand, the A3C worker's batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.vehicular import GreedyGapFilling, LanePreference, ObservationLayout, VehicularA3CWorker, no_control
from marl_q.config import build_config
from marl_q.services import PARAMS
from marl_q.messages import Message, SERVER
from scenarios.vehicular_relay import VehicularRelayEnv
from scenarios.vehicular_road import CHANNELS, DECELERATE, KEEP, LANE_LEFT, LANE_RIGHT

torch.set_num_threads(1)
SMALL = dict(road_length_m=300.0, rsu_spacing_m=150.0, n_agents=4, max_steps=12, warmup_steps=5, view_cells=8)


def _raw(steps: int = 30, workers: int = 2) -> dict:
    return {
        "run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
        "backend": {"name": "sim", "workers": workers},
        "server": {"aggregation": "hogwild"},
        "scenario": {"name": "vehicular_relay", **SMALL},
        "algorithm": {"name": "a3c_vehicular", "n_steps": 5},
        "actor": {"head": "mlp", "hidden": [16]},
        "critic": {"head": "mlp", "hidden": [16]},
    }


def test_always_keep_is_exactly_no_control():
    a, b = VehicularRelayEnv(**SMALL), VehicularRelayEnv(**SMALL)
    obs_a, _ = a.reset(seed=3)
    obs_b, _ = b.reset(seed=3)
    while a.agents:
        obs_a, rew_a, *_ = a.step({n: KEEP for n in a.agents})
        obs_b, rew_b, *_ = b.step(no_control(obs_b))
        assert a.metrics == b.metrics and rew_a == rew_b
        assert np.array_equal(a.road.cell, b.road.cell) and np.array_equal(a.road.lane, b.road.lane)
    assert not b.agents


def _observation(layout: ObservationLayout, lane: int, speed: float, connected: bool,
                 linked: list[tuple[int, int]], vehicles: list[tuple[int, int]] = ()) -> np.ndarray:
    """An observation by hand: (lane, offset) cells of connected nodes and of other vehicles."""
    grid = np.zeros((len(CHANNELS), layout.lanes, layout.width), dtype=np.float32)
    v = layout.view_cells
    grid[0, lane, v] = 1.0
    if connected:
        grid[3, lane, v] = 1.0
    for l, off in linked:
        grid[0, l, v + off] = grid[1, l, v + off] = grid[3, l, v + off] = 1.0
    for l, off in vehicles:
        grid[0, l, v + off] = 1.0
    return np.concatenate([grid.ravel(), np.eye(layout.lanes)[lane], [speed, float(connected)]]).astype(np.float32)


def test_greedy_heuristic_on_hand_made_observations():
    layout = ObservationLayout(lanes=3, view_cells=20)
    greedy = GreedyGapFilling(layout)
    # connected, the relay is all behind it (12 cells back), nothing ahead: a frontier -> slow down
    assert greedy.act_one(_observation(layout, 0, 1.0, True, [(0, -12)])) == DECELERATE
    # the same but already slow: keep rolling with the traffic
    assert greedy.act_one(_observation(layout, 0, 0.2, True, [(0, -12)])) == KEEP
    # connected with relay nodes on both sides: inside the relay -> keep
    assert greedy.act_one(_observation(layout, 1, 1.0, True, [(0, -10), (2, 9)])) == KEEP
    # cut off, a connected node 6 cells ahead in lane 2, lane 1 beside us free -> move left (towards it)
    assert greedy.act_one(_observation(layout, 0, 1.0, False, [(2, 6)])) == LANE_LEFT
    # ... but the cell beside is taken -> keep
    assert greedy.act_one(_observation(layout, 0, 1.0, False, [(2, 6)], vehicles=[(1, 0)])) == KEEP
    # nothing connected in view -> keep
    assert greedy.act_one(_observation(layout, 0, 1.0, False, [])) == KEEP


def test_lane_preference_moves_towards_its_lane_when_the_cell_beside_is_free():
    layout = ObservationLayout(lanes=3, view_cells=20)
    middle = LanePreference(layout, 1)
    assert middle.act_one(_observation(layout, 0, 1.0, False, [])) == LANE_LEFT
    assert middle.act_one(_observation(layout, 2, 1.0, False, [])) == LANE_RIGHT
    assert middle.act_one(_observation(layout, 1, 1.0, False, [])) == KEEP
    assert middle.act_one(_observation(layout, 0, 1.0, False, [], vehicles=[(1, 0)])) == KEEP  # cell beside taken
    insist = LanePreference(layout, 1, insist=True)
    assert insist.act_one(_observation(layout, 0, 1.0, False, [], vehicles=[(1, 0)])) == LANE_LEFT


def test_observation_layout_reads_what_the_environment_wrote():
    env = VehicularRelayEnv(**SMALL)
    obs, _ = env.reset(seed=1)
    layout = ObservationLayout.of(env.cfg)
    relay = env.relay
    linked = {int(v) for v, c in zip(relay.node_vehicle, relay.connected) if v >= 0 and c}
    for name, o in obs.items():
        k = int(np.nonzero(env.road.agent_id == int(name.split("_")[1]))[0][0])
        grid, lane, speed, connected = layout.split(o)
        assert lane == env.road.lane[k] and speed == pytest.approx(env.road.speed[k] / env.cfg.vmax)
        assert connected == (k in linked)
        assert grid.shape == (len(CHANNELS), env.cfg.lanes, 2 * env.cfg.view_cells + 1)


def test_a3c_worker_batch_masks_agents_before_entering_and_after_leaving():
    cfg = build_config(_raw())
    worker = VehicularA3CWorker(cfg, 0)
    worker.ac.n_steps = 12  # one rollout spans a whole (12 s) episode and the start of the next
    batch, episodes, steps = worker.rollout()
    valid, dones, obs = batch["valid"], batch["dones"], batch["obs"]
    assert steps == 12 and len(episodes) == 1
    assert episodes[0]["length"] == 12 and 0.0 <= episodes[0]["coverage"] <= 1.0
    view, lanes = SMALL["view_cells"], 3
    width = 2 * view + 1
    for i in range(valid.shape[1]):
        rows = np.nonzero(valid[:, i])[0]
        assert len(rows) and np.array_equal(rows, np.arange(rows[0], rows[-1] + 1))  # one contiguous stay
        assert not dones[rows[:-1], i].any()  # only the last step of a stay may end it
        assert not batch["rewards"][~valid[:, i], i].any()
        for t in rows:  # a valid step observes a vehicle in the centre of its own grid
            grid = obs[t, i, :len(CHANNELS) * lanes * width].reshape(len(CHANNELS), lanes, width)
            assert grid[0, :, view].any()
    # the episode ended inside the rollout: every column that was live then is done at that step
    end = 11
    assert (dones[end, valid[end]]).all()


@pytest.mark.parametrize("exit_terminal", [True, False])
def test_a3c_worker_exit_is_terminal_or_bootstrapped_from_the_last_observation(exit_terminal):
    raw = _raw()
    raw["scenario"]["exit_terminal"] = exit_terminal
    worker = VehicularA3CWorker(build_config(raw), 0)
    worker.ac.n_steps = 11  # inside the first 12 s episode: every done is a vehicle driving off
    batch, _, _ = worker.rollout()
    exits = np.argwhere(batch["dones"])
    assert len(exits) > 0  # on a 300 m road some vehicles leave within 11 s
    for t, i in exits:
        assert batch["terminated"][t, i] == exit_terminal
        # terminal: the env's empty final observation; bootstrapped: the vehicle's last one on the road
        if exit_terminal:
            assert not batch["obs"][t + 1, i].any()
        else:
            assert np.array_equal(batch["obs"][t + 1, i], batch["obs"][t, i]) and batch["obs"][t, i].any()


def test_a3c_worker_pushes_a_finite_gradient_of_the_parameter_size():
    cfg = build_config(_raw())
    worker = VehicularA3CWorker(cfg, 1)
    worker.deliver(Message(SERVER, worker.name, PARAMS, {PARAMS: worker.flat.numpy()}, base_version=0))
    work = worker.step()
    grad = work.messages[0].payload["grad"]
    assert grad.shape == (worker.flat.size,) and np.isfinite(grad).all() and np.abs(grad).sum() > 0
    assert work.env_steps == 5
