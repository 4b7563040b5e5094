"""Value normalisation (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative
Multi-Agent Games", arXiv 2103.01955, section 4.1 and their ValueNorm).

The critic learns normalised returns; its outputs are de-normalised before they enter GAE. The
statistics are debiased exponential running moments of the returns seen:

    m  <- b m  + (1 - b) mean(R)        s <- b s + (1 - b) mean(R^2)        d <- b d + (1 - b)
    mu = m / d,   var = max(s / d - mu^2, 1e-2),   normalise(x) = (x - mu) / sqrt(var)

with b = ``beta`` (0.99999 in their code, per update). Each worker keeps its own statistics: they
are updated from the returns of its own rollouts and are part of the worker's state (so a sim
checkpoint resumes them exactly), not of the shared parameters the server holds.

``RunningMeanStd`` is the other running statistic: the count-weighted mean and variance of every
value seen so far (no forgetting), merged batch by batch with Chan et al.'s parallel rule

    n' = n + m,   mu' = mu + d m / n',   var' = (var n + var_b m + d^2 n m / n') / n'

(d = mean_b - mu; m, mean_b, var_b: the batch's count, mean and population variance), starting from
mean 0, variance 1 and a count of 1e-4, as OpenAI Baselines' and EPyMARL's ``RunningMeanStd``. The
Q-learners' ``algorithm.standardise_rewards`` divides the replayed rewards by it (docs/value_based.md).
"""
from __future__ import annotations

import numpy as np


class ValueNorm:
    """Debiased running mean and variance of the value targets (float64)."""

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5, min_var: float = 1e-2) -> None:
        if not 0.0 < beta < 1.0:
            raise ValueError(f"value_norm_beta: must lie in (0, 1), got {beta}")
        self.beta, self.epsilon, self.min_var = float(beta), float(epsilon), float(min_var)
        self.mean = 0.0
        self.mean_sq = 0.0
        self.debias = 0.0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.size == 0:
            return
        b = self.beta
        self.mean = b * self.mean + (1.0 - b) * float(x.mean())
        self.mean_sq = b * self.mean_sq + (1.0 - b) * float((x * x).mean())
        self.debias = b * self.debias + (1.0 - b)

    def mean_var(self) -> tuple[float, float]:
        d = max(self.debias, self.epsilon)
        mu = self.mean / d
        return mu, max(self.mean_sq / d - mu * mu, self.min_var)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        mu, var = self.mean_var()
        return (np.asarray(x, dtype=np.float64) - mu) / np.sqrt(var)

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        mu, var = self.mean_var()
        return np.asarray(x, dtype=np.float64) * np.sqrt(var) + mu


class RunningMeanStd:
    """Running mean and population variance of all values seen (float64), merged per batch."""

    def __init__(self, epsilon: float = 1e-4) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, float(epsilon)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.size == 0:
            return
        m, mean_b, var_b = float(x.size), float(x.mean()), float(x.var())
        total = self.count + m
        delta = mean_b - self.mean
        self.mean = self.mean + delta * m / total
        self.var = (self.var * self.count + var_b * m + delta * delta * self.count * m / total) / total
        self.count = total

    def standardise(self, x: np.ndarray) -> np.ndarray:
        """(x - mean) / std as float32 (a zero variance: divided by 1)."""
        std = np.sqrt(self.var) if self.var > 0 else 1.0
        return ((np.asarray(x, dtype=np.float64) - self.mean) / std).astype(np.float32)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"mean": np.array(self.mean), "var": np.array(self.var), "count": np.array(self.count)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        missing = sorted({"mean", "var", "count"} - set(state))
        if missing:
            raise ValueError(f"RunningMeanStd state lacks {missing}")
        self.mean, self.var, self.count = (float(state[k]) for k in ("mean", "var", "count"))
