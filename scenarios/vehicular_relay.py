"""Scenario ``vehicular_relay``: controllable mmWave vehicles on a highway learn to form relays to RSUs.

A PettingZoo Parallel environment over ``vehicular_road.Highway`` whose agent set changes: an agent
is a controlled vehicle, it leaves (terminated) when its vehicle drives off the road, and a vehicle
entering the road becomes a new agent (a fresh name) while fewer than ``n_agents`` are on it.
Registered as ``marlq/vehicular_relay-v0``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import gymnasium
import numpy as np
import pettingzoo
from pettingzoo import ParallelEnv

from scenarios.spec import ScenarioSpec
from scenarios.vehicular_road import ACTION_NAMES, CHANNELS, Highway, RelayState, VehicularRelayConfig

__all__ = ["VehicularRelayConfig", "VehicularRelayEnv", "make", "SCENARIOS"]


# Extra observation features (observation: grid_features), each in [0, 1]: where the ego vehicle is
# relative to its nearest RSU ((offset / half the RSU spacing + 1) / 2, so 0.5 = beside it), whether it
# is downstream of it, how far past the end of that RSU's relay on its side it is (0 = inside the
# relay, 1 = half an RSU spacing or more beyond), and the free cells ahead and behind in its lane
# and in the lanes beside it (/ view_cells, capped at 1; 0 where there is no such lane).
FEATURE_NAMES = ("rsu_offset", "downstream", "beyond_relay_end", "gap_ahead", "gap_behind",
                 "gap_ahead_left", "gap_behind_left", "gap_ahead_right", "gap_behind_right")
N_FEATURES = len(FEATURE_NAMES)


def agent_name(agent_id: int) -> str:
    """The PettingZoo name of the agent with integer id ``agent_id``."""
    return f"vehicle_{agent_id}"


class VehicularRelayEnv(ParallelEnv):
    """Highway relay environment: observation = ego-centred occupancy grid + own lane, speed, link state.

    Observation (float32 in [0, 1]): channels (vehicle, mmWave vehicle, RSU, RSU-connected node) x
    lanes x (2 * view_cells + 1) cells centred on the ego vehicle, then a one-hot of the own lane,
    speed / vmax and whether the ego vehicle is RSU-connected. Actions: keep, accelerate,
    decelerate, lane left, lane right; keep (and an agent missing from the action dict) drives as the
    traffic model does, so "no control" is the policy that always keeps. Reward: marginal coverage (coverage lost if this vehicle's
    radio were off, scaled so one vehicle covering a fresh 2R stretch earns 1; or, with
    ``reward="difference"``, coverage with minus without the whole vehicle; or the shared road coverage),
    optionally a shared team term, a bonus for being RSU-connected, minus a penalty for an unsafe or
    impossible move and, optionally, for driving slowly on a free road. ``observation="grid_features"``
    appends FEATURE_NAMES.
    """

    metadata = {"name": "vehicular_relay_v0", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(self, cfg: Optional[VehicularRelayConfig] = None, render_mode: Optional[str] = None,
                 **overrides: Any) -> None:
        cfg = dataclasses.replace(cfg or VehicularRelayConfig(), **overrides)
        cfg.validate()
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: {render_mode!r} is not supported (choices: None, 'rgb_array')")
        self.cfg = cfg
        self.render_mode = render_mode
        self.possible_agents = [agent_name(i) for i in range(cfg.n_agents + cfg.lanes * cfg.max_steps)]
        self.agents: list[str] = []
        width = 2 * cfg.view_cells + 1
        self.grid_shape = (len(CHANNELS), cfg.lanes, width)
        self.n_features = N_FEATURES if cfg.observation == "grid_features" else 0
        self.obs_dim = int(np.prod(self.grid_shape)) + cfg.lanes + 2 + self.n_features
        self._obs_space = gymnasium.spaces.Box(0.0, 1.0, shape=(self.obs_dim,), dtype=np.float32)
        self._act_space = gymnasium.spaces.Discrete(len(ACTION_NAMES))
        self._rng = np.random.default_rng()
        self.road: Optional[Highway] = None
        self.relay: Optional[RelayState] = None
        self.metrics: dict[str, float] = {}

    @property
    def single_observation_space(self) -> gymnasium.spaces.Box:
        """The observation space every agent shares (one shared policy reads it)."""
        return self._obs_space

    @property
    def single_action_space(self) -> gymnasium.spaces.Discrete:
        """The action space every agent shares."""
        return self._act_space

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        """The same Box object for every agent."""
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete:
        """The same Discrete(5) object for every agent."""
        return self._act_space

    # -- episode ------------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None
              ) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        """Populate the road, run warm-up traffic and hand ``n_agents`` random vehicles to agents."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.road = Highway(self.cfg, self._rng)
        self.road.populate(self.cfg.n_agents)
        self.relay = self.road.relay_state()
        ids = self._agent_ids_on_road()
        self.agents = [agent_name(i) for i in ids]
        self._update_metrics()
        obs = self._observe(ids)
        return {agent_name(i): obs[k] for k, i in enumerate(ids)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        """Apply the agents' moves, advance traffic one second, and report who left and who joined."""
        road = self.road
        if road is None:
            raise RuntimeError("step() before reset()")
        moves = {}
        for name, act in actions.items():
            if name not in self.agents:
                raise ValueError(f"actions: {name!r} is not a live agent")
            moves[int(name.split("_")[1])] = int(act)
        before = set(self.agents)
        left, unsafe = road.step(moves)
        self.relay = road.relay_state()
        ids = self._agent_ids_on_road()
        self._update_metrics()
        obs_arr = self._observe(ids)
        rewards_arr = self._rewards(ids, set(unsafe.tolist()))
        truncate = road.t >= self.cfg.max_steps
        obs, rew, term, trunc, info = {}, {}, {}, {}, {}
        for k, i in enumerate(ids):
            name = agent_name(i)
            if truncate and name not in before:
                continue  # entered in the episode's last second: never live, so never reported
            obs[name], rew[name] = obs_arr[k], float(rewards_arr[k])
            term[name], trunc[name], info[name] = False, truncate, {}
        for i in left.tolist():
            name = agent_name(i)
            if name in before:
                obs[name] = np.zeros(self.obs_dim, dtype=np.float32)
                rew[name], term[name], trunc[name], info[name] = 0.0, True, False, {}
        self.agents = [] if truncate else [agent_name(i) for i in ids]
        return obs, rew, term, trunc, info

    def render(self) -> Optional[np.ndarray]:
        """A top-down RGB picture of the road, RSUs, mmWave vehicles and the LOS links of RSU-connected nodes."""
        if self.render_mode != "rgb_array" or self.road is None:
            return None
        from scenarios.vehicular_picture import draw_highway
        return draw_highway(self.road, self.relay)

    def close(self) -> None:
        """Nothing to release."""

    # -- internals ----------------------------------------------------------------------------
    def _agent_ids_on_road(self) -> np.ndarray:
        ids = self.road.agent_id[self.road.agent_id >= 0]
        return np.sort(ids)

    def _vehicle_of(self, ids: np.ndarray) -> np.ndarray:
        road = self.road
        index_of = np.full(road.next_agent_id + 1, -1, dtype=np.int64)
        driven = np.nonzero(road.agent_id >= 0)[0]
        index_of[road.agent_id[driven]] = driven
        return index_of[ids]

    def _update_metrics(self) -> None:
        road, relay = self.road, self.relay
        agent_nodes = relay.connected[~relay.is_rsu] & (road.agent_id[relay.node_vehicle[~relay.is_rsu]] >= 0)
        self.metrics = {
            "coverage": relay.coverage,
            "relay_length_m": relay.relay_length_m,
            "relay_length_max_m": relay.relay_length_max_m,
            "connected_agents": int(agent_nodes.sum()),
            "agents": int((road.agent_id >= 0).sum()),
            "vehicles": int(len(road.lane)),
        }

    def _connected_vehicles(self) -> np.ndarray:
        relay = self.relay
        flag = np.zeros(len(self.road.lane), dtype=bool)
        veh = relay.node_vehicle[~relay.is_rsu]
        flag[veh] = relay.connected[~relay.is_rsu]
        return flag

    def _observe(self, ids: np.ndarray) -> np.ndarray:
        cfg, road = self.cfg, self.road
        view = cfg.view_cells
        vehicles = self._vehicle_of(ids)
        grid = np.zeros((len(CHANNELS), cfg.lanes, road.n_cells + 2 * view), dtype=np.float32)
        grid[0, road.lane, road.cell + view] = 1.0
        grid[1, road.lane[road.mmwave], road.cell[road.mmwave] + view] = 1.0
        rsu_cells = np.minimum((road.rsu_x / cfg.cell_m).astype(np.int64), road.n_cells - 1) + view
        grid[2, :, rsu_cells] = 1.0
        connected = self._connected_vehicles()
        grid[3, road.lane[connected], road.cell[connected] + view] = 1.0
        grid[3, :, rsu_cells] = 1.0
        cols = road.cell[vehicles][:, None] + np.arange(2 * view + 1)[None, :]
        windows = grid[:, :, cols]                       # (C, lanes, A, W)
        windows = np.transpose(windows, (2, 0, 1, 3)).reshape(len(ids), -1)
        lane_onehot = np.eye(cfg.lanes, dtype=np.float32)[road.lane[vehicles]]
        speed = (road.speed[vehicles] / cfg.vmax).astype(np.float32)[:, None]
        linked = connected[vehicles].astype(np.float32)[:, None]
        parts = [windows, lane_onehot, speed, linked]
        if self.n_features:
            parts.append(self._features(vehicles, connected))
        return np.concatenate(parts, axis=1)

    def _features(self, vehicles: np.ndarray, connected: np.ndarray) -> np.ndarray:
        """The ``grid_features`` extras (see FEATURE_NAMES) for the given vehicles, float32 (A, N_FEATURES)."""
        cfg, road = self.cfg, self.road
        half = cfg.rsu_spacing_m / 2.0
        x = road.cell_centres[road.cell[vehicles]]
        nearest = np.argmin(np.abs(x[:, None] - road.rsu_x[None, :]), axis=1)
        offset = x - road.rsu_x[nearest]
        downstream = offset > 0
        # the relay end on each vehicle's side of its RSU: the farthest connected vehicle on that side
        cx = road.cell_centres[road.cell[connected]]
        near_c = np.argmin(np.abs(cx[:, None] - road.rsu_x[None, :]), axis=1) if len(cx) else np.zeros(0, int)
        off_c = cx - road.rsu_x[near_c]
        end = np.zeros(len(vehicles))
        for k in range(len(vehicles)):
            side = (near_c == nearest[k]) & ((off_c > 0) == downstream[k])
            end[k] = np.abs(off_c[side]).max() if side.any() else 0.0
        beyond = np.clip((np.abs(offset) - end) / half, 0.0, 1.0)
        view = cfg.view_cells
        feats = [np.clip(offset / half, -1.0, 1.0) * 0.5 + 0.5, downstream.astype(float), beyond]
        for step in (0, 1, -1):
            lane_to = road.lane[vehicles] + step
            exists = (lane_to >= 0) & (lane_to < cfg.lanes)
            occ, ahead, behind, _ = road._neighbours_in(np.clip(lane_to, 0, cfg.lanes - 1), road.cell[vehicles])
            if step == 0:  # own lane: the vehicle itself occupies the cell; look past it
                ahead = road.gap_ahead()[vehicles]
                behind = self._gap_behind()[vehicles]
            usable = exists & ((step == 0) | ~occ)
            feats.append(np.where(usable, np.minimum(ahead / view, 1.0), 0.0))
            feats.append(np.where(usable, np.minimum(behind / view, 1.0), 0.0))
        return np.stack(feats, axis=1).astype(np.float32)

    def _gap_behind(self) -> np.ndarray:
        """Empty cells to the vehicle behind in the same lane (effectively unlimited for the last one)."""
        road = self.road
        gap = np.full(len(road.lane), road.n_cells + self.cfg.vmax, dtype=np.int64)
        if len(road.lane) > 1:
            same = road.lane[1:] == road.lane[:-1]
            gap[1:][same] = (road.cell[1:] - road.cell[:-1] - 1)[same]
        return gap

    def _rewards(self, ids: np.ndarray, unsafe: set[int]) -> np.ndarray:
        cfg = self.cfg
        vehicles = self._vehicle_of(ids)
        connected = self._connected_vehicles()[vehicles].astype(np.float64)
        scale = cfg.road_length_m / (2 * cfg.radio_range_m)
        if cfg.reward == "marginal_coverage":
            gain = self.road.marginal_coverage(self.relay, vehicles) * scale
        elif cfg.reward == "difference":
            gain = self.road.difference_coverage(self.relay, vehicles) * scale
        else:
            gain = np.full(len(ids), self.relay.coverage)
        if cfg.reward_team:
            gain = gain + cfg.reward_team * self.relay.coverage * scale
        penalty = np.array([i in unsafe for i in ids.tolist()], dtype=np.float64)
        reward = cfg.reward_coverage * gain + cfg.reward_connected * connected - cfg.penalty_unsafe * penalty
        if cfg.penalty_slow:
            free = self.road.gap_ahead()[vehicles] >= cfg.vmax
            reward = reward - cfg.penalty_slow * free * (1.0 - self.road.speed[vehicles] / cfg.vmax)
        return reward


def make(cfg: VehicularRelayConfig, seed: int = 0) -> VehicularRelayEnv:
    """Factory the runtime calls: an environment built from the scenario config (reset it with ``seed``)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(VehicularRelayConfig)}
    env = VehicularRelayEnv(VehicularRelayConfig(**fields))
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "vehicular_relay": ScenarioSpec(
        config=VehicularRelayConfig, make=make, kind="parallel",
        help="highway mmWave relays to RSUs with LOS blockage; controllable vehicles enter and leave"),
}

pettingzoo.register("parallel", "marlq/vehicular_relay-v0", entry_point=VehicularRelayEnv)
