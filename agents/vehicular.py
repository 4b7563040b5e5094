"""Policies for the vehicular relay scenario: the baselines (no control, random, greedy gap-filling) and A3C.

A policy maps the live agents' observations to actions; an agent left out of the returned dict, or
given KEEP, follows the traffic model (that is how "no control" is expressed). The greedy heuristic reads only
the agent's own observation, the same information the learned policy gets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import numpy as np

from agents.actor_critic import ActorCritic, ActorCriticConfig, ActorCriticWorker
from agents.rollout import EpisodeBook, Step, rollout
from marl_q.errors import ConfigError
from marl_q.registry import ALGORITHMS
from marl_q.seeding import vehicular_episode_seed
from scenarios.vehicular_road import (CHANNELS, DECELERATE, KEEP, LANE_LEFT, LANE_RIGHT,
                                      VehicularRelayConfig)

CONNECTED = CHANNELS.index("connected")
VEHICLE = CHANNELS.index("vehicle")


class RelayPolicy(Protocol):
    """Observations of the live agents -> their actions (agents left out follow the traffic model)."""

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]: ...


@dataclass(frozen=True)
class ObservationLayout:
    """Where the parts of a vehicular observation sit, so policies can read it."""

    lanes: int
    view_cells: int

    @classmethod
    def of(cls, cfg: VehicularRelayConfig) -> "ObservationLayout":
        """The layout the environment built from ``cfg`` produces."""
        return cls(cfg.lanes, cfg.view_cells)

    @property
    def width(self) -> int:
        return 2 * self.view_cells + 1

    def split(self, obs: np.ndarray) -> tuple[np.ndarray, int, float, bool]:
        """One observation -> (grid (channels, lanes, width), own lane, speed / vmax, RSU-connected)."""
        n_grid = len(CHANNELS) * self.lanes * self.width
        grid = obs[:n_grid].reshape(len(CHANNELS), self.lanes, self.width)
        lane = int(np.argmax(obs[n_grid:n_grid + self.lanes]))
        return grid, lane, float(obs[n_grid + self.lanes]), bool(obs[n_grid + self.lanes + 1] > 0.5)


def no_control(obs: dict[str, np.ndarray]) -> dict[str, int]:
    """Every controlled vehicle drives like the rest of the traffic."""
    return {}


class RandomMoves:
    """Each agent picks one of the five moves uniformly at random every second."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]:
        names = sorted(obs)
        return dict(zip(names, self.rng.integers(0, 5, size=len(names)).tolist()))


class GreedyGapFilling:
    """Slow down at the edge of the relay so the next vehicle can extend it; seek line of sight when cut off.

    Per agent, from its own observation: if RSU-connected, nothing connected lies beyond it on one
    side (it is a frontier of the relay) and the nearest connected node on the other side is at
    least ``spacing`` of the view away, decelerate (to at most ``min_speed`` of vmax, so it does
    not stop traffic). If not connected but a connected node is in view (in range, line of sight
    blocked), change lane towards that node's lane when the cell beside is free. Otherwise keep
    driving with the traffic.
    """

    def __init__(self, layout: ObservationLayout, spacing: float = 0.25, min_speed: float = 0.4) -> None:
        self.layout = layout
        self.spacing = spacing
        self.min_speed = min_speed

    def act_one(self, obs: np.ndarray) -> int:
        """The heuristic's move for one observation."""
        grid, lane, speed, connected = self.layout.split(obs)
        v = self.layout.view_cells
        cols = np.nonzero(grid[CONNECTED].any(axis=0))[0]
        ahead, behind = cols[cols > v] - v, v - cols[cols < v]
        far = self.spacing * v
        if connected:
            frontier_ahead = len(ahead) == 0 and len(behind) > 0 and behind.min() >= far
            frontier_behind = len(behind) == 0 and len(ahead) > 0 and ahead.min() >= far
            if (frontier_ahead or frontier_behind) and speed > self.min_speed:
                return DECELERATE
            return KEEP
        if len(cols):
            nearest = cols[np.argmin(np.abs(cols - v))]
            target_lanes = np.nonzero(grid[CONNECTED][:, nearest])[0]
            goal = int(target_lanes[np.argmin(np.abs(target_lanes - lane))])
            if goal != lane:
                step = 1 if goal > lane else -1
                if grid[VEHICLE, lane + step, v] == 0:
                    return LANE_LEFT if step == 1 else LANE_RIGHT
        return KEEP

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]:
        return {name: self.act_one(o) for name, o in obs.items()}


class LanePreference:
    """Drive in one lane (a reachability probe): change towards ``lane`` when the cell beside is free,
    otherwise keep; with ``insist`` ask for the change anyway (the road refuses it, the vehicle holds
    its speed that second instead of following the traffic model)."""

    def __init__(self, layout: ObservationLayout, lane: int, insist: bool = False) -> None:
        self.layout = layout
        self.lane = lane
        self.insist = insist

    def act_one(self, obs: np.ndarray) -> int:
        grid, lane, _, _ = self.layout.split(obs)
        if lane == self.lane:
            return KEEP
        step = 1 if self.lane > lane else -1
        if grid[VEHICLE, lane + step, self.layout.view_cells] != 0 and not self.insist:
            return KEEP
        return LANE_LEFT if step == 1 else LANE_RIGHT

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]:
        return {name: self.act_one(o) for name, o in obs.items()}


BASELINES: dict[str, Callable[[VehicularRelayConfig, int], RelayPolicy]] = {
    "no_control": lambda cfg, seed: no_control,
    "random": lambda cfg, seed: RandomMoves(seed),
    "greedy": lambda cfg, seed: GreedyGapFilling(ObservationLayout.of(cfg)),
}


# ---------------------------------------------------------------------------------------------
# A3C over the shared policy: every controlled vehicle of a worker's highway acts with the same
# actor; the worker (one parallel environment instance) pushes one gradient per n_steps seconds.
# ---------------------------------------------------------------------------------------------

class Highway:
    """One vehicular relay environment as a one-copy vector for ``agents.rollout``: its set of agents
    changes from second to second (``observe`` gives the live agents' names and stacked observations,
    ``step`` takes their moves as a dict, an agent left out following the traffic model). Every second
    is a valid step whose team reward is the mean of the agents' rewards; an episode that ends (no
    agent left) restarts in the same step, with the reset seed ``episode_seed(seed, index)`` (a
    training worker's ``vehicular_episode_seed``, an evaluation's ``vehicular_eval_episode_seed``).
    ``finished``: the time-averaged coverage and relay length of the episode that ended last."""

    num_envs = 1

    def __init__(self, env: Any, seed: int, episode_seed: Callable[[int, int], int] = vehicular_episode_seed) -> None:
        self.env, self.seed, self.episode, self.episode_seed = env, seed, 0, episode_seed
        self.names: list[str] = []
        self.finished: Optional[dict[str, float]] = None
        self._start_episode()

    def _start_episode(self) -> None:
        self.obs, _ = self.env.reset(seed=self.episode_seed(self.seed, self.episode))
        self.coverage: list[float] = []
        self.relay: list[float] = []

    def observe(self) -> tuple[list[str], Optional[np.ndarray]]:
        self.names = list(self.env.agents)
        names = self.names
        return names, (np.stack([self.obs[a] for a in names]).astype(np.float32) if names else None)

    def moves(self, acts: np.ndarray) -> dict[str, int]:
        """The observed agents' moves as the env takes them (``to_env`` of a policy over ``observe``'s rows)."""
        return dict(zip(self.names, acts.tolist()))

    def step(self, moves: dict[str, int]) -> Step:
        """``data``: (the episode's index, rewards, terminations, truncations, next observations, the
        env's metrics after the step)."""
        names = self.names
        next_obs, rew, term, trunc, _ = self.env.step(moves)
        data = (self.episode, rew, term, trunc, next_obs, dict(self.env.metrics))
        reward = float(np.mean([rew[a] for a in names])) if names else 0.0
        self.coverage.append(self.env.metrics["coverage"])
        self.relay.append(self.env.metrics["relay_length_m"])
        self.obs = next_obs
        ended = not self.env.agents
        if ended:
            self.finished = {"coverage": float(np.mean(self.coverage)), "relay_length_m": float(np.mean(self.relay))}
            self.episode += 1
            self._start_episode()
        return Step(np.ones(1, dtype=bool), np.array([reward]), np.array([ended]), data)


class VehicularA3CWorker(ActorCriticWorker):
    """An A3C worker whose environment is one highway with a changing set of agents.

    Each agent that acts during a rollout gets a column of the (T, N) batch; steps before it entered
    or after it left are masked out (``valid``), so the actor-critic core's ``learn`` (n-step
    returns, policy and value losses, entropy) applies unchanged. Leaving the road is a terminal
    state (or, with the scenario's ``exit_terminal: false``, a cut bootstrapped from the vehicle's last
    observation on the road); the episode's time limit truncates (bootstrapped from the final observation).
    """

    def check_scenario(self, spec: Any) -> None:
        if spec.kind != "parallel" or not hasattr(spec.config, "n_agents"):
            raise ConfigError(f"algorithm {self.cfg.algorithm.name}: needs scenario vehicular_relay, "
                              f"got {self.cfg.scenario.name!r}")

    def reset_env(self) -> None:
        self.vec = Highway(self.env, self.seed)
        self.book = EpisodeBook(1)

    def adopt_rollout_state(self, state: dict) -> None:
        self.vec = Highway.__new__(Highway)
        self.vec.env, self.vec.seed, self.vec.episode, self.vec.obs = self.env, self.seed, state["episode"], state["obs"]
        self.vec.coverage, self.vec.relay, self.vec.names, self.vec.finished = \
            state["ep_coverage"], state["ep_relay"], [], None
        self.vec.episode_seed = vehicular_episode_seed
        self.book = EpisodeBook.resumed(np.array([state["ep_return"]], dtype=np.float64),
                                        np.array([state["ep_length"]], dtype=np.int64))
        for key in ("obs", "episode", "ep_return", "ep_length", "ep_coverage", "ep_relay"):
            self.__dict__.pop(key, None)

    def rollout(self) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
        """n_steps seconds of the highway (agents.rollout); one batch column per (episode, agent) that acted."""
        T = self.ac.n_steps
        records = []  # (t, key, obs, action, reward, terminated, done, next_obs)
        exit_terminal = self.env.cfg.exit_terminal

        def act(seen: tuple[list[str], Optional[np.ndarray]]) -> np.ndarray:
            names, obs = seen
            return self._act(obs) if names else np.zeros(0, dtype=np.int64)

        def store(t: int, seen: tuple[list[str], Optional[np.ndarray]], acts: np.ndarray, step: Step) -> None:
            names, obs = seen
            episode, rew, term, trunc, next_obs, _ = step.data
            for k, a in enumerate(names):
                # a vehicle that drove off: terminal, or (exit_terminal false) cut off and bootstrapped
                # from its last observation on the road
                left = bool(term[a]) and not exit_terminal
                records.append((t, (episode, a), obs[k], int(acts[k]), float(rew[a]), bool(term[a]) and not left,
                                bool(term[a] or trunc[a]), obs[k] if left else np.asarray(next_obs[a], dtype=np.float32)))

        episodes, steps = rollout(self.vec, self.book, T, act, store,
                                  row=lambda i: {"version": self.version, **self.vec.finished}, to_env=self.vec.moves)
        keys = sorted({r[1] for r in records})
        column = {key: i for i, key in enumerate(keys)}
        N, D = len(keys), self.env.obs_dim
        batch = {"obs": np.zeros((T + 1, N, D), dtype=np.float32), "actions": np.zeros((T, N), dtype=np.int64),
                 "rewards": np.zeros((T, N)), "terminated": np.zeros((T, N), dtype=bool),
                 "dones": np.zeros((T, N), dtype=bool), "valid": np.zeros((T, N), dtype=bool)}
        for t, key, o, a, r, te, done, nxt in records:
            i = column[key]
            batch["obs"][t, i], batch["obs"][t + 1, i] = o, nxt
            batch["actions"][t, i], batch["rewards"][t, i] = a, r
            batch["terminated"][t, i], batch["dones"][t, i], batch["valid"][t, i] = te, done, True
        return batch, episodes, steps

    def close(self) -> None:
        self.env.close()


class VehicularA3C(ActorCritic):
    """A3C with one policy shared by all controlled vehicles; each worker drives its own highway."""

    metric_fields = ["return", "length", "version", "coverage", "relay_length_m"]

    def make_worker(self, index: int) -> VehicularA3CWorker:
        return VehicularA3CWorker(self.cfg, index)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out = super().summarize(metrics)
        tail = metrics[-max(1, len(metrics) // 10):]
        for key in ("coverage", "relay_length_m"):
            values = [float(m[key]) for m in tail if key in m]
            if values:
                out[f"final_{key}"] = float(np.mean(values))
        return out


ALGORITHMS.add("a3c_vehicular", VehicularA3C, config=ActorCriticConfig,
               help="A3C over one shared policy for the vehicular relay scenario (workers = highway instances)")
