"""CartPole-v1 from Gymnasium, vectorised in numpy (Gymnasium's CartPoleVectorEnv).

Every copy is stepped as numpy arrays in one call (no per-copy Python loop); each copy's step equals
Gymnasium's single ``CartPoleEnv`` step from the same state bit for bit, and a copy that ended restarts
on its next step (next-step autoreset), as tests/scenarios/test_cartpole.py checks over 2,000 cycles.
Batched seeds or more copies are a larger ``num_envs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import gymnasium as gym
import numpy as np

from scenarios.spec import ScenarioSpec


OBSERVATION = ("x", "x_dot", "theta", "theta_dot")  # CartPole-v1's observation, in order


@dataclass
class CartPoleConfig:
    """`num_envs` copies stepped together; episodes truncate at `max_episode_steps`; `observe`: the
    observation's entries the agent sees (null: all four; [x, theta] hides the velocities, the
    partially observable CartPole on which a memoryless policy must guess them)."""

    num_envs: int = 8
    max_episode_steps: int = 500
    observe: Optional[list[str]] = None

    def validate(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"num_envs: must be at least 1, got {self.num_envs}")
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps: must be at least 1, got {self.max_episode_steps}")
        if self.observe is not None:
            unknown = [k for k in self.observe if k not in OBSERVATION]
            if unknown or not self.observe or len(set(self.observe)) != len(self.observe):
                raise ValueError(f"observe: a non-empty list of distinct entries of {list(OBSERVATION)}, "
                                 f"got {self.observe}")


def _entries(obs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The kept columns of a batch of observations (module-level: a sim snapshot pickles the env)."""
    return obs[:, keep]


def make_cartpole(cfg: CartPoleConfig, seed: int) -> gym.vector.VectorEnv:
    """A numpy-vectorised CartPole-v1 (next-step autoreset, Gymnasium's default)."""
    env = gym.make_vec("CartPole-v1", num_envs=cfg.num_envs, vectorization_mode="vector_entry_point",
                       max_episode_steps=cfg.max_episode_steps)
    if cfg.observe is not None:
        keep = np.array([OBSERVATION.index(k) for k in cfg.observe])
        box = env.single_observation_space
        single = gym.spaces.Box(box.low[keep], box.high[keep], dtype=box.dtype)
        env = gym.wrappers.vector.TransformObservation(
            env, partial(_entries, keep=keep), gym.vector.utils.batch_space(single, cfg.num_envs), single)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "cartpole": ScenarioSpec(CartPoleConfig, make_cartpole, "gym_vector",
                             "Gymnasium CartPole-v1, numpy-vectorised (num_envs per worker)"),
}
