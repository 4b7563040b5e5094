"""The server-side learner of COMA and its baselines: critic inputs, targets, actor loss, one update.

Pure torch and independent of the runtime, so it is tested on hand-made batches. Three critics share
everything but what the critic sees and how the advantage is formed:

- ``coma``: Q(s, o_a, u^-a, a) -> |U| values; A^a = Q(s,u) - sum_u' pi^a(u') Q(s,(u^-a,u')).
- ``central_v``: V(s) -> 1 value shared by all agents; A^a = G^lambda_t - V(s_t).
- ``iac``: V(o_a, a) -> 1 value per agent, from the agent's own observation only (the shared
  parameters carry the agent id, so each agent has its own value function); A^a = G^lambda_t - V(o_a).

The critic learns TD(lambda) (or n-step) targets from a periodically copied target network; the shared
actor takes the agent's observation and one-hot id. Shapes: B episodes, T transitions; observation
arrays carry T+1 steps (the step after the last transition is kept to bootstrap a truncated episode).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch
from torch import nn

from agents.coma_estimators import counterfactual_advantage, epsilon_floored_policy, n_step_targets, td_lambda_targets
from agents.losses import diagnostics, explained_variance, ratio_stats
from marl_q.seeding import coma_bootstrap_seed

CRITIC_KINDS = ("coma", "central_v", "iac")


class Dims(NamedTuple):
    """Sizes the networks are built from."""

    n_agents: int
    obs_dim: int
    state_dim: int
    n_actions: int


@dataclass
class Batch:
    """Episodes of equal length stacked: obs (B,T+1,A,O), state (B,T+1,S), actions (B,T+1,A) long,
    avail (B,T+1,A,U), rewards/terminated (B,T), behaviour_logp (B,T,A), weight (B,) per-episode."""

    obs: torch.Tensor
    state: torch.Tensor
    actions: torch.Tensor
    avail: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    behaviour_logp: torch.Tensor
    weight: torch.Tensor


def agent_one_hot(shape_prefix: tuple[int, ...], n_agents: int) -> torch.Tensor:
    """One-hot agent ids broadcast to (*shape_prefix, A, A)."""
    eye = torch.eye(n_agents)
    return eye.expand(*shape_prefix, n_agents, n_agents)


def actor_inputs(obs: torch.Tensor) -> torch.Tensor:
    """(…, A, O) -> (…, A, O + A): each agent's observation with its one-hot id (shared actor)."""
    n_agents = obs.shape[-2]
    return torch.cat([obs, agent_one_hot(tuple(obs.shape[:-2]), n_agents).to(obs.dtype)], dim=-1)


def coma_critic_inputs(state: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor, n_actions: int) -> torch.Tensor:
    """COMA critic input per agent: [state, own obs, every agent's action one-hot with a's own slot
    zeroed, a's one-hot id]. state (…, S), obs (…, A, O), actions (…, A) long -> (…, A, S+O+A·U+A).

    Zeroing a's own slot makes one forward pass give Q(s, (u^-a, u')) for every u' of agent a.
    """
    n_agents = obs.shape[-2]
    prefix = tuple(obs.shape[:-2])
    one_hot = torch.nn.functional.one_hot(actions.long(), n_actions).to(obs.dtype)  # (…, A, U)
    joint = one_hot.reshape(*prefix, 1, n_agents * n_actions).expand(*prefix, n_agents, n_agents * n_actions)
    own_slot = torch.eye(n_agents, dtype=obs.dtype).repeat_interleave(n_actions, dim=1)  # (A, A·U)
    others = joint * (1.0 - own_slot)
    state_rep = state.unsqueeze(-2).expand(*prefix, n_agents, state.shape[-1])
    ids = agent_one_hot(prefix, n_agents).to(obs.dtype)
    return torch.cat([state_rep, obs, others, ids], dim=-1)


def critic_in_dim(kind: str, dims: Dims) -> int:
    """Input width of the critic of ``kind``."""
    if kind == "coma":
        return dims.state_dim + dims.obs_dim + dims.n_agents * dims.n_actions + dims.n_agents
    if kind == "central_v":
        return dims.state_dim
    if kind == "iac":
        return dims.obs_dim + dims.n_agents
    raise ValueError(f"unknown critic kind {kind!r} (choices: {', '.join(CRITIC_KINDS)})")


def critic_out_dim(kind: str, dims: Dims, dueling: bool = False) -> int:
    """|U| values for COMA's Q critic (|U| + 1 from the network under ``DuelingQ``), one for the V critics."""
    if kind != "coma":
        return 1
    return dims.n_actions + 1 if dueling else dims.n_actions


class DuelingQ(nn.Module):
    """COMA's Q critic as value + centred advantages: Q(s, (u^-a, u')) = v + d_u' - mean_u'' d_u''.

    The same |U| values as a plain head, another parametrization (Wang et al., ICML 2016): the wrapped
    network outputs [v, d_1..d_U]. The critic is trained on the taken action only, so in a plain head
    each action's output follows the level of the returns on its own, as often as that action is taken;
    when returns rise (gamma > 0 while the policy improves) the rarely taken actions lag, and the lag
    enters the counterfactual advantage. Here v is trained on every sample and the d's only carry
    the differences between actions, which is all the advantage uses (v cancels in it).
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        d = out[..., 1:]
        return out[..., :1] + d - d.mean(dim=-1, keepdim=True)


def critic_forward(kind: str, critic: nn.Module, state: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor,
                   n_actions: int) -> torch.Tensor:
    """The critic's output per agent: (…, A, U) for ``coma``, (…, A) values for the V critics."""
    prefix = tuple(obs.shape[:-1])  # (…, A)
    if kind == "coma":
        x = coma_critic_inputs(state, obs, actions, n_actions)
        return critic(x.reshape(-1, x.shape[-1])).reshape(*prefix, n_actions)
    if kind == "central_v":
        v = critic(state.reshape(-1, state.shape[-1])).reshape(*state.shape[:-1])
        return v.unsqueeze(-1).expand(*prefix)
    if kind == "iac":
        x = actor_inputs(obs)
        return critic(x.reshape(-1, x.shape[-1])).reshape(*prefix)
    raise ValueError(f"unknown critic kind {kind!r} (choices: {', '.join(CRITIC_KINDS)})")


def policy(actor: nn.Module, obs: torch.Tensor, avail: torch.Tensor, epsilon: float) -> torch.Tensor:
    """pi^a(. | o_a) of the shared actor for every agent: (…, A, O) -> (…, A, U), epsilon-floored."""
    x = actor_inputs(obs)
    logits = actor(x.reshape(-1, x.shape[-1])).reshape(*obs.shape[:-1], -1)
    return epsilon_floored_policy(logits, epsilon, avail)


class ComaLearner:
    """Critic and shared actor with their optimizers; ``learn(batch)`` is one server update."""

    def __init__(self, kind: str, actor: nn.Module, critic: nn.Module, dims: Dims, hp: Any) -> None:
        if kind not in CRITIC_KINDS:
            raise ValueError(f"unknown critic kind {kind!r} (choices: {', '.join(CRITIC_KINDS)})")
        self.kind, self.actor, self.critic, self.dims, self.hp = kind, actor, critic, dims, hp
        self.target_critic = copy.deepcopy(critic)
        for p in self.target_critic.parameters():
            p.requires_grad_(False)
        self.actor_opt = torch.optim.Adam(actor.parameters(), lr=hp.actor_lr)
        self.critic_opt = torch.optim.Adam(critic.parameters(), lr=hp.critic_lr)
        self.critic_steps = 0
        self.updates = 0

    def expected_target_values(self, batch: Batch, epsilon: float) -> torch.Tensor:
        """E_{u~pi}[Q'(s_t, u)] per agent for every step, (B, T+1, A): the target critic's counterfactual
        baseline (agent a's own action summed out under pi^a) averaged over ``bootstrap_samples`` draws
        of the other agents' joint action from the current actor. Draws are seeded by the update count,
        so a run (and a resumed one) is reproducible."""
        gen = torch.Generator().manual_seed(coma_bootstrap_seed(self.updates))
        with torch.no_grad():
            pi = policy(self.actor, batch.obs, batch.avail, epsilon)  # (B, T+1, A, U)
            flat = pi.reshape(-1, pi.shape[-1])
            total = torch.zeros(pi.shape[:-1])
            for _ in range(self.hp.bootstrap_samples):
                drawn = torch.multinomial(flat, 1, generator=gen).reshape(pi.shape[:-1])
                q = critic_forward("coma", self.target_critic, batch.state, batch.obs, drawn, self.dims.n_actions)
                total += (pi * q).sum(-1)  # agent a's own slot is masked in q: its own action summed exactly
        return total / self.hp.bootstrap_samples

    def _targets(self, batch: Batch, epsilon: float = 0.0) -> torch.Tensor:
        """TD(lambda) or n-step targets per agent from the target critic, (B, T, A)."""
        with torch.no_grad():
            if self.kind == "coma" and self.hp.bootstrap == "expected":
                out = self.expected_target_values(batch, epsilon)
            else:
                out = critic_forward(self.kind, self.target_critic, batch.state, batch.obs, batch.actions,
                                     self.dims.n_actions)
                if self.kind == "coma":
                    out = out.gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)
        n_agents = self.dims.n_agents
        rewards = batch.rewards.unsqueeze(-1).expand(-1, -1, n_agents)
        terminated = batch.terminated.unsqueeze(-1).expand(-1, -1, n_agents)
        mask = torch.ones_like(rewards)
        if self.hp.n_step:
            return n_step_targets(rewards, terminated, mask, out, self.hp.gamma, self.hp.n_step)
        return td_lambda_targets(rewards, terminated, mask, out, self.hp.gamma, self.hp.td_lambda)

    def learn(self, batch: Batch, epsilon: float = 0.0) -> dict[str, float]:
        """One critic step (or ``critic_steps_per_update``) then one actor step (none during the first
        ``critic_warmup_updates`` updates); returns diagnostics."""
        steps = batch.rewards.shape[1]
        targets = self._targets(batch, epsilon)
        critic_loss = torch.zeros(())
        for _ in range(self.hp.critic_steps_per_update):
            out = critic_forward(self.kind, self.critic, batch.state[:, :steps], batch.obs[:, :steps],
                                 batch.actions[:, :steps], self.dims.n_actions)
            taken = out.gather(-1, batch.actions[:, :steps].long().unsqueeze(-1)).squeeze(-1) if self.kind == "coma" else out
            critic_loss = ((taken - targets) ** 2).mean()
            self.critic_opt.zero_grad()
            critic_loss.backward()
            nn.utils.clip_grad_norm_(self.critic.parameters(), self.hp.grad_clip)
            self.critic_opt.step()
            self.critic_steps += 1
            if self.critic_steps % self.hp.target_update_every == 0:
                self.target_critic.load_state_dict(self.critic.state_dict())

        obs, avail, actions = batch.obs[:, :steps], batch.avail[:, :steps], batch.actions[:, :steps].long()
        actor_frozen = self.updates < self.hp.critic_warmup_updates
        with torch.no_grad():
            out = critic_forward(self.kind, self.critic, batch.state[:, :steps], obs, actions, self.dims.n_actions)
        pi = policy(self.actor, obs, avail, epsilon)
        pi_taken = pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1).clamp_min(1e-10)
        log_pi = pi_taken.log()
        if self.kind == "coma":
            advantage, baseline = counterfactual_advantage(out, pi.detach(), actions)
            if self.hp.coma_advantage == "return":
                advantage = targets - baseline
        else:
            advantage = targets - out
        advantage = advantage.detach()
        if self.hp.advantage_norm:
            advantage = standardise(advantage)
        weight = batch.weight.view(-1, 1, 1).expand_as(advantage)
        if self.hp.off_policy_correction:
            # decoupled objective (AReaL): importance weight pi_prox / pi_behav, pi_prox = the server's
            # actor before this step; truncated as in V-trace.
            ratio = (log_pi.detach() - batch.behaviour_logp).exp().clamp(max=self.hp.importance_clip)
            weight = weight * ratio
        entropy = -(pi * pi.clamp_min(1e-10).log()).sum(-1)
        pg_loss = -(weight * advantage * log_pi).mean()
        actor_loss = pg_loss - self.hp.entropy_coef * entropy.mean()
        if not actor_frozen:  # during the critic warm-up the actor keeps its initial parameters
            self.actor_opt.zero_grad()
            actor_loss.backward()
            nn.utils.clip_grad_norm_(self.actor.parameters(), self.hp.grad_clip)
            self.actor_opt.step()
        self.updates += 1
        # train.csv's row (agents.losses.diagnostics), from what this step computed: the critic's last
        # loss and its values against the targets, the actor's KL from the behaviour policy on the
        # actions taken (stale workers and the epsilon floor show here); no ratio clip, so no clipfrac
        with torch.no_grad():
            self.last_diagnostics = diagnostics(
                pg_loss, critic_loss, entropy.mean(), ratio_stats(log_pi, batch.behaviour_logp, None)["approx_kl"],
                None, explained_variance(taken.detach().reshape(-1).numpy(), targets.reshape(-1).numpy()))
        return {
            "critic_loss": float(critic_loss.detach()),
            "actor_loss": float(actor_loss.detach()),
            "advantage_std": float(advantage.std()) if advantage.numel() > 1 else 0.0,
            "entropy": float(entropy.mean().detach()),
        }


def standardise(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over every element (population std); a constant tensor maps to zeros."""
    centred = x - x.mean()
    return centred / (centred.pow(2).mean().sqrt() + eps)


def stack_episodes(episodes: list[dict[str, Any]], weights: Optional[list[float]] = None) -> Batch:
    """Stack equal-length episode dicts of numpy arrays (the trajectory payload) into a Batch."""
    def cat(key: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.stack([torch.as_tensor(ep[key]).to(dtype) for ep in episodes])

    weights = weights if weights is not None else [1.0] * len(episodes)
    return Batch(
        obs=cat("obs", torch.float32),
        state=cat("state", torch.float32),
        actions=cat("actions", torch.long),
        avail=cat("avail", torch.float32),
        rewards=cat("rewards", torch.float32),
        terminated=cat("terminated", torch.float32),
        behaviour_logp=cat("behaviour_logp", torch.float32),
        weight=torch.tensor(weights, dtype=torch.float32),
    )
