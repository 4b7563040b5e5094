"""The math of value-based learners: masked greedy actions, (Double) DQN targets, TD losses, the VDN and
QMIX mixers and exploration schedules, as pure functions and small torch modules.

Conventions (docs/value_based.md derives each piece).
- Q-values are (..., A), actions on the last axis; ``avail`` (..., A) is nonzero on legal actions (the
  env's action mask), None when all are legal. Multi-agent Qs are (B, n_agents, A).
- A replayed batch (agents/replay.py) gives ``reward`` (B[, n_agents]), ``discount`` gamma^k and
  ``terminated`` (B,): the target is y = r + gamma^k (1 - terminated) V(s'), V(s') the bootstrap value.
- Targets are computed under ``torch.no_grad()``: gradients flow only through Q_online(s, a)
  (Mnih et al. 2015). Where terminated is 1 the bootstrap value is multiplied by 0, so those rows may
  have no legal action at s' (a finished episode's last mask); any other row without a legal action
  raises, since a greedy action there does not exist.
- IQL applies the target to each agent's Q; VDN and QMIX mix the agents' chosen Qs into Q_tot with
  the online mixer and the agents' bootstrap values into V_tot(s') with the target mixer.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agents.losses import masked_mean
from agents.numpy_heads import TorchMLP

Array = TypeVar("Array", np.ndarray, torch.Tensor)


# ----------------------------------------------------------------------------- masked greedy actions
def _legal(q: Array, avail: Optional[Array]) -> Optional[Array]:
    if avail is None:
        return None
    if tuple(avail.shape) != tuple(q.shape):
        raise ValueError(f"avail {tuple(avail.shape)} must have the Q-values' shape {tuple(q.shape)}")
    legal = avail != 0
    any_legal = legal.any(-1)
    if not bool(any_legal.all()):
        rows = np.argwhere(~(any_legal.cpu().numpy() if isinstance(any_legal, torch.Tensor) else any_legal))
        raise ValueError(f"no legal action in {len(rows)} row(s), the first at index {tuple(rows[0].tolist())}")
    return legal


def masked_max(q: Array, avail: Optional[Array] = None) -> Array:
    """max over legal actions of the last axis (numpy or torch); a row with no legal action raises."""
    legal = _legal(q, avail)
    if isinstance(q, torch.Tensor):
        return (q if legal is None else q.masked_fill(~legal, -math.inf)).amax(-1)
    return (q if legal is None else np.where(legal, q, -np.inf)).max(-1)


def masked_argmax(q: Array, avail: Optional[Array] = None) -> Array:
    """argmax over legal actions of the last axis (numpy or torch; ties: the first); a row with no legal
    action raises. Q-values of -inf or NaN on legal actions are the caller's to avoid."""
    legal = _legal(q, avail)
    if isinstance(q, torch.Tensor):
        return (q if legal is None else q.masked_fill(~legal, -math.inf)).argmax(-1)
    return (q if legal is None else np.where(legal, q, -np.inf)).argmax(-1)


def epsilon_greedy(q: np.ndarray, avail: Optional[np.ndarray], epsilon: float, rng: np.random.Generator
                   ) -> np.ndarray:
    """epsilon-greedy actions over the last axis: with probability epsilon a uniform legal action, else
    the masked argmax. Draws, in order: one U[0,1) per row (explore?), one per action (the random pick)."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon!r}")
    greedy = masked_argmax(q, avail)
    explore = rng.random(q.shape[:-1]) < epsilon
    scores = rng.random(q.shape)
    if avail is not None:
        scores = np.where(avail != 0, scores, -1.0)
    return np.where(explore, scores.argmax(-1), greedy)


# ----------------------------------------------------------------------------- targets
def _broadcast_to_rows(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """x (B,) viewed as (B, 1, ...) to broadcast against ``like`` (B, ...)."""
    return x.reshape(*x.shape, *(1,) * (like.ndim - x.ndim))


def bootstrap_values(q_target_next: torch.Tensor, avail_next: Optional[torch.Tensor] = None,
                     q_online_next: Optional[torch.Tensor] = None, terminated: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
    """V(s') (...,): max_a Q_target(s', a) over legal a (DQN), or with ``q_online_next``
    Q_target(s', argmax_a Q_online(s', a)) (Double DQN, van Hasselt et al. 2016). Rows where
    ``terminated`` (B,) is set count every action legal (their value is multiplied by 0 later)."""
    with torch.no_grad():
        if avail_next is not None and terminated is not None:
            avail_next = (avail_next != 0) | _broadcast_to_rows(terminated != 0, avail_next)
        if q_online_next is None:
            return masked_max(q_target_next, avail_next)
        if q_online_next.shape != q_target_next.shape:
            raise ValueError(f"online {tuple(q_online_next.shape)} and target {tuple(q_target_next.shape)} Qs differ")
        best = masked_argmax(q_online_next, avail_next)
        return q_target_next.gather(-1, best.unsqueeze(-1)).squeeze(-1)


def td_target(reward: torch.Tensor, discount: torch.Tensor, terminated: torch.Tensor, next_value: torch.Tensor
              ) -> torch.Tensor:
    """y = r + gamma^k (1 - terminated) V(s'), detached; discount and terminated (B,) broadcast over the
    trailing axes of next_value (e.g. agents)."""
    with torch.no_grad():
        keep = _broadcast_to_rows(discount * (1.0 - terminated.to(next_value.dtype)), next_value)
        reward = _broadcast_to_rows(reward, next_value) if reward.ndim < next_value.ndim else reward
        return reward + keep * next_value


def dqn_target(reward: torch.Tensor, discount: torch.Tensor, terminated: torch.Tensor,
               q_target_next: torch.Tensor, avail_next: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DQN's y = r + gamma^k (1 - done) max_a Q_target(s', a), over legal a (Mnih et al. 2015)."""
    return td_target(reward, discount, terminated, bootstrap_values(q_target_next, avail_next, None, terminated))


def double_dqn_target(reward: torch.Tensor, discount: torch.Tensor, terminated: torch.Tensor,
                      q_online_next: torch.Tensor, q_target_next: torch.Tensor,
                      avail_next: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Double DQN's y = r + gamma^k (1 - done) Q_target(s', argmax_a Q_online(s', a)), over legal a."""
    values = bootstrap_values(q_target_next, avail_next, q_online_next, terminated)
    return td_target(reward, discount, terminated, values)


def q_taken(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Q(s, a) of the actions taken: q (..., A), actions (...) integer."""
    return q.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------- losses
def td_loss(q_pred: torch.Tensor, target: torch.Tensor, weights: Optional[torch.Tensor] = None,
            loss: Literal["huber", "mse"] = "huber", huber_delta: float = 1.0, mask: Optional[torch.Tensor] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The DQN loss mean_i w_i l(y_i - Q_i) and the detached TD errors delta = y - Q (PER's priorities).

    l is Huber (0.5 d^2 for |d| <= delta, delta (|d| - delta/2) beyond; DQN's error clipping, SB3's
    smooth_l1 at delta 1) or the square d^2. ``weights`` are PER's importance weights (B,) (broadcast
    over trailing axes); ``mask`` (same shape as q_pred) averages over the real steps of padded episodes."""
    if q_pred.shape != target.shape:
        raise ValueError(f"q_pred {tuple(q_pred.shape)} and target {tuple(target.shape)} differ in shape")
    if loss == "huber":
        per = F.huber_loss(q_pred, target, reduction="none", delta=huber_delta)
    elif loss == "mse":
        per = F.mse_loss(q_pred, target, reduction="none")
    else:
        raise ValueError(f"algorithm.loss must be 'huber' or 'mse', got {loss!r}")
    if weights is not None:
        per = per * _broadcast_to_rows(weights.to(per.dtype), per)
    return masked_mean(per, mask), (target - q_pred).detach()


def td_loss_grad(q_pred: torch.Tensor, target: torch.Tensor, weights: Optional[torch.Tensor] = None,
                 loss: Literal["huber", "mse"] = "huber", huber_delta: float = 1.0) -> torch.Tensor:
    """d ``td_loss`` / d q_pred (no mask) as autograd forms it, op for op: the mean's 1/B, the weights'
    product, then huber_loss_backward / mse_loss_backward; for a pass without autograd
    (``numpy_heads.TorchMLP``)."""
    grad = torch.ones_like(q_pred).div_(q_pred.numel())
    if weights is not None:
        grad = grad * _broadcast_to_rows(weights.to(q_pred.dtype), q_pred)
    if loss == "huber":
        return torch.ops.aten.huber_loss_backward(grad, q_pred, target, 0, huber_delta)
    return torch.ops.aten.mse_loss_backward(grad, q_pred, target, 0)


# ----------------------------------------------------------------------------- mixers
class VDNMixer(nn.Module):
    """VDN (Sunehag et al. 2017): Q_tot(s, u) = sum_a Q_a(o_a, u_a); no parameters, the state unused."""

    def forward(self, agent_qs: torch.Tensor, state: Optional[torch.Tensor] = None) -> torch.Tensor:
        """agent_qs (..., n_agents) -> (...)."""
        return agent_qs.sum(-1)

    @torch.no_grad()
    def forward_cached(self, agent_qs: torch.Tensor, state: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, Any]:
        """``forward`` without autograd, and what ``backward`` needs."""
        return agent_qs.sum(-1), agent_qs.shape

    @torch.no_grad()
    def backward(self, cache: Any, grad: torch.Tensor) -> torch.Tensor:
        """d loss / d agent_qs from d loss / d Q_tot: autograd's sum backward (the gradient expanded)."""
        return grad.unsqueeze(-1).expand(cache)


class QMixer(nn.Module):
    """QMIX's monotonic mixer (Rashid et al. 2018): Q_tot = w2(s)^T ELU(W1(s)^T q + b1(s)) + V(s).

    Hypernetworks of the global state s produce W1 (n_agents x embed) and w2 (embed,), passed through
    abs() so every weight is >= 0; ELU is increasing, so dQ_tot/dQ_a >= 0 for every agent a (the
    monotonicity that makes each agent's argmax the joint argmax). b1(s) is one linear layer, the
    final bias V(s) a 2-layer hypernet with ReLU. ``hypernet_layers`` 1 is the paper's single linear
    hypernet for W1 and w2; 2 (Linear, ReLU, Linear with ``hypernet_embed`` units) is PyMARL's and
    EPyMARL's default, as is embed_dim 32.
    """

    def __init__(self, n_agents: int, state_dim: int, embed_dim: int = 32, hypernet_layers: int = 2,
                 hypernet_embed: int = 64) -> None:
        super().__init__()
        for key, value in (("n_agents", n_agents), ("state_dim", state_dim), ("mixer.embed_dim", embed_dim),
                           ("mixer.hypernet_embed", hypernet_embed)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        self.n_agents, self.state_dim, self.embed_dim = n_agents, state_dim, embed_dim

        def hypernet(out: int) -> nn.Module:
            if hypernet_layers == 1:
                return nn.Linear(state_dim, out)
            if hypernet_layers == 2:
                return nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, out))
            raise ValueError(f"mixer.hypernet_layers must be 1 or 2, got {hypernet_layers!r}")

        self.hyper_w1 = hypernet(n_agents * embed_dim)
        self.hyper_w2 = hypernet(embed_dim)
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_v = nn.Sequential(nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))

    def forward(self, agent_qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """agent_qs (..., n_agents), state (..., state_dim) -> Q_tot (...)."""
        nets = self._hypernets()
        return self._mix(agent_qs, state, lambda k, s: (nets[k](s), None))[0]

    @torch.no_grad()
    def forward_cached(self, agent_qs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``forward`` without autograd (the hypernetworks through ``numpy_heads.TorchMLP``: the same ops),
        and what ``backward`` needs."""
        passes = self.__dict__.get("_passes")  # made on first use, so snapshots of older runs need nothing
        if passes is None:
            passes = self._passes = tuple(TorchMLP(net) for net in self._hypernets())
        return self._mix(agent_qs, state, lambda k, s: passes[k].forward(s))

    def _hypernets(self) -> tuple[nn.Module, ...]:
        """W1's, b1's, w2's and V's hypernetworks (``_passes``' order)."""
        return self.hyper_w1, self.hyper_b1, self.hyper_w2, self.hyper_v

    def _mix(self, agent_qs: torch.Tensor, state: torch.Tensor, hyper: Any) -> tuple[torch.Tensor, Any]:
        """The mixing (one implementation for both passes); ``hyper(k, s)`` -> (the k-th hypernetwork of
        ``_hypernets()`` on s, its cache)."""
        lead = agent_qs.shape[:-1]
        if agent_qs.shape[-1] != self.n_agents or state.shape != (*lead, self.state_dim):
            raise ValueError(f"QMixer: agent_qs (..., {self.n_agents}) and state (..., {self.state_dim}) with the "
                             f"same leading axes, got {tuple(agent_qs.shape)} and {tuple(state.shape)}")
        qs = agent_qs.reshape(-1, 1, self.n_agents)
        s = state.reshape(-1, self.state_dim)
        w1_pre, c_w1 = hyper(0, s)
        w1 = w1_pre.abs().view(-1, self.n_agents, self.embed_dim)
        b1_pre, c_b1 = hyper(1, s)
        pre = torch.bmm(qs, w1) + b1_pre.view(-1, 1, self.embed_dim)
        hidden = F.elu(pre)
        w2_pre, c_w2 = hyper(2, s)
        w2 = w2_pre.abs().view(-1, self.embed_dim, 1)
        v_pre, c_v = hyper(3, s)
        out = (torch.bmm(hidden, w2) + v_pre.view(-1, 1, 1)).reshape(lead)
        return out, (lead, qs, w1_pre, w1, pre, hidden, w2_pre, w2, (c_w1, c_b1, c_w2, c_v))

    @torch.no_grad()
    def backward(self, cache: Any, grad: torch.Tensor) -> torch.Tensor:
        """d loss / d parameters into the mixer's .grad (views of a flat gradient) and d loss / d agent_qs
        returned, from d loss / d Q_tot (``grad``, the output's shape), with the ops autograd replays for
        ``forward``: bmm's backward (``grad.bmm(b^T)``, ``a^T.bmm(grad)``), abs's (``grad * sgn``), ELU's,
        the views' reshapes; each parameter is reached once, so nothing is accumulated
        (tests/agents/test_q_fast.py checks the bits against autograd)."""
        lead, qs, w1_pre, w1, pre, hidden, w2_pre, w2, (c_w1, c_b1, c_w2, c_v) = cache
        pass_w1, pass_b1, pass_w2, pass_v = self._passes
        g = grad.reshape(-1, 1, 1)
        pass_v.backward(c_v, g.reshape(-1, 1))
        g_hidden = g.bmm(w2.transpose(1, 2))
        g_w2 = hidden.transpose(1, 2).bmm(g)
        pass_w2.backward(c_w2, g_w2.reshape(w2_pre.shape) * w2_pre.sgn())
        g_pre = torch.ops.aten.elu_backward(g_hidden, 1.0, 1, 1, False, pre)
        pass_b1.backward(c_b1, g_pre.reshape(-1, self.embed_dim))
        g_qs = g_pre.bmm(w1.transpose(1, 2))
        g_w1 = qs.transpose(1, 2).bmm(g_pre)
        pass_w1.backward(c_w1, g_w1.reshape(w1_pre.shape) * w1_pre.sgn())
        return g_qs.reshape(*lead, self.n_agents)


# ----------------------------------------------------------------------------- schedules
def _check_schedule(start: float, end: float, steps: int) -> None:
    for key, value in (("epsilon_start", start), ("epsilon_end", end)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{key} must lie in [0, 1], got {value!r}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"epsilon_anneal_steps must be an integer >= 0, got {steps!r}")


def linear_schedule(step: int, start: float, end: float, steps: int) -> float:
    """start + min(step/steps, 1) (end - start): from start at step 0 to end at ``steps``, then flat
    (DQN's epsilon; PER's beta is annealed the same way)."""
    _check_schedule(start, end, steps)
    if steps == 0:
        return float(end)
    frac = min(1.0, max(step, 0) / steps)
    return start + frac * (end - start)


def exponential_schedule(step: int, start: float, end: float, steps: int) -> float:
    """start (end/start)^min(step/steps, 1): geometric decay from start to end at ``steps``, then flat
    (PyMARL's "exp" schedule parametrised by its end point); start and end must be > 0."""
    _check_schedule(start, end, steps)
    if start <= 0 or end <= 0:
        raise ValueError(f"an exponential schedule needs epsilon_start and epsilon_end > 0, got {start!r}, {end!r}")
    if steps == 0:
        return float(end)
    frac = min(1.0, max(step, 0) / steps)
    return start * (end / start) ** frac
