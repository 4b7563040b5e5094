"""LSVI-UCB in sufficient-statistics form, and the two communication triggers of the LSVI family.

For a finite linear MDP the regression of LSVI-UCB (Jin, Yang, Wang, Jordan, COLT 2020) needs, per
step h, only Lambda_h = lam I + sum phi phi^T, c_h = sum phi r and B_h = sum phi e_{s'}^T, because
sum phi (r + V(s')) = c_h + B_h V. Lambda_h^-1 is kept by Sherman-Morrison rank-one updates and
log det Lambda_h by the matrix determinant lemma, so adding data and re-planning cost
O(H (d^2 + d S + S A d)) whatever the amount of data seen (docs/lsvi.md, "Cost").
Steps are indexed h = 0..H-1 here. Pure numpy: no runtime, no environment.
"""
from __future__ import annotations

import math

import numpy as np


class LsviStatistics:
    """Per-step regression statistics: Gram matrices, their inverses and log-dets, c_h and B_h.

    Shapes: ``gram`` / ``gram_inv`` (H, d, d), ``logdet`` (H,), ``reward_sums`` c (H, d),
    ``next_state_sums`` B (H, d, S).
    """

    def __init__(self, horizon: int, d: int, n_states: int, lam: float) -> None:
        if not lam > 0:
            raise ValueError(f"algorithm.lam must be > 0, got {lam!r}")
        self.lam = float(lam)
        self.gram = np.repeat(np.eye(d)[None] * lam, horizon, axis=0)
        self.gram_inv = np.repeat(np.eye(d)[None] / lam, horizon, axis=0)
        self.logdet = np.full(horizon, d * math.log(lam))
        self.reward_sums = np.zeros((horizon, d))
        self.next_state_sums = np.zeros((horizon, d, n_states))

    @classmethod
    def from_sums(cls, gram: np.ndarray, reward_sums: np.ndarray, next_state_sums: np.ndarray,
                  lam: float) -> "LsviStatistics":
        """Statistics from downloaded sums (gram already includes lam I); inverse and log-det recomputed."""
        horizon, d, n_states = next_state_sums.shape
        stats = cls(horizon, d, n_states, lam)
        stats.gram = np.array(gram, dtype=float)
        stats.gram_inv = np.linalg.inv(stats.gram)
        sign, logdet = np.linalg.slogdet(stats.gram)
        assert np.all(sign > 0), "a Gram matrix lam I + sum phi phi^T must be positive definite"
        stats.logdet = logdet
        stats.reward_sums = np.array(reward_sums, dtype=float)
        stats.next_state_sums = np.array(next_state_sums, dtype=float)
        return stats

    def copy(self) -> "LsviStatistics":
        """An independent copy (all arrays duplicated)."""
        twin = object.__new__(LsviStatistics)
        twin.lam = self.lam
        for key in ("gram", "gram_inv", "logdet", "reward_sums", "next_state_sums"):
            setattr(twin, key, getattr(self, key).copy())
        return twin

    def add_episode(self, features: np.ndarray, rewards: np.ndarray, next_states: np.ndarray) -> None:
        """Add one transition per step h (row h of ``features`` (H, d), ``rewards`` (H,), ``next_states`` (H,))."""
        # Sherman-Morrison: (A + x x^T)^-1 = A^-1 - A^-1 x x^T A^-1 / (1 + x^T A^-1 x);
        # determinant lemma: log det(A + x x^T) = log det A + log(1 + x^T A^-1 x). One x per step h.
        projected = np.einsum("hij,hj->hi", self.gram_inv, features)
        quad = np.einsum("hi,hi->h", features, projected)
        self.gram_inv -= projected[:, :, None] * projected[:, None, :] / (1.0 + quad)[:, None, None]
        self.logdet += np.log1p(quad)
        self.gram += features[:, :, None] * features[:, None, :]
        self.reward_sums += features * rewards[:, None]
        self.next_state_sums[np.arange(len(next_states)), :, next_states] += features


def lsvi_beta(d: int, horizon: int, total_episodes: int, beta_scale: float, delta: float = 0.05) -> float:
    """Bonus scale beta = beta_scale * d H sqrt(log(2 d H K / delta)) (Jin et al. 2020 with c = beta_scale)."""
    if beta_scale < 0:
        raise ValueError(f"algorithm.beta_scale must be >= 0, got {beta_scale!r}")
    return beta_scale * d * horizon * math.sqrt(math.log(2.0 * d * horizon * max(total_episodes, 1) / delta))


def plan_optimistic(features: np.ndarray, gram_inv: np.ndarray, reward_sums: np.ndarray,
                    next_state_sums: np.ndarray, beta: float) -> np.ndarray:
    """Optimistic Q (H, S, A) of LSVI-UCB by backward induction over the sufficient statistics.

    features: phi (S, A, d). For h = H-1..0: w_h = Lambda_h^-1 (c_h + B_h V_{h+1}),
    Q_h = min(phi w_h + beta sqrt(phi^T Lambda_h^-1 phi), H), V_h = max_a Q_h, V_H = 0.
    """
    n_states, n_actions, d = features.shape
    horizon = gram_inv.shape[0]
    flat = features.reshape(n_states * n_actions, d)
    projected = np.tensordot(gram_inv, flat, axes=([1], [1]))  # (H, d, S*A): Lambda^-1 phi (symmetric)
    widths = np.sqrt(np.maximum((projected * flat.T).sum(axis=1), 0.0))  # (H, S*A)
    q_values = np.empty((horizon, n_states, n_actions))
    next_values = np.zeros(n_states)
    for h in range(horizon - 1, -1, -1):
        weights = gram_inv[h] @ (reward_sums[h] + next_state_sums[h] @ next_values)
        q_h = np.minimum(flat @ weights + beta * widths[h], float(horizon)).reshape(n_states, n_actions)
        q_values[h] = q_h
        next_values = q_h.max(axis=1)
    return q_values


def determinant_trigger(logdet_with_local: np.ndarray, logdet_server: np.ndarray, alpha: float) -> bool:
    """Async-Coop-LSVI upload rule: some h has det(Lambda_ser + Lambda_loc) > (1 + alpha) det(Lambda_ser)."""
    return bool(np.any(logdet_with_local - logdet_server > math.log1p(alpha)))


def sync_condition(episodes_since_sync: int, logdet_now: np.ndarray, logdet_at_sync: np.ndarray,
                   threshold: float) -> bool:
    """Coop-LSVI (Dubey & Pentland 2021) rule: some h has (k - k_last) log(det Lambda_now / det Lambda_last) > S."""
    return bool(np.any(episodes_since_sync * (logdet_now - logdet_at_sync) > threshold))
