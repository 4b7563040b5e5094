"""The recurrent actor-critic: a team worker's memory while it acts, and the update by chunked BPTT.

The heads are agents/recurrent.py's ``RecurrentHead`` (either role may be recurrent, the other
feed-forward). While a worker acts (``TeamMemory``) every row (copy, agent) carries a hidden state
per recurrent role, zeroed where an episode starts and kept across rollout boundaries; the rollout
records the states at its chunk starts (t = 0, L, 2L, ..., and T, the carry into the next rollout)
and each step's reset flags. The update (``recurrent_update``) is ``agents.actor_critic.
actor_critic_update`` on sequences: the same loss (agents.losses), GAE (agents.returns), value
normalisation and diagnostics, with the forward passes unrolled chunk by chunk from the recorded
states and the minibatches made of whole sequences (docs/recurrent.md).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from agents.actor_critic import ActorCriticConfig, descend, minibatches_of
from agents.distributions import Distribution
from agents.heads import FlatParameters
from agents.losses import actor_critic_loss, categorical, diagnostics, explained_variance, ratio_stats
from agents.recurrent import from_sequences, is_recurrent, sequence_forward, to_sequences
from agents.returns import rollout_targets
from agents.value_norm import ValueNorm
from marl_q.optim import FlatOptimizer

ROLES = ("actor", "critic")


class TeamMemory:
    """The hidden states of a team worker's rows (``copies`` x ``agents`` rows, copy-major) for its
    recurrent roles, and which copies start an episode at their current observation."""

    def __init__(self, actor: nn.Module, critic: nn.Module, copies: int, agents: int) -> None:
        self.agents = agents
        self.roles = [role for role, net in zip(ROLES, (actor, critic)) if is_recurrent(net)]
        rows = copies * agents
        self.state = {role: net.initial_state(rows) for role, net in zip(ROLES, (actor, critic)) if role in self.roles}
        self.starts = np.ones(copies, dtype=bool)  # a copy's first observation starts its episode
        self.record: Optional[dict[str, np.ndarray]] = None

    def begin(self, steps: int, chunk: int) -> None:
        """Record a rollout of ``steps`` steps cut into chunks of ``chunk``."""
        rows = len(self.starts) * self.agents
        self.chunk = chunk
        self.record = {"resets": np.zeros((steps + 1, rows), dtype=bool)}
        for role in self.roles:
            self.record[f"{role}_h"] = np.zeros((steps // chunk + 1, rows, self.state[role].shape[1]), dtype=np.float32)

    def act(self, t: Optional[int], nets: dict[str, nn.Module], inputs: dict[str, torch.Tensor],
            pending_reset: np.ndarray) -> torch.Tensor:
        """The actor's outputs on this step's rows (no graph), stepping every recurrent role whose input
        is given; ``t``: the rollout step being recorded (None: not recorded, e.g. greedy evaluation).
        ``pending_reset``: the vector's copies whose next step only restarts them (their next
        observation starts an episode)."""
        resets = torch.from_numpy(np.repeat(self.starts, self.agents))
        if t is not None:
            self.record["resets"][t] = resets.numpy()
        out = None
        for role in ROLES:
            if role not in inputs:
                continue
            net = nets[role]
            if role not in self.roles:
                y = net(inputs[role])
            else:
                if t is not None and t % self.chunk == 0:
                    self.record[f"{role}_h"][t // self.chunk] = self.state[role].numpy()
                y, self.state[role] = net.step(inputs[role], self.state[role], resets)
            if role == "actor":
                out = y
        self.starts = np.asarray(pending_reset, dtype=bool).copy()
        return out

    def finish(self, batch: dict[str, np.ndarray]) -> None:
        """Into the rollout's batch: the reset flags (T+1, rows), the last those of the bootstrap
        observation, and each recurrent role's states at the chunk starts and at T (C+1, rows, H)."""
        rec, self.record = self.record, None
        rec["resets"][-1] = np.repeat(self.starts, self.agents)
        for role in self.roles:
            rec[f"{role}_h"][-1] = self.state[role].numpy()
        batch.update(rec)

    def fresh(self, actor: nn.Module, critic: nn.Module) -> "TeamMemory":
        """A memory for the same rows with nothing seen (greedy evaluation's)."""
        return TeamMemory(actor, critic, len(self.starts), self.agents)


def team_memory(actor: nn.Module, critic: nn.Module, copies: int, agents: int) -> Optional[TeamMemory]:
    """A team worker's memory, or None when both heads are feed-forward (the feed-forward path is untouched)."""
    return TeamMemory(actor, critic, copies, agents) if is_recurrent(actor) or is_recurrent(critic) else None


def recurrent_update(ac: ActorCriticConfig, actor: nn.Module, critic: nn.Module, flat: FlatParameters,
                     optimizer: Optional[FlatOptimizer], rng: np.random.Generator,
                     batch: dict[str, np.ndarray], chunk: int, dist: Optional[Distribution] = None,
                     value_norm: Optional[ValueNorm] = None) -> dict[str, Optional[float]]:
    """``actor_critic_update`` with recurrent heads, by chunked backpropagation through time.

    ``batch``: ``actor_critic_update``'s, plus ``resets`` (T+1, R) and, per recurrent role,
    ``actor_h`` / ``critic_h`` (C+1, R, H): the states at t = 0, L, ..., T (``TeamMemory.finish``),
    with L = ``chunk`` dividing T. The R columns x C chunks are C R sequences of L steps, each
    unrolled from its chunk's recorded state (no gradient flows into it); the bootstrap value of
    obs[T] steps the critic once from the state at T. ``ac.minibatches`` splits the sequences (a
    permutation of them from ``rng``), never a sequence. Invalid steps weigh 0 in the loss.
    """
    T, R = batch["actions"].shape[:2]
    L = chunk
    C = T // L
    obs = torch.from_numpy(batch["obs"])
    cobs = obs if "critic_obs" not in batch else torch.from_numpy(batch["critic_obs"])
    resets_all = torch.from_numpy(batch["resets"])
    nets = {"actor": actor, "critic": critic}
    h0 = {role: torch.from_numpy(batch[f"{role}_h"][:C]).reshape(C * R, -1) for role in ROLES if is_recurrent(nets[role])}
    seq = {"obs": to_sequences(obs[:T], L), "cobs": to_sequences(cobs[:T], L), "resets": to_sequences(resets_all[:T], L)}

    def forward(role: str, x: torch.Tensor, idx: Optional[torch.Tensor]) -> torch.Tensor:
        h = h0.get(role)
        resets = seq["resets"]
        if idx is not None:
            h = None if h is None else h[idx]
            resets = resets[:, idx]
        return sequence_forward(nets[role], x, h, resets)

    with torch.no_grad():
        values_seq = forward("critic", seq["cobs"], None).squeeze(-1)  # (L, C R)
        if is_recurrent(critic):
            last = critic.step(cobs[T], torch.from_numpy(batch["critic_h"][C]), resets_all[T])[0]
        else:
            last = critic(cobs[T])
        values_all = torch.cat([from_sequences(values_seq, R), last.reshape(1, R)])
        logits_seq = forward("actor", seq["obs"], None) if ac.clip is not None else None
    values_np = values_all.numpy().astype(np.float64)
    values_np = values_np if value_norm is None else value_norm.denormalize(values_np)
    valid = batch["valid"]
    adv, returns = rollout_targets(batch, values_np, ac.gamma, ac.gae_lambda, ac.reward_scale)
    explained = explained_variance(values_np[:T][valid], returns[valid])
    if value_norm is not None:
        value_norm.update(returns.reshape(-1)[valid.reshape(-1)])
        returns = value_norm.normalize(returns)

    def log_prob_entropy(out: torch.Tensor, act: torch.Tensor, avail: Optional[torch.Tensor],
                         entropy: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if dist is None:
            return categorical(out, act, entropy)
        return dist.log_prob_entropy(out, act, avail)

    def flat_rows(x: torch.Tensor) -> torch.Tensor:  # (L, B, ...) -> (L B, ...)
        return x.reshape((-1,) + x.shape[2:])

    samples = {"act": to_sequences(torch.from_numpy(batch["actions"]), L),
               "adv": to_sequences(torch.from_numpy(adv), L).float(),
               "ret": to_sequences(torch.from_numpy(returns), L).float(),
               "mask": to_sequences(torch.from_numpy(valid), L).float(),
               "avail": to_sequences(torch.from_numpy(batch["avail"]), L) if "avail" in batch else None,
               "old_v": values_seq if ac.value_clip is not None else None}
    samples["old_logp"] = None if logits_seq is None else log_prob_entropy(
        flat_rows(logits_seq), flat_rows(samples["act"]),
        None if samples["avail"] is None else flat_rows(samples["avail"]), False)[0].reshape(L, C * R)
    single_pass = ac.epochs == 1 and ac.minibatches == 1
    last_terms, clipfracs = None, []
    for _ in range(ac.epochs):
        for mb in [None] if single_pass else minibatches_of(C * R, ac.minibatches, rng):
            x = {k: None if v is None else (v if mb is None else v[:, mb]) for k, v in samples.items()}
            mask = flat_rows(x["mask"])
            if not float(mask.sum()):  # no valid step among these sequences: nothing to descend on
                flat.zero_grad()
                continue
            logits = flat_rows(forward("actor", seq["obs"] if mb is None else seq["obs"][:, mb], mb))
            values = flat_rows(forward("critic", seq["cobs"] if mb is None else seq["cobs"][:, mb], mb)).squeeze(-1)
            avail = None if x["avail"] is None else flat_rows(x["avail"])
            act = flat_rows(x["act"])
            logp, entropy = log_prob_entropy(logits, act, avail, ac.ent_coef != 0.0)
            old_logp = None if x["old_logp"] is None else flat_rows(x["old_logp"])
            terms = actor_critic_loss(ac, logp, flat_rows(x["adv"]), values, flat_rows(x["ret"]), old_logp=old_logp,
                                      old_values=None if x["old_v"] is None else flat_rows(x["old_v"]),
                                      entropy=entropy, mask=mask)
            kl = ratio_stats(logp.detach(), old_logp, ac.clip, mask) if ac.clip is not None else None
            if kl is not None:
                clipfracs.append(kl["clipfrac"])
            descend(terms.loss, flat, optimizer, ac.max_grad_norm)
            last_terms = (terms, kl, logits, act, avail, mask)
    if last_terms is None:
        return diagnostics(None, None)
    terms, kl, logits, act, avail, mask = last_terms
    entropy = terms.entropy
    if entropy is None:
        with torch.no_grad():
            entropy = (log_prob_entropy(logits.detach(), act, avail, True)[1] * mask).sum() / mask.sum()
    approx_kl = kl["approx_kl"] if kl is not None else (0.0 if single_pass else None)
    return diagnostics(terms.policy, terms.value, entropy, approx_kl,
                       float(np.mean(clipfracs)) if clipfracs else None, explained)
