"""Scripted policies for simple_spread: reference points for the learned returns.

A learned return of -55 on spread means little on its own. These hand-written controllers put it on a
scale, on the same reward (the team reward: the sum of the agents' rewards, summed over the episode):

- ``noop``: every agent stands still;
- ``nearest``: every agent steers to the landmark nearest to it (agents may pile onto one landmark);
- ``by_index``: agent i steers to landmark i. Decentralised, and reachable by a shared actor that sees
  its one-hot id, since the observation lists the landmarks in a fixed order;
- ``assignment``: the joint assignment of agents to landmarks with the least total distance,
  recomputed every step from the true positions (centralised; an upper reference, not the optimum).

The steering is a bang-bang controller with velocity damping: it moves along the axis with the larger
component of ``offset - k * velocity`` and stops once that vector is shorter than ``deadband``.

``python -m scenarios.spread_scripted --episodes 500`` prints the mean return of each.
"""
from __future__ import annotations

import argparse
import itertools
from typing import Callable

import numpy as np

from marl_q.seeding import SCRIPTED_SPREAD_FIRST_SEED, scripted_episode_seed
from scenarios.spread_native import SpreadNative

POLICIES = ("noop", "nearest", "by_index", "assignment")


def steer(offset: np.ndarray, velocity: np.ndarray, k: float = 0.6, deadband: float = 0.05) -> int:
    """The discrete action (0 none, 1 left, 2 right, 3 down, 4 up) that moves toward ``offset``."""
    d = offset - k * velocity
    if np.abs(d).max() < deadband:
        return 0
    if abs(d[0]) > abs(d[1]):
        return 2 if d[0] > 0 else 1
    return 4 if d[1] > 0 else 3


def _landmark_offsets(obs: np.ndarray, n: int) -> np.ndarray:
    return obs[4:4 + 2 * n].reshape(n, 2)  # layout: vel(2), pos(2), landmark offsets (2n), ...


def targets(policy: str, observations: list[np.ndarray]) -> list[int]:
    """The landmark each agent steers to, from the agents' observations (in agent order)."""
    n = len(observations)
    if policy == "nearest":
        return [int(np.argmin(np.linalg.norm(_landmark_offsets(o, n), axis=1))) for o in observations]
    if policy == "by_index":
        return list(range(n))
    if policy == "assignment":
        # distance of agent i to landmark j, from agent i's own offsets
        cost = np.stack([np.linalg.norm(_landmark_offsets(o, n), axis=1) for o in observations])
        best = min(itertools.permutations(range(n)), key=lambda p: sum(cost[i, p[i]] for i in range(n)))
        return list(best)
    raise ValueError(f"unknown scripted policy {policy!r} (choices: {', '.join(POLICIES)})")


def joint_action(policy: str, observations: list[np.ndarray]) -> list[int]:
    if policy not in POLICIES:
        raise ValueError(f"unknown scripted policy {policy!r} (choices: {', '.join(POLICIES)})")
    if policy == "noop":
        return [0] * len(observations)
    n = len(observations)
    return [steer(_landmark_offsets(o, n)[t], o[0:2]) for o, t in zip(observations, targets(policy, observations))]


def episode_returns(policy: str, episodes: int, seed: int = 0, n_agents: int = 3, local_ratio: float = 0.5,
                    max_cycles: int = 25, team: Callable[[list[float]], float] = sum) -> np.ndarray:
    """Team return (``team`` of the agents' rewards, summed over steps) of each of ``episodes`` episodes;
    episode e is reset with seed ``seed + e``."""
    if episodes < 1:
        raise ValueError(f"episodes: must be at least 1, got {episodes}")
    env = SpreadNative(N=n_agents, local_ratio=local_ratio, max_cycles=max_cycles)
    out = np.zeros(episodes)
    for e in range(episodes):
        obs, _ = env.reset(seed=scripted_episode_seed(seed, e))
        while env.agents:
            agents = list(env.agents)
            acts = joint_action(policy, [obs[a] for a in agents])
            obs, rewards, *_ = env.step(dict(zip(agents, acts)))
            out[e] += team([float(rewards[a]) for a in agents])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="mean team return of scripted simple_spread policies")
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=SCRIPTED_SPREAD_FIRST_SEED, help="first reset seed")
    parser.add_argument("--n-agents", type=int, default=3)
    parser.add_argument("--local-ratio", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes: must be at least 1, got {args.episodes}")
    print(f"simple_spread N={args.n_agents}, local_ratio {args.local_ratio}, 25 steps; team reward = sum of "
          f"the agents' rewards; {args.episodes} episodes, mean +- 95% normal interval")
    for policy in POLICIES:
        r = episode_returns(policy, args.episodes, args.seed, args.n_agents, args.local_ratio)
        half = f"+- {1.96 * r.std(ddof=1) / np.sqrt(len(r)):.2f}" if len(r) > 1 else "(one episode: no interval)"
        print(f"  {policy:10s} {r.mean():8.2f} {half}")


if __name__ == "__main__":
    main()
