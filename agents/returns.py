"""Returns and advantages as pure functions over (T, N) arrays: T steps of N parallel environments.

Conventions. ``next_values[t]`` is V(s_{t+1}), the value of the observation that followed step t
(with Gymnasium's next-step autoreset that is the final observation when step t ended an episode,
so a time-limit truncation bootstraps from the right state). ``terminated[t]`` cuts the bootstrap
(a true terminal state has value 0); ``dones[t]`` (terminated or truncated) cuts the recursion.
"""
from __future__ import annotations

import numpy as np


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
        dones: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates (Schulman et al. 2016), eq. 16, with episode boundaries.

    delta_t = r_t + gamma (1 - term_t) V(s_{t+1}) - V(s_t);  A_t = delta_t + gamma lam (1 - done_t) A_{t+1}.
    With lam = 1 this is the bootstrapped n-step return minus V(s_t) (A2C/A3C); lam = 0 is one-step TD.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    T = rewards.shape[0]
    not_term = 1.0 - np.asarray(terminated, dtype=np.float64)
    not_done = 1.0 - np.asarray(dones, dtype=np.float64)
    deltas = rewards + gamma * not_term * next_values - values
    adv = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in range(T - 1, -1, -1):
        running = deltas[t] + gamma * lam * not_done[t] * running
        adv[t] = running
    return adv


def discounted_returns(rewards: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
                       dones: np.ndarray, gamma: float) -> np.ndarray:
    """A3C's n-step targets R_t = r_t + gamma R_{t+1}, bootstrapped from V at a non-terminal end."""
    rewards = np.asarray(rewards, dtype=np.float64)
    T = rewards.shape[0]
    not_term = 1.0 - np.asarray(terminated, dtype=np.float64)
    not_done = 1.0 - np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(rewards)
    # the value after the last step, or after an episode that was cut by a time limit
    running = next_values[T - 1] * not_term[T - 1]
    for t in range(T - 1, -1, -1):
        if t < T - 1:
            running = not_done[t] * running + (1.0 - not_done[t]) * not_term[t] * next_values[t]
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def rollout_targets(batch: dict[str, np.ndarray], values: np.ndarray, gamma: float, lam: float,
                    reward_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """GAE advantages and value targets (advantage + V) for a rollout batch (``rewards``,
    ``terminated``, ``dones`` (T, N)) from ``values`` (T+1, N): V on every observation, the last row
    the observation after the last step. Rewards are scaled by ``reward_scale``."""
    T = len(values) - 1
    adv = gae(batch["rewards"] * reward_scale, values[:T], values[1:], batch["terminated"], batch["dones"],
              gamma, lam)
    return adv, adv + values[:T]
