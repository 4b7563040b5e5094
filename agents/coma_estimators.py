"""The math of COMA and its baselines as pure torch functions, testable without an environment.

Shapes use B = episodes in a batch, T = transitions per episode, A = agents, U = actions.
Sources: Foerster et al., AAAI 2018 (arXiv 1705.08926), eq. 4 for the counterfactual baseline;
the TD(lambda) recursion is the one PyMARL's ``build_td_lambda_targets`` uses (re-derived here).
"""
from __future__ import annotations

from typing import Optional

import torch


def counterfactual_advantage(
    q_alternatives: torch.Tensor, pi: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """COMA's advantage A^a = Q(s,u) - sum_u' pi^a(u') Q(s,(u^-a,u')) and its baseline, for every agent.

    q_alternatives (..., A, U): Q(s, (u^-a, u')) for each agent a and each of its actions u', as one
    critic forward pass gives them; pi (..., A, U): each agent's policy; actions (..., A): the joint
    action taken. Returns (advantage (..., A), baseline (..., A)); nothing is detached here.
    """
    if q_alternatives.shape != pi.shape:
        raise ValueError(f"q_alternatives {tuple(q_alternatives.shape)} and pi {tuple(pi.shape)} differ in shape")
    if actions.shape != q_alternatives.shape[:-1]:
        raise ValueError(f"actions {tuple(actions.shape)} must be q_alternatives' shape without its last dim")
    baseline = (pi * q_alternatives).sum(dim=-1)
    q_taken = q_alternatives.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return q_taken - baseline, baseline


def epsilon_floored_policy(
    logits: torch.Tensor, epsilon: float, action_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """pi = (1 - eps) softmax(logits) + eps / |available actions|: the paper's exploration floor.

    Unavailable actions (action_mask == 0) get probability exactly 0.
    """
    if action_mask is None:
        action_mask = torch.ones_like(logits)
    mask = action_mask.to(logits.dtype)
    masked_logits = logits.masked_fill(mask == 0, float("-inf"))
    soft = torch.softmax(masked_logits, dim=-1)
    n_available = mask.sum(dim=-1, keepdim=True)
    return (1.0 - epsilon) * soft + epsilon * mask / n_available


def td_lambda_targets(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    mask: torch.Tensor,
    target_values: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """TD(lambda) targets G_t for t < T by the backward recursion (the form PyMARL uses).

    rewards, terminated, mask: (B, T[, A]); target_values: (B, T+1[, A]), the target network's value of
    each step including the one after the last transition. G_T = Q'_T (1 - any terminated);
    G_t = lam gamma G_{t+1} + mask_t (r_t + (1 - lam) gamma Q'_{t+1} (1 - terminated_t)).
    Returns (B, T[, A]).
    """
    steps = rewards.shape[1]
    if target_values.shape[1] != steps + 1:
        raise ValueError(f"target_values need T+1 = {steps + 1} steps, got {target_values.shape[1]}")
    ever_terminated = terminated.sum(dim=1).clamp(max=1.0)
    ret = torch.zeros_like(target_values)
    ret[:, steps] = target_values[:, steps] * (1.0 - ever_terminated)
    for t in range(steps - 1, -1, -1):
        ret[:, t] = lam * gamma * ret[:, t + 1] + mask[:, t] * (
            rewards[:, t] + (1.0 - lam) * gamma * target_values[:, t + 1] * (1.0 - terminated[:, t])
        )
    return ret[:, :steps]


def n_step_targets(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    mask: torch.Tensor,
    target_values: torch.Tensor,
    gamma: float,
    n: int,
) -> torch.Tensor:
    """n-step targets sum_{k<n} gamma^k r_{t+k} + gamma^n Q'_{t+n}, cut at the end of the episode.

    Same shapes as ``td_lambda_targets``. A step is counted while ``mask`` is 1; the bootstrap is
    dropped once the episode has terminated (not when it was only truncated).
    """
    if n < 1:
        raise ValueError(f"n-step targets need n >= 1, got {n}")
    steps = rewards.shape[1]
    if target_values.shape[1] != steps + 1:
        raise ValueError(f"target_values need T+1 = {steps + 1} steps, got {target_values.shape[1]}")
    # alive[:, k] = 1 while no termination happened in transitions < k (k = 0..T).
    not_done = 1.0 - terminated
    alive = torch.cat([torch.ones_like(not_done[:, :1]), torch.cumprod(not_done, dim=1)], dim=1)
    out = torch.zeros_like(rewards)
    for t in range(steps):
        horizon = min(n, steps - t)
        acc = torch.zeros_like(rewards[:, t])
        for k in range(horizon):
            acc = acc + (gamma**k) * rewards[:, t + k] * mask[:, t + k]
        acc = acc + (gamma**horizon) * target_values[:, t + horizon] * alive[:, t + horizon] * mask[:, t + horizon - 1]
        out[:, t] = acc * mask[:, t]
    return out
