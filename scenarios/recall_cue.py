"""Recall cue: a memory task where a policy of the current observation cannot beat chance.

Each of N agents privately sees a random cue c in {0..K-1} (one-hot) at the first step only; then
``delay`` blank steps follow, and at the last step a query flag asks for the cue. The agent's action
there earns it 1/N if it equals its cue (other steps earn nothing), so the team return is the
fraction of agents that recalled their cue: 1 for a policy with memory, 1/K in expectation for any
function of the current observation (the query step's observation is the same whatever the cue;
tests/scenarios/test_recall_cue.py checks this by brute force). The global ``state()`` is the
agents' observations joined, so a centralised critic cannot see the cue after the first step either.

An episode is ``delay + 2`` steps: the cue, ``delay`` blanks, the query. Observation per agent:
``[one-hot cue (K) | query flag]``, zeros on the blank steps (and after the query, where the
episode terminates). Registered as ``marlq/recall_cue-v0``;
``scenarios/recall_cue_mappo.yaml`` compares GRU and feed-forward MAPPO on it (docs/recurrent.md).
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
class RecallCueConfig:
    """Number of agents, cue alphabet size and blank steps between the cue and the query."""

    n_agents: int = 2
    n_cues: int = 2
    delay: int = 3

    def validate(self) -> None:
        check_cue_game_sizes(self.n_agents, self.n_cues, 1)
        if isinstance(self.delay, bool) or not isinstance(self.delay, int) or self.delay < 0:
            raise ValueError(f"scenario.delay must be a non-negative integer, got {self.delay!r}")


class RecallCueEnv(ParallelEnv):
    """The recall cue game as a PettingZoo ParallelEnv with a global ``state()``."""

    metadata = {"name": "recall_cue_v0", "render_modes": []}

    def __init__(self, n_agents: int = 2, n_cues: int = 2, delay: int = 3) -> None:
        RecallCueConfig(n_agents, n_cues, delay).validate()
        self.n_agents, self.n_cues, self.delay = int(n_agents), int(n_cues), int(delay)
        self.episode_length = self.delay + 2
        self.possible_agents = [f"agent_{i}" for i in range(self.n_agents)]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0.0, 1.0, (self.n_agents * (self.n_cues + 1),), np.float32)
        self._rng = np.random.default_rng()
        self._cues = np.zeros(self.n_agents, dtype=np.int64)
        self._t = 0

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, (self.n_cues + 1,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(self.n_cues)

    def observation(self, t: int, cue: int) -> np.ndarray:
        """An agent's observation at step ``t`` of an episode with its cue ``cue``."""
        obs = np.zeros(self.n_cues + 1, dtype=np.float32)
        if t == 0:
            obs[cue] = 1.0
        elif t == self.episode_length - 1:
            obs[-1] = 1.0
        return obs

    def _observe(self) -> dict[str, np.ndarray]:
        return {a: self.observation(self._t, int(self._cues[i])) for i, a in enumerate(self.agents)}

    def state(self) -> np.ndarray:
        """The agents' current observations joined (the cue shows at the first step only)."""
        return np.concatenate([self.observation(self._t, int(c)) for c in self._cues])

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cues = self._rng.integers(0, self.n_cues, self.n_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        chosen = cue_game_actions("recall_cue", actions, self.agents, self.n_cues)
        query = self._t == self.episode_length - 1
        right = (chosen == self._cues) if query else np.zeros(self.n_agents, dtype=bool)
        rewards = {a: float(right[i]) / self.n_agents for i, a in enumerate(self.agents)}
        self._t += 1
        done = self._t >= self.episode_length
        terminated = {a: done for a in self.agents}  # the task ends there: no bootstrap past the query
        truncated = {a: False for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        obs = self._observe()  # after the query: blank
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def make_recall_cue(cfg: RecallCueConfig, seed: int) -> RecallCueEnv:
    """The scenario factory: a seeded RecallCueEnv from the ``scenario`` config section."""
    env = RecallCueEnv(cfg.n_agents, cfg.n_cues, cfg.delay)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "recall_cue": ScenarioSpec(
        config=RecallCueConfig,
        make=make_recall_cue,
        kind="parallel",
        help="a cue shown at the first step must be recalled at the last: memory needed, chance without",
    )
}

pettingzoo.register("parallel", "marlq/recall_cue-v0", RecallCueEnv)
