"""Action distributions of the actor-critic family: what a policy head's output means.

A head maps features to one output vector per row; the distribution turns it into actions,
log-probabilities and entropies. The loss (agents/actor_critic.py) sees only those, so a discrete
and a continuous policy share it.

- ``Categorical(n)``: the head outputs ``n`` logits. An optional availability mask (1 = allowed)
  sets the logits of unavailable actions to a large negative number, in sampling and in the loss
  alike, so a padded or illegal action is never drawn and carries no gradient.
- ``DiagGaussian(low, high)``: the head outputs the mean; the log standard deviation is a
  state-independent trainable vector (``LogStd``, CleanRL's and SB3's choice), initialised to
  ``init_log_std``. Samples are taken unbounded (the log-probability is of the unbounded sample);
  the environment receives them clipped to ``[low, high]`` (``to_env``).

Sampling uses the worker's seeded numpy generator, so sim reruns stay byte-identical.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from agents.losses import categorical
from marl_q.protocol import gumbel_max

MASKED_LOGIT = -1e9


def masked_logits(logits: torch.Tensor, avail: Optional[torch.Tensor]) -> torch.Tensor:
    return logits if avail is None else logits.masked_fill(avail <= 0, MASKED_LOGIT)


def masked_logits_np(logits: np.ndarray, avail: Optional[np.ndarray]) -> np.ndarray:
    """``masked_logits`` on numpy arrays, in the logits' dtype."""
    return logits if avail is None else np.where(avail > 0, logits, MASKED_LOGIT)


class Categorical:
    """Softmax over logits, optionally masked by availability."""

    continuous = False

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def action_shape(self) -> tuple[int, ...]:
        return ()

    def action_dtype(self) -> type:
        return np.int64

    def sample(self, out: np.ndarray, rng: np.random.Generator, avail: Optional[np.ndarray] = None) -> np.ndarray:
        """Gumbel-max draws per row (marl_q.protocol.gumbel_max, the draws of every discrete policy)."""
        return gumbel_max(masked_logits_np(out, avail), rng)

    def mode(self, out: np.ndarray, avail: Optional[np.ndarray] = None) -> np.ndarray:
        return np.argmax(masked_logits_np(out, avail), axis=1)

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor,
                         avail: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        return categorical(masked_logits(out, avail), actions.long(), True)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions


class LogStd(nn.Module):
    """A policy head followed by a trainable, state-independent log standard deviation: the module's
    output is ``[mean | log_std]`` per row, so it stays one ``features -> outputs`` head."""

    def __init__(self, mean_head: nn.Module, act_dim: int, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.mean = mean_head
        self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = self.mean(x)
        return torch.cat([mu, self.log_std.expand_as(mu)], dim=-1)


class DiagGaussian:
    """A diagonal Gaussian with mean and log-std from a ``LogStd`` head; actions clipped for the env."""

    continuous = True

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low = np.asarray(low, dtype=np.float32).reshape(-1)
        self.high = np.asarray(high, dtype=np.float32).reshape(-1)
        self.dim = self.low.size

    def action_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    def action_dtype(self) -> type:
        return np.float32

    def _split(self, out):
        return out[:, : self.dim], out[:, self.dim:]

    def sample(self, out: np.ndarray, rng: np.random.Generator, avail: Optional[np.ndarray] = None) -> np.ndarray:
        mu, log_std = self._split(out)
        return (mu + np.exp(log_std) * rng.standard_normal(mu.shape)).astype(np.float32)

    def mode(self, out: np.ndarray, avail: Optional[np.ndarray] = None) -> np.ndarray:
        return self._split(out)[0].astype(np.float32)

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor,
                         avail: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self._split(out)
        z = (actions - mu) * torch.exp(-log_std)
        logp = (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
        return logp, entropy

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(actions, self.low, self.high)


Distribution = Union[Categorical, DiagGaussian]


def distribution_for(space) -> Distribution:
    """The distribution of a Gymnasium action space: Discrete -> Categorical, 1-D Box -> DiagGaussian."""
    if hasattr(space, "n"):
        return Categorical(int(space.n))
    shape = getattr(space, "shape", None)
    if shape is not None and len(shape) == 1:
        return DiagGaussian(space.low, space.high)
    raise ValueError(f"no policy distribution for the action space {space} (Discrete or a 1-D Box)")


def head_out_dim(dist: Distribution) -> int:
    """How many outputs the policy head itself produces (logits, or the Gaussian's mean)."""
    return dist.n if isinstance(dist, Categorical) else dist.dim
