"""Team cue: a cooperative repeated game where each agent's credit is buried in a shared reward.

Every step each of N agents privately sees a random cue c in {0..K-1} and picks an action in the
same set; agent i's right answer is (c + i) mod K (so a shared actor must use the agent id; with
``id_shift: false`` it is c for everyone), and all agents receive the same team reward, the fraction
of agents that answered right. An agent's own contribution is 1/N of the reward while the other N-1 agents add noise of
the same order, so a critic that conditions only on the agent's observation (IAC) or on the state
(central-V) leaves that noise in the advantage, whereas COMA's counterfactual baseline (others'
actions held fixed) removes it exactly. This is the difference-reward setting of Wolpert & Tumer
that motivates COMA (Foerster et al. 2018, sec. 4); the optimum is known: return = episode length.
Without the id shift every agent faces the same task, and a shared actor pools all agents' samples,
which averages the others' noise away: the shift keeps each agent's credit problem its own.

Registered as ``marlq/team_cue-v0``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pettingzoo
from gymnasium import spaces
from pettingzoo import ParallelEnv

from scenarios.spec import ScenarioSpec, check_cue_game_sizes, cue_game_actions


@dataclass
class TeamCueConfig:
    """Number of agents, cue/action alphabet size and steps per episode."""

    n_agents: int = 6
    n_cues: int = 3
    episode_length: int = 10
    id_shift: bool = True  # agent i's right answer is (cue + i) mod K; false: the cue itself


class TeamCueEnv(ParallelEnv):
    """The team cue game as a PettingZoo ParallelEnv with a global ``state()`` (all cues, one-hot)."""

    metadata = {"name": "team_cue_v0", "render_modes": []}

    def __init__(self, n_agents: int = 6, n_cues: int = 3, episode_length: int = 10, id_shift: bool = True) -> None:
        check_cue_game_sizes(n_agents, n_cues, episode_length)
        if not isinstance(id_shift, bool):
            raise ValueError(f"scenario.id_shift must be true or false, got {id_shift!r}")
        self.n_agents, self.n_cues, self.episode_length = int(n_agents), int(n_cues), int(episode_length)
        self.id_shift = id_shift
        self.possible_agents = [f"agent_{i}" for i in range(self.n_agents)]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0.0, 1.0, (self.n_agents * self.n_cues,), np.float32)
        self._rng = np.random.default_rng()
        self._cues = np.zeros(self.n_agents, dtype=np.int64)
        self._t = 0

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, (self.n_cues,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(self.n_cues)

    def _observe(self) -> dict[str, np.ndarray]:
        eye = np.eye(self.n_cues, dtype=np.float32)
        return {a: eye[self._cues[i]].copy() for i, a in enumerate(self.agents)}

    def right_answers(self) -> np.ndarray:
        """Each agent's rewarded action this step: (cue + agent index) mod K, or the cue without id_shift."""
        shift = np.arange(self.n_agents) if self.id_shift else 0
        return (self._cues + shift) % self.n_cues

    def state(self) -> np.ndarray:
        """All agents' cues, one-hot and concatenated: what the centralized critic may see."""
        return np.eye(self.n_cues, dtype=np.float32)[self._cues].reshape(-1)

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cues = self._rng.integers(0, self.n_cues, self.n_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        chosen = cue_game_actions("team_cue", actions, self.agents, self.n_cues)
        team_reward = float(np.mean(chosen == self.right_answers()))
        self._t += 1
        done = self._t >= self.episode_length
        rewards = {a: team_reward for a in self.agents}
        terminated = {a: False for a in self.agents}
        truncated = {a: done for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        self._cues = self._rng.integers(0, self.n_cues, self.n_agents)
        obs = self._observe()
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def make_team_cue(cfg: TeamCueConfig, seed: int) -> TeamCueEnv:
    """The scenario factory: a seeded TeamCueEnv from the ``scenario`` config section."""
    env = TeamCueEnv(cfg.n_agents, cfg.n_cues, cfg.episode_length, cfg.id_shift)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "team_cue": ScenarioSpec(
        config=TeamCueConfig,
        make=make_team_cue,
        kind="parallel",
        help="N agents match private cues for a shared reward: credit assignment with a known optimum",
    )
}

pettingzoo.register("parallel", "marlq/team_cue-v0", TeamCueEnv)
