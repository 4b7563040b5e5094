"""CartPole-v1 from Gymnasium, vectorised in numpy (Gymnasium's CartPoleVectorEnv).

Every copy is stepped as numpy arrays in one call (no per-copy Python loop); each copy's step equals
Gymnasium's single ``CartPoleEnv`` step from the same state bit for bit, and a copy that ended restarts
on its next step (next-step autoreset), as tests/scenarios/test_cartpole.py checks over 2,000 cycles.
Batched seeds or more copies are a larger ``num_envs``.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from scenarios.spec import ScenarioSpec


@dataclass
class CartPoleConfig:
    """`num_envs` copies stepped together; episodes truncate at `max_episode_steps`."""

    num_envs: int = 8
    max_episode_steps: int = 500

    def validate(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"num_envs: must be at least 1, got {self.num_envs}")
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps: must be at least 1, got {self.max_episode_steps}")


def make_cartpole(cfg: CartPoleConfig, seed: int) -> gym.vector.VectorEnv:
    """A numpy-vectorised CartPole-v1 (next-step autoreset, Gymnasium's default)."""
    env = gym.make_vec("CartPole-v1", num_envs=cfg.num_envs, vectorization_mode="vector_entry_point",
                       max_episode_steps=cfg.max_episode_steps)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "cartpole": ScenarioSpec(CartPoleConfig, make_cartpole, "gym_vector",
                             "Gymnasium CartPole-v1, numpy-vectorised (num_envs per worker)"),
}
