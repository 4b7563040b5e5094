"""Penalty cue: a many-agent penalty game where each agent's credit is buried in a shared reward.

Every step each of N agents privately sees a cue c in {0..K-1} and either answers (actions 0..K-1)
or abstains (action K). Agent i's right answer is (c + i) mod K. Each agent's payoff is +1 for the
right answer, ``-penalty`` for a wrong one and 0 for abstaining, but nobody sees their own payoff:
every agent receives the team reward, the mean payoff. The episode is ``episode_length`` independent
rounds and then terminates; the optimum returns ``episode_length``, abstaining everywhere returns 0
and uniform play returns ``episode_length * (1 - penalty * (K - 1)) / (K + 1)``, below 0 with the
default penalty.

Why credit assignment matters here (Claus & Boutilier's penalty game, spread over many agents, as in
COMA's motivation, Foerster et al. 2018 sec. 4): agent i's own part of the reward is 1/N of it while
the other N-1 agents' right answers and penalties add a noise far larger than that part. A critic of
the agent's own observation (IAC), or of the state (central-V), leaves all of that noise in the
advantage; COMA's counterfactual baseline, with the other agents' actions held fixed, cancels it.
The penalty makes the noise large early (exploring agents are mostly wrong) and makes a safe
abstention the place a learner with noisy credit drifts to. The global ``state()`` is all cues and the round.

With ``cues: false`` every cue is always 0, so agent i must learn the fixed answer i mod K: the
repeated N-player penalty matrix game itself (no observation to condition on), where the critic's
job is easy and the difference between the critics is only how much of the other agents' noise
each leaves in the advantage (scenarios/penalty_cue_coma.yaml).

Registered as ``marlq/penalty_cue-v0``.
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
class PenaltyCueConfig:
    """Number of agents, cue alphabet size (actions: K answers + abstain), rounds, wrong-answer penalty."""

    n_agents: int = 10
    n_cues: int = 3
    episode_length: int = 5
    penalty: float = 1.0
    cues: bool = True  # false: every cue is always 0, a repeated N-player penalty matrix game


def agent_payoffs(cues: np.ndarray, actions: np.ndarray, n_cues: int, penalty: float) -> np.ndarray:
    """Each agent's private payoff: +1 for (cue + index) mod K, 0 for abstaining (action K),
    ``-penalty`` for any other answer. cues, actions: (N,) ints."""
    cues, actions = np.asarray(cues, dtype=np.int64), np.asarray(actions, dtype=np.int64)
    right = (cues + np.arange(len(cues))) % n_cues
    out = np.where(actions == right, 1.0, -float(penalty))
    return np.where(actions == n_cues, 0.0, out)


class PenaltyCueEnv(ParallelEnv):
    """The penalty cue game as a PettingZoo ParallelEnv with a global ``state()`` (all cues, one-hot)."""

    metadata = {"name": "penalty_cue_v0", "render_modes": []}

    def __init__(self, n_agents: int = 10, n_cues: int = 3, episode_length: int = 5, penalty: float = 1.0,
                 cues: bool = True) -> None:
        check_cue_game_sizes(n_agents, n_cues, episode_length)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not np.isfinite(penalty) or penalty < 0:
            raise ValueError(f"scenario.penalty must be a finite number >= 0, got {penalty!r}")
        if not isinstance(cues, bool):
            raise ValueError(f"scenario.cues must be true or false, got {cues!r}")
        self.cues = cues
        self.n_agents, self.n_cues, self.episode_length = int(n_agents), int(n_cues), int(episode_length)
        self.penalty = float(penalty)
        self.possible_agents = [f"agent_{i}" for i in range(self.n_agents)]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0.0, 1.0, (self.n_agents * self.n_cues + self.episode_length,), np.float32)
        self._rng = np.random.default_rng()
        self._cues = np.zeros(self.n_agents, dtype=np.int64)
        self._t = 0

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, (self.n_cues,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(self.n_cues + 1)  # K answers, then abstain

    def _observe(self) -> dict[str, np.ndarray]:
        eye = np.eye(self.n_cues, dtype=np.float32)
        return {a: eye[self._cues[i]].copy() for i, a in enumerate(self.agents)}

    def _draw_cues(self) -> np.ndarray:
        cues = self._rng.integers(0, self.n_cues, self.n_agents)  # drawn either way: same RNG stream
        return cues if self.cues else np.zeros_like(cues)

    def state(self) -> np.ndarray:
        """All agents' cues, one-hot and concatenated, then the round one-hot (so that a centralized
        critic's return-to-go is a function of the state): what the centralized critic may see."""
        cues = np.eye(self.n_cues, dtype=np.float32)[self._cues].reshape(-1)
        round_ = np.eye(self.episode_length, dtype=np.float32)[min(self._t, self.episode_length - 1)]
        return np.concatenate([cues, round_])

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cues = self._draw_cues()
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        chosen = cue_game_actions("penalty_cue", actions, self.agents, self.n_cues + 1)
        team_reward = float(np.mean(agent_payoffs(self._cues, chosen, self.n_cues, self.penalty)))
        self._t += 1
        done = self._t >= self.episode_length
        rewards = {a: team_reward for a in self.agents}
        terminated = {a: done for a in self.agents}  # a finite game: nothing follows the last round
        truncated = {a: False for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        self._cues = self._draw_cues()
        obs = self._observe()
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def make_penalty_cue(cfg: PenaltyCueConfig, seed: int) -> PenaltyCueEnv:
    """The scenario factory: a seeded PenaltyCueEnv from the ``scenario`` config section."""
    env = PenaltyCueEnv(cfg.n_agents, cfg.n_cues, cfg.episode_length, cfg.penalty, cfg.cues)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "penalty_cue": ScenarioSpec(
        config=PenaltyCueConfig,
        make=make_penalty_cue,
        kind="parallel",
        help="N agents answer private cues or abstain; wrong answers cost the whole team: credit assignment",
    )
}

pettingzoo.register("parallel", "marlq/penalty_cue-v0", PenaltyCueEnv)
