"""A finite episodic linear MDP with an exact optimum, for measuring regret honestly.

Construction (docs/lsvi.md): features phi(s, a) ~ Dirichlet(1_d) (non-negative, summing to 1,
so ||phi|| <= 1); for every step h and feature i a next-state distribution mu_{h,i} ~ Dirichlet(0.1 1_S),
so P_h(.|s,a) = sum_i phi_i(s,a) mu_{h,i} is a distribution and the MDP is exactly linear;
theta_h ~ U[0,1]^d so r_h(s,a) = <phi(s,a), theta_h> lies in [0, 1]. The first state of an episode is
uniform over the states. Because the MDP is finite, V* (backward induction) and the value of any
deterministic policy are computed exactly, so regret carries no sampling noise.

Also a PettingZoo ParallelEnv (``marlq/linear_mdp-v0``) in which each agent plays its own copy of the MDP.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pettingzoo
from gymnasium import spaces
from pettingzoo import ParallelEnv

from scenarios.spec import ScenarioSpec


@dataclass
class LinearMDPConfig:
    """Sizes of the random linear MDP and the seed that draws it (the same seed gives the same MDP)."""

    n_states: int = 20
    n_actions: int = 5
    d: int = 8
    horizon: int = 10
    seed: int = 0


def _require_positive(**sizes: int) -> None:
    """Raise ValueError naming the first size that is not a positive integer."""
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"scenario.{key} must be a positive integer, got {value!r}")


class LinearMDP:
    """The MDP's tables plus exact planning (V*) and exact evaluation of deterministic policies.

    Arrays: ``phi`` (S, A, d), ``mu`` (H, d, S), ``theta`` (H, d), ``transitions`` P (H, S, A, S),
    ``rewards`` r (H, S, A). Steps are indexed h = 0..H-1 here (the spec's 1..H).
    """

    def __init__(self, n_states: int, n_actions: int, d: int, horizon: int, seed: int = 0) -> None:
        _require_positive(n_states=n_states, n_actions=n_actions, d=d, horizon=horizon)
        rng = np.random.default_rng(seed)
        self.n_states, self.n_actions, self.d, self.horizon = n_states, n_actions, d, horizon
        self.phi = rng.dirichlet(np.ones(d), size=(n_states, n_actions))
        self.mu = rng.dirichlet(np.full(n_states, 0.1), size=(horizon, d))
        self.theta = rng.uniform(0.0, 1.0, size=(horizon, d))
        self.transitions = np.einsum("sai,hij->hsaj", self.phi, self.mu)
        self.rewards = np.einsum("sai,hi->hsa", self.phi, self.theta)
        # Rows of P are distributions up to rounding; renormalise so sampling and evaluation agree.
        self.transitions /= self.transitions.sum(axis=-1, keepdims=True)
        self._cumulative = np.cumsum(self.transitions, axis=-1)
        self._cumulative[..., -1] = 1.0
        self.initial_distribution = np.full(n_states, 1.0 / n_states)
        self._optimal: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_config(cls, cfg: LinearMDPConfig) -> LinearMDP:
        """Build from a ``scenario`` config section (any object with the LinearMDPConfig fields)."""
        return cls(cfg.n_states, cfg.n_actions, cfg.d, cfg.horizon, cfg.seed)

    def optimal_values(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (V*, Q*) by backward induction: V* has shape (H+1, S) with V*_{H} = 0, Q* (H, S, A)."""
        if self._optimal is None:
            values = np.zeros((self.horizon + 1, self.n_states))
            q_values = np.zeros((self.horizon, self.n_states, self.n_actions))
            for h in range(self.horizon - 1, -1, -1):
                q_values[h] = self.rewards[h] + self.transitions[h] @ values[h + 1]
                values[h] = q_values[h].max(axis=1)
            self._optimal = (values, q_values)
        return self._optimal

    def evaluate(self, policy: np.ndarray) -> np.ndarray:
        """Exact values (H+1, S) of the deterministic Markov policy ``policy[h, s] -> action``."""
        policy = np.asarray(policy)
        if policy.shape != (self.horizon, self.n_states):
            raise ValueError(f"policy must have shape {(self.horizon, self.n_states)}, got {policy.shape}")
        states = np.arange(self.n_states)
        values = np.zeros((self.horizon + 1, self.n_states))
        for h in range(self.horizon - 1, -1, -1):
            chosen = policy[h]
            values[h] = self.rewards[h, states, chosen] + self.transitions[h, states, chosen] @ values[h + 1]
        return values

    def sample_initial_state(self, rng: np.random.Generator) -> int:
        """Draw s_1 from the (uniform) initial distribution."""
        return int(rng.integers(self.n_states))

    def sample_next_state(self, h: int, state: int, action: int, uniform: float) -> int:
        """Next state at step h by inverting the CDF of P_h(.|s,a) at ``uniform`` in [0, 1)."""
        return int(np.searchsorted(self._cumulative[h, state, action], uniform, side="right"))


class LinearMDPParallelEnv(ParallelEnv):
    """PettingZoo view: each of ``n_agents`` agents plays its own copy of one linear MDP.

    Observation ``[h, s]`` (MultiDiscrete), action in ``Discrete(A)``, reward r_h(s, a); every agent
    terminates after ``horizon`` steps.
    """

    metadata = {"name": "linear_mdp_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_agents: int = 2, n_states: int = 20, n_actions: int = 5, d: int = 8,
                 horizon: int = 10, seed: int = 0, render_mode: str | None = None) -> None:
        _require_positive(n_agents=n_agents)
        self.mdp = LinearMDP(n_states, n_actions, d, horizon, seed)
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.render_mode = render_mode
        self._observation_space = spaces.MultiDiscrete([horizon + 1, n_states])
        self._action_space = spaces.Discrete(n_actions)
        self._rng = np.random.default_rng()
        self._step = 0
        self._states: dict[str, int] = {}

    def observation_space(self, agent: str) -> spaces.Space:
        """The same MultiDiscrete([H+1, S]) for every agent."""
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        """The same Discrete(A) for every agent."""
        return self._action_space

    def _observe(self, agent: str) -> np.ndarray:
        return np.array([self._step, self._states[agent]], dtype=np.int64)

    def reset(self, seed: int | None = None, options: dict | None = None):
        """Start every agent in a state drawn from the initial distribution."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._step = 0
        self._states = {agent: self.mdp.sample_initial_state(self._rng) for agent in self.agents}
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        """Apply each agent's action in its own copy; all agents end together after ``horizon`` steps."""
        rewards, next_states = {}, {}
        for agent in self.agents:
            action = int(actions[agent])
            state = self._states[agent]
            rewards[agent] = float(self.mdp.rewards[self._step, state, action])
            next_states[agent] = self.mdp.sample_next_state(self._step, state, action, self._rng.random())
        self._states = next_states
        self._step += 1
        done = self._step >= self.mdp.horizon
        observations = {a: self._observe(a) for a in self.agents}
        terminations = {a: done for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def render(self) -> None:
        """Nothing to draw: the MDP has no spatial layout."""
        return None

    def close(self) -> None:
        """No resources to release."""
        return None


def make_linear_mdp(cfg: LinearMDPConfig, seed: int = 0) -> LinearMDP:
    """Scenario factory: the MDP is fixed by ``scenario.seed``; the run seed only drives episodes."""
    return LinearMDP.from_config(cfg)  # LinearMDP checks the sizes


pettingzoo.register("parallel", "marlq/linear_mdp-v0", entry_point=LinearMDPParallelEnv)

SCENARIOS = {
    "linear_mdp": ScenarioSpec(
        config=LinearMDPConfig,
        make=make_linear_mdp,
        kind="custom",
        help="finite linear MDP with exact V* (regret experiments of the LSVI family)",
    ),
}
