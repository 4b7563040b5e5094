"""A small-reward Gymnasium task: follow a drifting target on a line, seen through noise.

Built to test PPO's defaults on an environment nobody tuned for (docs/actor_critic.md, "Defaults"):
3 discrete actions, 200-step episodes, per-step rewards in [0, 0.1].

    agent  p_{t+1} = clip(p_t + step (a_t - 1), -1, 1)           a_t in {0: left, 1: stay, 2: right}
    target g_{t+1} = clip(g_t + N(0, drift^2), -bound, bound)     g_0 ~ U[-bound, bound], p_0 = 0
    reward r_t     = 0.1 exp(-|p_{t+1} - g_{t+1}| / scale)        (0.1 exactly on the target)
    observation    (p_t, g_t + N(0, noise^2))                     float32, the target seen through noise,
                                                                  clipped to [-10, 10]

The episode is truncated after ``max_steps`` steps (never terminated). A random policy drifts away
from the target; a policy that moves towards the observed target collects most of the 0.1 a step.
Registered with Gymnasium as ``marlq/SmallReward-v0`` (``import scenarios`` registers it), so a
scenario file names it as ``scenario: {name: gymnasium, env: marlq/SmallReward-v0}``
(scenarios/small_reward_ppo.yaml).
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "marlq/SmallReward-v0"
MAX_REWARD = 0.1


class SmallRewardEnv(gym.Env):
    """Track a noisy, drifting 1-D target with left/stay/right; rewards of at most 0.1 a step."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 200, step: float = 0.05, drift: float = 0.05, noise: float = 0.8,
                 scale: float = 0.2, bound: float = 0.8, band: float = 0.0) -> None:
        for key, value in {"max_steps": max_steps, "step": step, "scale": scale, "bound": bound}.items():
            if not value > 0:
                raise ValueError(f"{key}: must be positive, got {value!r}")
        for key, value in {"drift": drift, "noise": noise, "band": band}.items():
            if not value >= 0:
                raise ValueError(f"{key}: must be >= 0, got {value!r}")
        self.max_steps, self.step_size, self.drift, self.noise = int(max_steps), step, drift, noise
        self.scale, self.bound, self.band = scale, min(bound, 1.0), band
        self.action_space = spaces.Discrete(3)
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
        self._p = self._g = 0.0
        self._t = 0

    def _observe(self) -> np.ndarray:
        seen = float(np.clip(self._g + self.noise * self.np_random.standard_normal(), -10.0, 10.0))
        return np.array([self._p, seen], dtype=np.float32)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode: the agent at 0, the target uniform in [-bound, bound]."""
        super().reset(seed=seed)
        self._p, self._t = 0.0, 0
        self._g = float(self.np_random.uniform(-self.bound, self.bound))
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move the agent, drift the target, pay 0.1 exp(-distance / scale)."""
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self._p = float(np.clip(self._p + self.step_size * (int(action) - 1), -1.0, 1.0))
        self._g = float(np.clip(self._g + self.drift * self.np_random.standard_normal(), -self.bound, self.bound))
        self._t += 1
        distance = abs(self._p - self._g)
        if self.band > 0:
            reward = MAX_REWARD if distance <= self.band else 0.0
        else:
            reward = MAX_REWARD * float(np.exp(-distance / self.scale))
        return self._observe(), reward, False, self._t >= self.max_steps, {"distance": distance}


def tracking_action(obs: np.ndarray, dead_band: float = 0.05) -> int:
    """The scripted reference policy: step towards the observed target (stay within ``dead_band``)."""
    gap = float(obs[1] - obs[0])
    return 1 if abs(gap) <= dead_band else (2 if gap > 0 else 0)


def scripted_returns(policy: str, episodes: int, seed: int = 0, **kwargs: Any) -> list[float]:
    """Episode returns of ``random`` (uniform actions) or ``tracking`` (``tracking_action``)."""
    if policy not in ("random", "tracking"):
        raise ValueError(f"policy: 'random' or 'tracking', got {policy!r}")
    env = SmallRewardEnv(**kwargs)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = int(rng.integers(3)) if policy == "random" else tracking_action(obs)
            obs, reward, term, trunc, _ = env.step(action)
            total += reward
            done = term or trunc
        returns.append(total)
    return returns


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SmallRewardEnv)

if __name__ == "__main__":
    for name in ("random", "tracking"):
        values = scripted_returns(name, 500)
        print(f"{name:9s} mean return over 500 episodes: {np.mean(values):.2f} (std {np.std(values):.2f})")
