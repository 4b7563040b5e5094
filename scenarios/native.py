"""What marl-q's native ports of array-friendly benchmark envs share (``scenarios.lbf_native``,
``scenarios.rware_native``): a copy is a batch of one, so one compiled path steps one copy and E copies.

- ``NativeBatch``: E copies' state as (E, ...) arrays (``STATE`` names them), each copy's own generator;
  ``reset(e, seed)``, ``step(actions (E, N), active) -> (rewards (E, N), terminated (E,), truncated (E,))``
  (an episode that ends is terminated for every agent, as lbforaging and rware say), ``observations()``
  (E, N, D) float32 and ``states(obs)`` (E, N D): ``agents.rollout.BatchedCopies``' batch. A subclass gives
  ``allocate(env)`` (one copy's arrays), ``_reset(e)`` and ``_step(actions, active) -> (rewards, ended)``.
- ``NativeEnv``: one copy as a PettingZoo ``ParallelEnv`` over its batch of one, agents ``agent_0`` ..
  ``agent_{N-1}``, as ``FlatParallelEnv(TupleParallelEnv(package env))`` reads the package's env: float32
  observations, per-agent rewards (``common_reward``: each the agents' mean), every agent terminated at
  the end, ``state()`` the observations joined. ``batched(envs)`` is the batch of those copies.
- ``package_env``: the package's own env through the ``gymnasium`` scenario's adapter (``engine: <package>``);
  ``time_engines``: the package's env against one native copy and a native batch, in one process.
"""
from __future__ import annotations

import importlib.util
import time
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv


def team_rewards(rewards: np.ndarray, common: bool) -> np.ndarray:
    """(E, N) per-agent rewards, or with ``common`` each agent's the mean of its copy's, summed in agent
    order from 0 as TupleParallelEnv sums a list."""
    if not common:
        return rewards
    total = np.zeros(rewards.shape[0])
    for i in range(rewards.shape[1]):
        total = total + rewards[:, i]
    return np.repeat((total / rewards.shape[1])[:, None], rewards.shape[1], axis=1)


def check_engine(engine: Any, engines: tuple[str, ...]) -> None:
    if engine not in engines:
        raise ValueError(f"scenario.engine must be one of {', '.join(engines)}, got {engine!r}")


def need_package(package: str) -> None:
    """A ValueError naming the extra to install when ``engine: <package>`` is asked for without the package."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"scenario.engine: {package} needs the {package} package (the optional extra: "
                         "pip install -e \".[epymarl-envs]\"); engine: native needs none")


def bare_task(task: Any, package: str) -> Any:
    """A package's task id without its ``package:`` prefix (both spellings are accepted); anything else as given."""
    return task[len(package) + 1:] if isinstance(task, str) and task.startswith(package + ":") else task


def package_env(package: str, task: str, common_reward: bool, kwargs: Optional[dict] = None) -> ParallelEnv:
    """``package:task`` through the gymnasium scenario's adapter (FlatParallelEnv over TupleParallelEnv)."""
    from scenarios.generic import GymnasiumConfig, checked_env
    need_package(package)
    return checked_env(GymnasiumConfig(env=f"{package}:{bare_task(task, package)}", kwargs=dict(kwargs or {}),
                                       agents="tuple", common_reward=common_reward))


class NativeBatch:
    """See the module docstring. The copies must share their task and ``common_reward``."""

    STATE: tuple[str, ...] = ()
    n_actions = 0

    def __init__(self, envs: list["NativeEnv"]) -> None:
        self._setup(envs)
        for name in self.STATE:
            setattr(self, name, np.concatenate([getattr(env.batch, name) for env in envs]))

    @classmethod
    def of_one(cls, env: "NativeEnv") -> "NativeBatch":
        """One copy's batch, before its first reset."""
        batch = cls.__new__(cls)
        batch._setup([env])
        for name, array in batch.allocate(env).items():
            setattr(batch, name, array)
        return batch

    def _setup(self, envs: list["NativeEnv"]) -> None:
        first = envs[0]
        if any(env.task_key != first.task_key or env.common_reward != first.common_reward for env in envs):
            raise ValueError(f"{type(self).__name__}: the copies differ in their task or common_reward")
        self.env = first  # the task's constants (rules, layout) are read from it
        self.common_reward = first.common_reward
        self.n_agents = len(first.possible_agents)
        self.num_envs = len(envs)
        self.generators = [env.np_random for env in envs]

    def allocate(self, env: "NativeEnv") -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _reset(self, e: int) -> None:
        raise NotImplementedError

    def _step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def observations(self) -> np.ndarray:
        raise NotImplementedError

    def reset(self, e: int, seed: Optional[int] = None) -> None:
        if seed is not None:
            self.generators[e], _ = seeding.np_random(seed)
        self._reset(e)

    def step(self, actions: np.ndarray, active: Optional[np.ndarray] = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        E, N, A = self.num_envs, self.n_agents, self.n_actions
        actions = np.asarray(actions)
        if actions.shape != (E, N) or not np.issubdtype(actions.dtype, np.integer) or \
                actions.size and (actions.min() < 0 or actions.max() >= A):
            raise ValueError(f"{type(self).__name__}: actions must be ({E}, {N}) integers in [0, {A}), "
                             f"got {actions.dtype} {actions.shape}")
        active = np.ones(E, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        rewards, ended = self._step(actions.astype(np.int64, copy=False), active)
        return team_rewards(rewards, self.common_reward), ended, np.zeros(E, dtype=bool)

    def states(self, obs: Optional[np.ndarray] = None) -> np.ndarray:
        return (self.observations() if obs is None else obs).reshape(self.num_envs, -1)


class NativeEnv(ParallelEnv):
    """See the module docstring. A subclass sets ``batch_class`` and calls ``_start(...)`` in its constructor."""

    batch_class: type[NativeBatch] = NativeBatch

    def _start(self, task_key: Any, n_agents: int, common_reward: Any, obs_space: spaces.Space) -> None:
        if not isinstance(common_reward, bool):
            raise ValueError(f"scenario.common_reward must be true or false, got {common_reward!r}")
        self.task_key, self.common_reward = task_key, common_reward
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self._obs_space, self._act_space = obs_space, spaces.Discrete(self.batch_class.n_actions)
        self.np_random, _ = seeding.np_random(None)
        self.batch = self.batch_class.of_one(self)  # this copy's state: a batch of one
        self._obs: Optional[np.ndarray] = None  # the last reset's or step's observations (_observe)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _observe(self) -> np.ndarray:
        """This copy's (N, D) observations, kept until its next reset or step (``state()`` reads them too)."""
        self._obs = self.batch.observations()[0]
        return self._obs

    def state(self) -> np.ndarray:
        """The agents' observations concatenated (as FlatParallelEnv's ``state: concat``)."""
        return (self._observe() if self._obs is None else self._obs).reshape(-1).copy()

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.batch.generators[0] = self.np_random
        self.batch.reset(0)
        self.agents = list(self.possible_agents)
        obs = self._observe()
        return {a: obs[i] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            return {}, {}, {}, {}, {}  # the episode is over (as SpreadNative and mpe2's parallel envs answer)
        A = self.batch_class.n_actions
        joint = np.zeros((1, len(self.possible_agents)), dtype=np.int64)
        for i, a in enumerate(self.possible_agents):
            if a in actions:
                u = int(actions[a])
                if not 0 <= u < A:
                    raise ValueError(f"{type(self).__name__}.step: {a}'s action must be an integer in [0, {A}), "
                                     f"got {actions[a]!r}")
                joint[0, i] = u
        rewards, ended, _ = self.batch.step(joint)
        obs = self._observe()
        done, agents = bool(ended[0]), self.agents
        out = ({a: obs[i] for i, a in enumerate(agents)}, {a: float(rewards[0, i]) for i, a in enumerate(agents)},
               {a: done for a in agents}, {a: False for a in agents}, {a: {} for a in agents})
        if done:
            self.agents = []
        return out

    def render(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not render; use the package's engine")

    def close(self) -> None:
        return None

    @classmethod
    def batched(cls, envs: list["NativeEnv"]) -> NativeBatch:
        """These copies stepped together as arrays; agents.rollout's team vector uses it."""
        return cls.batch_class(envs)


def time_engines(make_native: Callable[[], NativeEnv], package: str, task: str, steps: int, copies: int,
                 seed: int = 0) -> dict[str, float]:
    """Env steps per CPU second with uniform random actions, resetting at each episode's end: the package's
    env (``package:task``, when installed), one native copy and a batch of ``copies``, in one process
    (the compiled loops loaded or compiled before timing)."""
    rng = np.random.default_rng(seed)
    native = make_native()
    n, A = len(native.possible_agents), native.batch_class.n_actions
    native.reset(seed=seed)
    native.step({a: 0 for a in native.agents})

    def run_native() -> float:
        native.reset(seed=seed)
        t = time.process_time()
        for _ in range(steps):
            if not native.agents:
                native.reset()
            native.step({a: int(u) for a, u in zip(native.agents, rng.integers(0, A, n))})
        return steps / (time.process_time() - t)

    batch = native.batched([make_native() for _ in range(copies)])
    for e in range(copies):
        batch.reset(e, seed + e)

    def run_batch() -> float:
        t = time.process_time()
        for _ in range(steps // copies):
            _, ended, _ = batch.step(rng.integers(0, A, (copies, n)))
            for e in np.flatnonzero(ended):
                batch.reset(int(e))
            batch.observations()
        return (steps // copies) * copies / (time.process_time() - t)

    runs = {"native": run_native, f"native batch of {copies}": run_batch}
    if importlib.util.find_spec(package) is not None:
        import gymnasium as gym
        ref = gym.make(f"{package}:{task}").unwrapped  # the "package:" prefix imports it

        def run_ref() -> float:
            ref.reset(seed=seed)
            t = time.process_time()
            done = False
            for _ in range(steps):
                if done:
                    ref.reset()
                _, _, done, _, _ = ref.step(tuple(int(u) for u in rng.integers(0, A, n)))
            return steps / (time.process_time() - t)
        runs = {package: run_ref, **runs}
    return {name: run() for name, run in runs.items()}


def bench_main(bench: Callable[..., dict[str, float]], package: str, default_task: str) -> None:
    """``python -m scenarios.<port> [--task ID] [--steps N] [--copies E]``: ``bench``'s rates, printed."""
    import argparse
    parser = argparse.ArgumentParser(description=f"{package} against marl-q's native port: env steps per CPU second")
    parser.add_argument("--task", default=default_task)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    for name, rate in bench(args.task, args.steps, args.copies).items():
        print(f"{name:>24}: {rate:10.0f} env steps per CPU second")
