"""Any PettingZoo ParallelEnv as the learners see it: flat float32 observations, a global state, and
optionally common spaces and agent ids.

``FlatParallelEnv(inner, common_spaces=..., agent_id=..., state=...)`` is itself a ParallelEnv
(it passes PettingZoo's ``parallel_api_test``):

- **Observations** must be ``Box`` spaces; they are flattened to float32 vectors. A ``Dict``,
  ``Tuple``, ``Discrete`` or image (``uint8`` Box of rank 2 or more) observation space is an error
  that names the agent and the space: marl-q's heads take flat vectors.
- **Actions** must be ``Discrete`` or a rank-1 ``Box`` (continuous); anything else is an error
  naming the agent and the space.
- ``common_spaces: true`` zero-pads every agent's observation to the largest size and every
  discrete action space to the largest ``n``. Each step's ``infos[agent]["action_mask"]`` marks
  the agent's real actions (1) and the padding (0); a padded action is played as the agent's
  action 0 (never chosen by a learner that honours the mask).
- ``agent_id: true`` appends a one-hot agent index to each observation (after padding), so that
  one shared network can tell agents apart.
- ``state``: ``env`` (the inner env's ``state()``, flattened; an error if it has none), ``concat``
  (every agent's flat observation, padded when ``common_spaces``, concatenated in
  ``possible_agents`` order; zeros for an agent no longer in play), or ``auto`` (``env`` when the
  inner env implements ``state()``, else ``concat``).

``TupleParallelEnv(inner, common_reward=...)`` reads a Gymnasium env whose observation and action
spaces are Tuples with one entry per agent (lbforaging, rware) as a ParallelEnv, to be wrapped in
``FlatParallelEnv`` like any other; ``tuple_agents`` tells such an env from a single-agent one.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

STATE_CHOICES = ("auto", "concat", "env")


class SpaceError(ValueError):
    """An agent's space marl-q cannot drive; the message names the agent and the space."""


def flat_obs_size(agent: str, space: spaces.Space) -> int:
    """The length of a Box observation flattened; a SpaceError for any other kind of space."""
    if isinstance(space, spaces.Box):
        if space.dtype == np.uint8 and len(space.shape) >= 2:
            raise SpaceError(f"agent {agent!r}: image observations ({space}) are not supported; marl-q's heads "
                             "take flat vectors (wrap the env with a feature extractor, or use a vector observation)")
        return int(np.prod(space.shape))
    raise SpaceError(f"agent {agent!r}: observation space {space} is not supported; marl-q's heads take flat "
                     "Box vectors (flatten Dict/Tuple/Discrete observations in a wrapper)")


def check_action_space(agent: str, space: spaces.Space) -> None:
    """Discrete, or a rank-1 Box; a SpaceError naming the agent otherwise."""
    if isinstance(space, spaces.Discrete):
        return
    if isinstance(space, spaces.Box) and len(space.shape) == 1:
        return
    raise SpaceError(f"agent {agent!r}: action space {space} is not supported (Discrete or a 1-D Box)")


def has_state(env: Any) -> bool:
    """Whether ``env`` implements ``state()`` (PettingZoo's base class raises NotImplementedError)."""
    if not callable(getattr(env, "state", None)):
        return False
    try:
        env.state()
    except NotImplementedError:
        return False
    except Exception:  # not reset yet, or a state that needs a step: it exists
        return True
    return True


class FlatParallelEnv(ParallelEnv):
    """See the module docstring."""

    def __init__(self, inner: ParallelEnv, common_spaces: bool = False, agent_id: bool = False,
                 state: str = "auto") -> None:
        if state not in STATE_CHOICES:
            raise ValueError(f"scenario.state must be one of {', '.join(STATE_CHOICES)}, got {state!r}")
        self.inner = inner
        self.possible_agents = list(inner.possible_agents)
        self.agents: list[str] = []
        self.metadata = dict(getattr(inner, "metadata", {}) or {})
        self.render_mode = getattr(inner, "render_mode", None)
        self.common_spaces, self.agent_id = bool(common_spaces), bool(agent_id)
        self._obs_dims = {a: flat_obs_size(a, inner.observation_space(a)) for a in self.possible_agents}
        self._inner_act = {a: inner.action_space(a) for a in self.possible_agents}
        for a, space in self._inner_act.items():
            check_action_space(a, space)
        self._obs_dim = max(self._obs_dims.values())
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self._masks: dict[str, np.ndarray] = {}
        self._n = 0
        if self.common_spaces:
            discrete = [isinstance(s, spaces.Discrete) for s in self._inner_act.values()]
            if not all(discrete):
                sizes = {a: s.shape for a, s in self._inner_act.items() if isinstance(s, spaces.Box)}
                if any(discrete) or len({s for s in sizes.values()}) > 1:
                    raise SpaceError("scenario.common_spaces pads discrete action spaces only; the agents' action "
                                     f"spaces are {', '.join(f'{a}: {s}' for a, s in self._inner_act.items())}")
            else:
                self._n = max(int(s.n) for s in self._inner_act.values())
                self._masks = {a: (np.arange(self._n) < int(s.n)).astype(np.int8) for a, s in self._inner_act.items()}
        self._state_from_env = state == "env" or (state == "auto" and has_state(inner))
        if state == "env" and not callable(getattr(inner, "state", None)):
            raise SpaceError("scenario.state: env, but the environment has no state(); use state: concat")
        self._state_dim: Optional[int] = None if self._state_from_env else len(self.possible_agents) * self._own_dim(None)

    # -- spaces -----------------------------------------------------------------------------------
    def _own_dim(self, agent: Optional[str]) -> int:
        base = self._obs_dim if (self.common_spaces or agent is None) else self._obs_dims[agent]
        return base + (len(self.possible_agents) if self.agent_id and agent is not None else 0)

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (self._own_dim(agent),), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        if self._masks:
            return spaces.Discrete(self._n)
        return self._inner_act[agent]

    @property
    def state_space(self) -> spaces.Space:
        if self._state_dim is None:
            self._state_dim = int(np.asarray(self.inner.state()).size)
        return spaces.Box(-np.inf, np.inf, (self._state_dim,), np.float32)

    def action_mask(self, agent: str) -> np.ndarray:
        """1 for the agent's real actions, 0 for padding (all ones without common_spaces)."""
        if self._masks:
            return self._masks[agent].copy()
        space = self._inner_act[agent]
        return np.ones(int(space.n), dtype=np.int8) if isinstance(space, spaces.Discrete) else np.ones(0, np.int8)

    # -- conversion -------------------------------------------------------------------------------
    def _flat(self, agent: str, o: Any) -> np.ndarray:
        flat = np.asarray(o, dtype=np.float32).reshape(-1)
        size = self._own_dim(agent)
        if size == flat.size:
            return flat
        out = np.zeros(size, dtype=np.float32)
        out[: flat.size] = flat
        if self.agent_id:
            out[size - len(self.possible_agents) + self._index[agent]] = 1.0
        return out

    def _convert(self, obs: dict[str, Any]) -> dict[str, np.ndarray]:
        self._last = {a: self._flat(a, o) for a, o in obs.items()}
        return dict(self._last)

    def _with_masks(self, infos: dict[str, Any], agents: Any) -> dict[str, dict]:
        if not self._masks:
            return {a: dict(infos.get(a, {}) or {}) for a in agents}
        return {a: {**(infos.get(a, {}) or {}), "action_mask": self.action_mask(a)} for a in agents}

    # -- the Parallel API -------------------------------------------------------------------------
    def _env_state(self) -> None:
        """Read the inner env's state after a reset or a step. Some envs cannot compute one once the
        episode is over (multiwalker removes fallen walkers); the last state then stands for the final
        one, which only a bootstrap at a time limit would read."""
        try:
            self._state = np.asarray(self.inner.state(), dtype=np.float32).reshape(-1)
        except Exception:
            if self.agents:
                raise

    def state(self) -> np.ndarray:
        if self._state_from_env:
            if getattr(self, "_state", None) is None:
                self._env_state()
            return self._state.copy()
        width = self._own_dim(None)
        out = np.zeros(len(self.possible_agents) * width, dtype=np.float32)
        for a, o in getattr(self, "_last", {}).items():
            i = self._index[a]
            raw = o[: self._obs_dims[a]] if not self.common_spaces else o[: self._obs_dim]
            out[i * width: i * width + raw.size] = raw
        return out

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        obs, infos = self.inner.reset(seed=seed, options=options)
        self.agents = list(self.inner.agents)
        if self._state_from_env:
            self._state = None
            self._env_state()
        return self._convert(obs), self._with_masks(infos, obs)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self._masks:
            actions = {a: (int(u) if 0 <= int(u) < int(self._inner_act[a].n) else 0) for a, u in actions.items()}
        obs, rewards, terminated, truncated, infos = self.inner.step(actions)
        self.agents = list(self.inner.agents)
        if not obs:
            self._last = {}
        if self._state_from_env:
            self._env_state()
        return self._convert(obs), rewards, terminated, truncated, self._with_masks(infos, obs)

    def render(self) -> Any:
        return self.inner.render()

    def close(self) -> None:
        self.inner.close()


# ----------------------------------------------------------------------------- Gymnasium Tuple envs
def tuple_agents(observation_space: spaces.Space, action_space: spaces.Space) -> Optional[int]:
    """The number of agents of a multi-agent Gymnasium env (observation and action spaces both Tuples,
    one entry per agent), or None for a single-agent one (neither a Tuple). A SpaceError when it is
    ambiguous: only one of the two is a Tuple, or their lengths differ."""
    obs_tuple, act_tuple = isinstance(observation_space, spaces.Tuple), isinstance(action_space, spaces.Tuple)
    if not obs_tuple and not act_tuple:
        return None
    if obs_tuple and act_tuple and len(observation_space) == len(action_space) and len(action_space) > 0:
        return len(action_space)
    def say(space: spaces.Space) -> str:
        return f"a Tuple of {len(space)}" if isinstance(space, spaces.Tuple) else str(space)
    raise SpaceError(f"the observation space is {say(observation_space)} and the action space "
                     f"{say(action_space)}: a multi-agent Gymnasium env has Tuple observation and action spaces "
                     "with one entry per agent each, and a single-agent one neither")


def _per_agent(value: Any, n: int, what: str) -> list:
    """A step's reward or done as one entry per agent: a sequence of ``n``, or one value for all."""
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        items = list(np.asarray(value).reshape(-1)) if isinstance(value, np.ndarray) else list(value)
        if len(items) != n:
            raise ValueError(f"the env returned {len(items)} {what}s for {n} agents")
        return items
    return [value] * n


def _idle_action(space: spaces.Space) -> Any:
    """The action played for an agent that is done while its team plays on: the lowest Discrete
    action, or a Box's point nearest zero."""
    if isinstance(space, spaces.Discrete):
        return int(space.start)
    return np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)


class TupleParallelEnv(ParallelEnv):
    """A Gymnasium env with Tuple spaces, one entry per agent, as a PettingZoo ParallelEnv.

    - Agents are ``agent_0`` .. ``agent_{N-1}``, in the Tuples' order; each sees its own entry of the
      observation Tuple and plays its own entry of the action Tuple.
    - **Rewards**: a sequence of N (lbforaging, rware) is each agent's own; one number is the team's
      and each agent receives 1/N of it, so the team return (the agents' rewards summed, what marl-q
      reports as ``return``) is the env's. ``common_reward: true`` gives every agent the mean of the
      agents' rewards: one learning signal for the team (EPyMARL's common reward, which is their sum,
      divided by N), and the same team return.
    - **Episode ends**: ``terminated`` and ``truncated`` are one flag for all agents or one per agent;
      an agent whose flag is set leaves ``agents`` (and plays its lowest action while the others go
      on); when every agent has left, the episode is over. lbforaging 2.0.0 and rware 2.0.0 return one
      flag, ``terminated``, also when their step limit ends the episode, and never ``truncated``.
    - ``infos``: the env's info dict, copied for each agent.
    """

    metadata = {"name": "gymnasium_tuple"}

    def __init__(self, inner: gym.Env, common_reward: bool = False) -> None:
        n = tuple_agents(inner.observation_space, inner.action_space)
        if n is None:
            raise SpaceError(f"the observation space {inner.observation_space} and the action space "
                             f"{inner.action_space} are not Tuples (one entry per agent)")
        self.inner = inner
        self.common_reward = bool(common_reward)
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._obs = {a: inner.observation_space[i] for i, a in enumerate(self.possible_agents)}
        self._act = {a: inner.action_space[i] for i, a in enumerate(self.possible_agents)}
        self.render_mode = getattr(inner, "render_mode", None)
        # gymnasium.make's passive checker reads a step's reward as one float; a list of rewards is
        # this kind's convention, so its step check (a warning on every process's first step) is skipped
        env: Any = inner
        while isinstance(env, gym.Wrapper):
            if isinstance(env, gym.wrappers.PassiveEnvChecker):
                env.checked_step = True
            env = env.env

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act[agent]

    def _split(self, obs: Any) -> dict[str, Any]:
        return {a: obs[i] for i, a in enumerate(self.possible_agents) if a in self.agents}

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        obs, info = self.inner.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return self._split(obs), {a: dict(info) for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        joint = tuple(actions[a] if a in actions and a in self.agents else _idle_action(self._act[a])
                      for a in self.possible_agents)
        obs, reward, terminated, truncated, info = self.inner.step(joint)
        n = len(self.possible_agents)
        if isinstance(reward, (Sequence, np.ndarray)):
            rewards = [float(r) for r in _per_agent(reward, n, "reward")]
        else:
            rewards = [float(reward) / n] * n
        if self.common_reward:
            rewards = [float(sum(rewards)) / n] * n
        term = [bool(t) for t in _per_agent(terminated, n, "terminated flag")]
        trunc = [bool(t) for t in _per_agent(truncated, n, "truncated flag")]
        acting = [a for a in self.possible_agents if a in self.agents]
        index = {a: i for i, a in enumerate(self.possible_agents)}
        out = ({a: obs[index[a]] for a in acting}, {a: rewards[index[a]] for a in acting},
               {a: term[index[a]] for a in acting}, {a: trunc[index[a]] for a in acting},
               {a: dict(info) for a in acting})
        self.agents = [a for a in acting if not (term[index[a]] or trunc[index[a]])]
        return out

    def render(self) -> Any:
        return self.inner.render()

    def close(self) -> None:
        self.inner.close()
