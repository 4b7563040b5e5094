"""The actor-critic loss, written once: PPO's clipped objective, of which A2C is the one-pass case.

Per sample i (optionally weighted by a mask m_i, e.g. a multi-agent run's alive agents):

    r_i  = exp(logp_i - old_logp_i)                     (no clip: A2C's  -A_i logp_i  instead)
    L_pi = -mean(min(r_i A_i, clip(r_i, 1-e, 1+e) A_i))
    L_v  = mean((V_i - R_i)^2)                          (value_clip: PPO's max with the clipped V)
    L    = L_pi - ent_coef mean(H_i) + vf_coef L_v      (A_i normalised first when adv_norm)

The policy enters only through per-sample log-probabilities and entropies, so the distribution is
a separate piece: ``categorical`` for discrete actions today; a Gaussian head for continuous actions
supplies its own ``(logp, entropy)`` and calls the same ``actor_critic_loss``, as does a centralised
critic V(s) (it only changes where ``values`` come from).

``loss_grad`` is the numpy twin of ``categorical`` + ``actor_critic_loss``, written out by hand for the
numpy passes of the ``mlp`` heads (``algorithm.fast_path``, agents.numpy_heads): the one-step A2C update
and PPO's epochs; tests/agents/test_losses.py checks it against torch autograd.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol

import numpy as np
import torch

from marl_q.metrics import DIAGNOSTICS


class LossKnobs(Protocol):
    """The config fields the loss reads (``ActorCriticConfig`` and its subclasses have them)."""

    clip: Optional[float]  # PPO's ratio clip; None = A2C's plain policy gradient
    value_clip: Optional[float]
    ent_coef: float
    vf_coef: float
    adv_norm: bool


# ----------------------------------------------------------------------------- the distribution
def categorical(logits: torch.Tensor, actions: torch.Tensor, entropy: bool = True
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-sample log pi(a) and entropy of softmax(logits) (the entropy only when asked)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, actions[:, None]).squeeze(1)
    return logp, (-(logp_all.exp() * logp_all).sum(-1) if entropy else None)


# ----------------------------------------------------------------------------- the loss
def masked_mean(x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """mean(x), or the mask-weighted mean sum(m x) / sum(m)."""
    return x.mean() if mask is None else (x * mask).sum() / mask.sum()


def normalize_advantages(adv: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(A - mean A) / (std A + 1e-8) with the unbiased std, over the (masked) samples; fewer than two
    samples are left as they are."""
    if mask is None:
        return adv if len(adv) <= 1 else (adv - adv.mean()) / (adv.std() + 1e-8)
    count = mask.sum()
    if float(count) <= 1:
        return adv
    mean = masked_mean(adv, mask)
    std = (((adv - mean) ** 2 * mask).sum() / (count - 1)).sqrt()
    return (adv - mean) / (std + 1e-8)


def policy_loss(logp: torch.Tensor, old_logp: Optional[torch.Tensor], adv: torch.Tensor, clip: Optional[float],
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """-E[min(r A, clip(r) A)] with r = pi/pi_old; without a clip, A2C's -E[A log pi]."""
    if clip is None:
        return -masked_mean(adv * logp, mask)
    ratio = torch.exp(logp - old_logp)
    return -masked_mean(torch.min(ratio * adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv), mask)


def value_loss(values: torch.Tensor, old_values: Optional[torch.Tensor], returns: torch.Tensor,
               value_clip: Optional[float], mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """E[(V - R)^2], or PPO's clipped form max((V-R)^2, (V_old + clip(V - V_old) - R)^2)."""
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return masked_mean(unclipped, mask)
    clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    return masked_mean(torch.max(unclipped, (clipped - returns) ** 2), mask)


class LossTerms(NamedTuple):
    loss: torch.Tensor  # the scalar to descend
    policy: torch.Tensor
    value: torch.Tensor
    entropy: Optional[torch.Tensor]  # mean entropy, None when none was given


def actor_critic_loss(knobs: LossKnobs, logp: torch.Tensor, adv: torch.Tensor, values: torch.Tensor,
                      returns: torch.Tensor, *, old_logp: Optional[torch.Tensor] = None,
                      old_values: Optional[torch.Tensor] = None, entropy: Optional[torch.Tensor] = None,
                      mask: Optional[torch.Tensor] = None) -> LossTerms:
    """The A2C/PPO loss over a batch of samples, all tensors of shape (B,).

    ``logp``/``values``: log pi(a) and V at the current parameters (with their graph); ``old_logp``
    (needed with ``knobs.clip``) and ``old_values`` (with ``knobs.value_clip``): the same at the
    rollout's parameters; ``adv``/``returns``: advantages and value targets (no graph);
    ``entropy``: per-sample entropies (None skips the bonus, as ent_coef 0 would); ``mask``: per-sample
    weights (1 = counts, 0 = padding, e.g. a dead agent), None = every sample counts.
    """
    if knobs.adv_norm:
        adv = normalize_advantages(adv, mask)
    pi = policy_loss(logp, old_logp, adv, knobs.clip, mask)
    ent = None if entropy is None else masked_mean(entropy, mask)
    v = value_loss(values, old_values, returns, knobs.value_clip, mask)
    loss = pi if ent is None else pi - knobs.ent_coef * ent
    return LossTerms(loss + knobs.vf_coef * v, pi, v, ent)


# ----------------------------------------------------------------------------- diagnostics
# What train.csv records per update (marl_q.metrics.DIAGNOSTICS), as CleanRL logs them. Computed from
# tensors the update has already computed, without a graph and without random draws, so that logging
# them leaves training bit for bit as it was.
@torch.no_grad()
def ratio_stats(logp: torch.Tensor, old_logp: torch.Tensor, clip: Optional[float],
                mask: Optional[torch.Tensor] = None) -> dict[str, float]:
    """For logging: approx_kl (Schulman's (r - 1) - log r estimator) and the clipped fraction."""
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    out = {"approx_kl": float(masked_mean((ratio - 1.0) - log_ratio, mask))}
    if clip is not None:
        out["clipfrac"] = float(masked_mean(((ratio - 1.0).abs() > clip).to(logp.dtype), mask))
    return out


def explained_variance(values: np.ndarray, returns: np.ndarray) -> Optional[float]:
    """1 - Var[R - V] / Var[R] over the samples (population variances, CleanRL's): 1 for a critic that
    predicts every return, 0 for one no better than their mean; None when Var[R] = 0 (one sample, say)."""
    returns = np.asarray(returns, dtype=np.float64).reshape(-1)
    if returns.size < 2:  # (a one-step update's: cheap to say, and said often)
        return None
    dev = returns - returns.mean()
    err = returns - np.asarray(values, dtype=np.float64).reshape(-1)
    err -= err.mean()
    var_y = float(dev @ dev)  # n Var[R]; the n's cancel
    return None if var_y == 0.0 else float(1.0 - (err @ err) / var_y)


def diagnostics(policy_loss: Any, value_loss: Any, entropy: Any = None, approx_kl: Any = None, clipfrac: Any = None,
                explained_var: Optional[float] = None) -> dict[str, Optional[float]]:
    """One update's train.csv diagnostics (scalars or 0-d tensors) as floats; None leaves its cell empty."""
    values = [policy_loss, value_loss, entropy, approx_kl, clipfrac, explained_var]
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            values[i] = float(v.detach())
        elif v is not None:
            values[i] = float(v)
    return dict(zip(DIAGNOSTICS, values))


# ----------------------------------------------------------------------------- the numpy twin
def loss_grad(knobs: LossKnobs, logits: np.ndarray, actions: np.ndarray, adv: np.ndarray, values: np.ndarray,
              returns: np.ndarray, terms: Optional[dict] = None, *, old_logp: Optional[np.ndarray] = None,
              old_values: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """d L / d logits (B, A) and d L / d values (B,) of ``actor_critic_loss`` on ``categorical(logits)``,
    without a mask, in numpy at the inputs' dtype (the one-step A2C path: float64; PPO's epochs on the
    ``mlp`` heads: float32). With p = softmax(logits), H its entropy, r = exp(log p(a) - old_logp) and
    k = 1 where the clipped objective's gradient passes (r inside [1 - e, 1 + e], or r A below clip(r) A):

        dL/dz = (k r A / B) (p - onehot(a)) + (ent_coef / B) p (log p + H)     (no clip: r k = 1)
        dL/dV = (2 vf_coef / B) (V - R), or with value_clip (V_old + clip(V - V_old) - R) where that
                branch is the larger and V - V_old lies inside the clip (0 where it lies outside).

    ``terms``, when given, receives the loss's terms for logging (``policy``, ``value``, ``entropy``:
    LossTerms' fields as floats) and with a clip ``ratio_stats``' ``approx_kl`` and ``clipfrac``,
    computed beside the gradient without changing it.
    """
    count = len(actions)
    if knobs.adv_norm and count > 1:
        adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    logp = log_softmax(logits)
    p = np.exp(logp)
    onehot = np.zeros_like(p)
    rows = np.arange(count)
    onehot[rows, actions] = 1.0
    if knobs.clip is None:
        grad_logits = (adv / count)[:, None] * (p - onehot)
    else:
        log_ratio = logp[rows, actions] - old_logp
        ratio = np.exp(log_ratio)
        clipped = np.clip(ratio, 1.0 - knobs.clip, 1.0 + knobs.clip)
        passes = (ratio * adv <= clipped * adv) | (ratio == clipped)
        grad_logits = (np.where(passes, ratio * adv, 0.0) / count)[:, None] * (p - onehot)
    entropy = None
    if knobs.ent_coef != 0.0:
        entropy = -_row_sum(p * logp)
        grad_logits += (knobs.ent_coef / count) * p * (logp + entropy)
    error = values - returns
    if knobs.value_clip is None:
        grad_values = (2.0 * knobs.vf_coef / count) * error
    else:
        delta = values - old_values
        clipped_error = old_values + np.clip(delta, -knobs.value_clip, knobs.value_clip) - returns
        larger = clipped_error * clipped_error > error * error
        grad_values = (2.0 * knobs.vf_coef / count) * np.where(
            larger, np.where(np.abs(delta) <= knobs.value_clip, clipped_error, 0.0), error)
    if terms is not None:  # (dot products: a one-step update's arrays are tiny, numpy's calls are not)
        if knobs.clip is None:
            terms["policy"] = -float(np.dot(adv, logp[rows, actions])) / count
        else:
            terms["policy"] = -float(np.minimum(ratio * adv, clipped * adv).sum()) / count
            terms["approx_kl"] = float(((ratio - 1.0) - log_ratio).sum()) / count
            terms["clipfrac"] = float(np.count_nonzero(np.abs(ratio - 1.0) > knobs.clip)) / count
        terms["value"] = (float(np.dot(error, error)) if knobs.value_clip is None else
                          float(np.maximum(error * error, clipped_error * clipped_error).sum())) / count
        terms["entropy"] = float(-np.vdot(p, logp) if entropy is None else entropy.sum()) / count
    return grad_logits, grad_values


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over each row (B, A), shifted by the row's maximum, in the logits' dtype."""
    z = logits - _row_max(logits)
    return z - np.log(_row_sum(np.exp(z)))


def _row_max(x: np.ndarray) -> np.ndarray:
    """x.max(axis=1, keepdims=True), exactly; for a few columns as a running maximum over them, 6x as fast
    as numpy's reduction along a short axis (37 us for (1200, 5))."""
    if x.shape[1] > 8:
        return x.max(axis=1, keepdims=True)
    out = x[:, :1].copy()
    for j in range(1, x.shape[1]):
        np.maximum(out, x[:, j:j + 1], out=out)
    return out


def _row_sum(x: np.ndarray) -> np.ndarray:
    """x.sum(axis=1, keepdims=True); float32 (PPO's epochs) as a product with ones, 6x as fast for a few
    columns, float64 as numpy's sum, the one-step path's bits."""
    if x.dtype == np.float64:
        return x.sum(axis=1, keepdims=True)
    return (x @ np.ones(x.shape[1], x.dtype))[:, None]
