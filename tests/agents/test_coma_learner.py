"""The COMA learner: critic inputs against a hand-built reference, one-pass baselines, update behaviour."""
from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from agents.coma_learner import (
    ComaLearner,
    Dims,
    DuelingQ,
    actor_inputs,
    coma_critic_inputs,
    critic_forward,
    critic_in_dim,
    critic_out_dim,
    policy,
    stack_episodes,
    standardise,
)
from agents.coma_estimators import counterfactual_advantage

torch.set_num_threads(1)


def _mlp(i: int, o: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(i, 32), nn.Tanh(), nn.Linear(32, o))


def _hp(**kw) -> SimpleNamespace:
    base = dict(actor_lr=1e-2, critic_lr=1e-2, gamma=0.9, td_lambda=0.8, n_step=0, critic_steps_per_update=1,
                target_update_every=5, grad_clip=10.0, off_policy_correction=False, importance_clip=2.0,
                entropy_coef=0.0, critic_warmup_updates=0, bootstrap="sampled", bootstrap_samples=4,
                advantage_norm=False, coma_advantage="q")
    base.update(kw)
    return SimpleNamespace(**base)


def _hand_built_input(state, obs, actions, a, n_actions):
    """The COMA critic input of agent a, assembled element by element from its definition."""
    n_agents = obs.shape[0]
    parts = list(state.tolist()) + list(obs[a].tolist())
    for b in range(n_agents):
        for u in range(n_actions):
            parts.append(0.0 if b == a else float(int(actions[b]) == u))
    parts += [float(b == a) for b in range(n_agents)]
    return torch.tensor(parts, dtype=torch.float64)


def test_coma_critic_inputs_equal_the_hand_built_definition() -> None:
    gen = torch.Generator().manual_seed(1)
    n_agents, n_actions, obs_dim, state_dim = 3, 4, 2, 5
    state = torch.randn(state_dim, generator=gen)
    obs = torch.randn(n_agents, obs_dim, generator=gen)
    actions = torch.tensor([2, 0, 3])
    got = coma_critic_inputs(state, obs, actions, n_actions)
    for a in range(n_agents):
        assert torch.allclose(got[a], _hand_built_input(state, obs, actions, a, n_actions).float())


def test_one_forward_pass_baseline_equals_brute_force_over_each_agents_alternatives() -> None:
    """For each agent a and action u', a separate critic call on the joint action (u^-a, u')."""
    gen = torch.Generator().manual_seed(2)
    dims = Dims(n_agents=3, obs_dim=4, state_dim=6, n_actions=5)
    critic = _mlp(critic_in_dim("coma", dims), critic_out_dim("coma", dims)).double()
    batch, steps = 2, 3
    state = torch.randn(batch, steps, dims.state_dim, generator=gen, dtype=torch.float64)
    obs = torch.randn(batch, steps, dims.n_agents, dims.obs_dim, generator=gen, dtype=torch.float64)
    actions = torch.randint(0, dims.n_actions, (batch, steps, dims.n_agents), generator=gen)
    pi = torch.softmax(torch.randn(batch, steps, dims.n_agents, dims.n_actions, generator=gen, dtype=torch.float64), -1)
    q_alt = critic_forward("coma", critic, state, obs, actions, dims.n_actions)
    adv, baseline = counterfactual_advantage(q_alt, pi, actions)
    for b, t, a in itertools.product(range(batch), range(steps), range(dims.n_agents)):
        def q_joint(joint):  # Q^a(s, joint) by one critic call on a hand-built input
            x = _hand_built_input(state[b, t], obs[b, t], joint, a, dims.n_actions).double()
            return float(critic(x[None])[0, int(joint[a])].detach())

        joint = actions[b, t].clone()
        expected_baseline = 0.0
        for alt in range(dims.n_actions):
            other = joint.clone()
            other[a] = alt
            expected_baseline += float(pi[b, t, a, alt]) * q_joint(other)
        assert float(baseline[b, t, a].detach()) == pytest.approx(expected_baseline, abs=1e-10)
        assert float(adv[b, t, a].detach()) == pytest.approx(q_joint(joint) - expected_baseline, abs=1e-10)


@given(st.integers(0, 2**31 - 1), st.integers(0, 2), st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_agents_own_action_does_not_enter_its_q_values(seed: int, agent: int, new_action: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dims = Dims(3, 2, 4, 4)
    critic = _mlp(critic_in_dim("coma", dims), dims.n_actions)
    state, obs = torch.randn(4, generator=gen), torch.randn(3, 2, generator=gen)
    actions = torch.randint(0, 4, (3,), generator=gen)
    changed = actions.clone()
    changed[agent] = new_action
    q1 = critic_forward("coma", critic, state, obs, actions, 4)
    q2 = critic_forward("coma", critic, state, obs, changed, 4)
    assert torch.allclose(q1[agent], q2[agent])


def test_iac_value_of_an_agent_sees_only_its_own_observation() -> None:
    dims = Dims(3, 2, 4, 4)
    critic = _mlp(critic_in_dim("iac", dims), 1)
    obs = torch.randn(3, 2)
    other = obs.clone()
    other[1] += 5.0
    v1 = critic_forward("iac", critic, torch.zeros(4), obs, torch.zeros(3, dtype=torch.long), 4)
    v2 = critic_forward("iac", critic, torch.zeros(4), other, torch.zeros(3, dtype=torch.long), 4)
    assert v1.shape == (3,)
    assert torch.allclose(v1[[0, 2]], v2[[0, 2]]) and not torch.allclose(v1[1], v2[1])


def test_central_v_is_one_value_of_the_state_for_all_agents() -> None:
    dims = Dims(3, 2, 4, 4)
    critic = _mlp(critic_in_dim("central_v", dims), 1)
    v = critic_forward("central_v", critic, torch.randn(5, 4), torch.randn(5, 3, 2), torch.zeros(5, 3, dtype=torch.long), 4)
    assert v.shape == (5, 3)
    assert torch.allclose(v[:, 0], v[:, 1]) and torch.allclose(v[:, 0], v[:, 2])


def test_actor_inputs_append_one_hot_ids_and_policy_respects_masks() -> None:
    obs = torch.zeros(2, 3)
    x = actor_inputs(obs)
    assert x[:, 3:].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    actor = _mlp(5, 4)
    avail = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    pi = policy(actor, obs, avail, epsilon=0.1)
    assert pi[0, 2:].tolist() == [0.0, 0.0]
    assert torch.allclose(pi.sum(-1), torch.ones(2))


def _random_episodes(dims: Dims, n: int, steps: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    eps = []
    for _ in range(n):
        eps.append({
            "obs": torch.randn(steps + 1, dims.n_agents, dims.obs_dim, generator=gen).numpy(),
            "state": torch.randn(steps + 1, dims.state_dim, generator=gen).numpy(),
            "actions": torch.randint(0, dims.n_actions, (steps + 1, dims.n_agents), generator=gen).numpy(),
            "avail": torch.ones(steps + 1, dims.n_agents, dims.n_actions).numpy(),
            "rewards": torch.randn(steps, generator=gen).numpy(),
            "terminated": torch.zeros(steps).numpy(),
            "behaviour_logp": torch.full((steps, dims.n_agents), -1.0).numpy(),
        })
    return eps


@pytest.mark.parametrize("kind", ["coma", "central_v", "iac"])
def test_critic_loss_falls_on_a_fixed_batch(kind: str) -> None:
    dims = Dims(2, 3, 4, 3)
    learner = ComaLearner(kind, _mlp(dims.obs_dim + 2, 3), _mlp(critic_in_dim(kind, dims), critic_out_dim(kind, dims)),
                          dims, _hp(target_update_every=1000, critic_lr=1e-2))
    batch = stack_episodes(_random_episodes(dims, 1, 4, seed=0))  # few points: every critic can fit them
    first = learner.learn(batch)["critic_loss"]
    for _ in range(60):
        last = learner.learn(batch)["critic_loss"]
    assert last < 0.5 * first


def test_zero_staleness_weight_leaves_the_actor_unchanged() -> None:
    dims = Dims(2, 3, 4, 3)
    learner = ComaLearner("coma", _mlp(5, 3), _mlp(critic_in_dim("coma", dims), 3), dims, _hp())
    before = [p.detach().clone() for p in learner.actor.parameters()]
    learner.learn(stack_episodes(_random_episodes(dims, 2, 4, seed=1), weights=[0.0, 0.0]))
    assert all(torch.equal(b, p) for b, p in zip(before, learner.actor.parameters()))


def test_off_policy_correction_is_neutral_when_behaviour_equals_the_server_policy() -> None:
    dims = Dims(2, 3, 4, 3)
    episodes = _random_episodes(dims, 3, 4, seed=2)
    actor, critic = _mlp(5, 3, seed=3), _mlp(critic_in_dim("coma", dims), 3, seed=4)
    batch = stack_episodes(episodes)
    with torch.no_grad():
        pi = policy(actor, batch.obs[:, :4], batch.avail[:, :4], 0.0)
        batch.behaviour_logp = pi.gather(-1, batch.actions[:, :4].unsqueeze(-1)).squeeze(-1).log()
    plain = ComaLearner("coma", copy.deepcopy(actor), copy.deepcopy(critic), dims, _hp())
    corrected = ComaLearner("coma", copy.deepcopy(actor), copy.deepcopy(critic), dims, _hp(off_policy_correction=True))
    plain.learn(batch)
    corrected.learn(batch)
    for p, q in zip(plain.actor.parameters(), corrected.actor.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    # ...and not neutral when the behaviour policy was different
    batch.behaviour_logp = batch.behaviour_logp - 0.5
    other = ComaLearner("coma", copy.deepcopy(actor), copy.deepcopy(critic), dims, _hp(off_policy_correction=True))
    other.learn(batch)
    assert any(not torch.allclose(p, q, atol=1e-6) for p, q in zip(plain.actor.parameters(), other.actor.parameters()))


def test_standardise_matches_numpy_and_maps_a_constant_to_zeros() -> None:
    x = torch.randn(3, 5, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = (x.numpy() - x.numpy().mean()) / x.numpy().std()
    assert torch.allclose(standardise(x), torch.from_numpy(ref), atol=1e-12)
    assert torch.equal(standardise(torch.full((4,), -80.0)), torch.zeros(4))


def _actor_after_one_update(kind: str, scale: float, advantage_norm: bool) -> list[torch.Tensor]:
    """The actor after one update on a fixed batch whose rewards and critic outputs are scaled by ``scale``."""
    dims = Dims(2, 3, 4, 3)
    batch = stack_episodes(_random_episodes(dims, 3, 4, seed=5))
    batch.rewards = batch.rewards * scale
    critic = _mlp(critic_in_dim(kind, dims), critic_out_dim(kind, dims), seed=6)
    with torch.no_grad():
        critic[-1].weight.mul_(scale)
        critic[-1].bias.mul_(scale)
    learner = ComaLearner(kind, _mlp(5, 3, seed=7), critic, dims,
                          _hp(advantage_norm=advantage_norm, critic_lr=1e-12, actor_lr=1e-3))
    learner.learn(batch)
    return [p.detach().clone() for p in learner.actor.parameters()]


@pytest.mark.parametrize("kind", ["coma", "central_v", "iac"])
def test_normalised_advantages_make_the_actor_step_independent_of_the_reward_scale(kind: str) -> None:
    # rewards and critic scaled by 40 scale every advantage by 40 (critic_lr ~ 0 keeps the critic as built);
    # standardised, the actor takes the same step at either scale
    for p, q in zip(_actor_after_one_update(kind, 1.0, True), _actor_after_one_update(kind, 40.0, True)):
        assert torch.allclose(p, q, atol=1e-6)
    # and the option is live: centring the advantages changes the step taken from the raw ones
    raw, normed = _actor_after_one_update(kind, 1.0, False), _actor_after_one_update(kind, 1.0, True)
    assert any(not torch.allclose(p, q, atol=1e-6) for p, q in zip(raw, normed))


def test_return_advantage_subtracts_the_counterfactual_baseline_from_the_lambda_return() -> None:
    dims = Dims(2, 3, 4, 3)
    batch = stack_episodes(_random_episodes(dims, 3, 4, seed=8))
    actor, critic = _mlp(5, 3, seed=9), _mlp(critic_in_dim("coma", dims), 3, seed=10)
    reference = ComaLearner("coma", copy.deepcopy(actor), copy.deepcopy(critic), dims, _hp())
    targets = reference._targets(batch)  # G^lambda_t per agent, checked against the direct sum elsewhere
    with torch.no_grad():
        obs, avail, actions = batch.obs[:, :4], batch.avail[:, :4], batch.actions[:, :4]
        pi = policy(actor, obs, avail, 0.0)
        _, baseline = counterfactual_advantage(critic_forward("coma", critic, batch.state[:, :4], obs, actions, 3),
                                               pi, actions)
        log_pi = pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1).log()
    expected = -((targets - baseline) * log_pi).mean()
    learner = ComaLearner("coma", actor, critic, dims, _hp(coma_advantage="return", critic_lr=1e-12))
    assert learner.learn(batch)["actor_loss"] == pytest.approx(float(expected), abs=1e-5)
    q_based = ComaLearner("coma", copy.deepcopy(actor), copy.deepcopy(critic), dims, _hp(critic_lr=1e-12))
    assert q_based.learn(batch)["actor_loss"] != pytest.approx(float(expected), abs=1e-3)


def test_unknown_critic_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown critic kind 'qmix'"):
        ComaLearner("qmix", _mlp(5, 3), _mlp(5, 3), Dims(2, 3, 4, 3), _hp())


# ----------------------------------------------------------------------------- gamma 0.99 remedies
def test_critic_warmup_freezes_the_actor_for_its_updates_then_releases_it() -> None:
    dims = Dims(2, 3, 4, 3)
    learner = ComaLearner("coma", _mlp(5, 3), _mlp(critic_in_dim("coma", dims), 3), dims, _hp(critic_warmup_updates=2))
    batch = stack_episodes(_random_episodes(dims, 2, 4, seed=5))
    actor0 = [p.detach().clone() for p in learner.actor.parameters()]
    critic0 = [p.detach().clone() for p in learner.critic.parameters()]
    for _ in range(2):
        learner.learn(batch)
    assert all(torch.equal(a, p) for a, p in zip(actor0, learner.actor.parameters()))
    assert any(not torch.equal(c, p) for c, p in zip(critic0, learner.critic.parameters()))
    learner.learn(batch)  # the third update trains the actor
    assert any(not torch.equal(a, p) for a, p in zip(actor0, learner.actor.parameters()))


def _exact_expected_values(learner: ComaLearner, batch, epsilon: float) -> torch.Tensor:
    """E_{u~pi}[Q'^a(s, u)] by enumerating every joint action with its probability."""
    dims = learner.dims
    with torch.no_grad():
        pi = policy(learner.actor, batch.obs, batch.avail, epsilon)  # (B, T+1, A, U)
        out = torch.zeros(pi.shape[:-1], dtype=torch.float64)
        for joint in itertools.product(range(dims.n_actions), repeat=dims.n_agents):
            u = torch.tensor(joint).expand(*pi.shape[:-2], dims.n_agents)
            prob = pi.gather(-1, u.unsqueeze(-1)).squeeze(-1).prod(-1, keepdim=True)  # (B, T+1, 1)
            q = critic_forward("coma", learner.target_critic, batch.state, batch.obs, u, dims.n_actions)
            out += (prob * q.gather(-1, u.unsqueeze(-1)).squeeze(-1)).double()
    return out


def test_expected_bootstrap_values_match_the_enumerated_expectation_over_joint_actions() -> None:
    dims = Dims(3, 2, 3, 3)
    learner = ComaLearner("coma", _mlp(dims.obs_dim + 3, 3, seed=6), _mlp(critic_in_dim("coma", dims), 3, seed=7), dims,
                          _hp(bootstrap="expected", bootstrap_samples=3000))
    batch = stack_episodes(_random_episodes(dims, 1, 2, seed=8))
    got = learner.expected_target_values(batch, epsilon=0.3).double()
    exact = _exact_expected_values(learner, batch, epsilon=0.3)
    spread = exact.std()  # the values vary across agents and steps by this much
    assert got.shape == exact.shape == (1, 3, 3)
    assert torch.allclose(got, exact, atol=0.05 * float(spread) + 1e-3)
    # reproducible: draws are seeded by the update count
    assert torch.equal(learner.expected_target_values(batch, epsilon=0.3), learner.expected_target_values(batch, 0.3))


def test_expected_bootstrap_is_exact_when_the_other_agents_act_deterministically() -> None:
    """With every other agent's policy one-hot, sampling them is exact: the value is pi^a-weighted Q'."""
    dims = Dims(2, 2, 3, 3)

    class Fixed(nn.Module):  # logits that make agent 0 and 1 pick actions 2 and 0 (obs carries the id)
        def __init__(self):
            super().__init__()
            self.unused = nn.Parameter(torch.zeros(1))  # the learner's optimizer needs one

        def forward(self, x):
            ids = x[..., dims.obs_dim:]
            return 50.0 * (ids[..., :1] * torch.tensor([0.0, 0.0, 1.0]) + ids[..., 1:2] * torch.tensor([1.0, 0.0, 0.0]))

    critic = _mlp(critic_in_dim("coma", dims), 3, seed=9)
    learner = ComaLearner("coma", Fixed(), critic, dims, _hp(bootstrap="expected", bootstrap_samples=2))
    batch = stack_episodes(_random_episodes(dims, 2, 3, seed=10))
    joint = torch.tensor([2, 0]).expand(2, 4, 2)
    with torch.no_grad():
        q = critic_forward("coma", learner.target_critic, batch.state, batch.obs, joint, 3)
        pi = policy(learner.actor, batch.obs, batch.avail, 0.0)
    assert torch.allclose(learner.expected_target_values(batch, 0.0), (pi * q).sum(-1), atol=1e-6)


def test_expected_bootstrap_changes_only_the_coma_targets() -> None:
    dims = Dims(2, 3, 4, 3)
    batch = stack_episodes(_random_episodes(dims, 2, 4, seed=11))
    for kind in ("coma", "iac", "central_v"):
        critic = _mlp(critic_in_dim(kind, dims), critic_out_dim(kind, dims), seed=12)
        sampled = ComaLearner(kind, _mlp(5, 3), copy.deepcopy(critic), dims, _hp())._targets(batch, 0.1)
        expected = ComaLearner(kind, _mlp(5, 3), copy.deepcopy(critic), dims, _hp(bootstrap="expected"))._targets(batch, 0.1)
        assert torch.equal(sampled, expected) == (kind != "coma")


def test_dueling_q_is_value_plus_centred_differences_and_leaves_the_advantage_to_the_differences() -> None:
    dims = Dims(3, 2, 4, 4)
    net = _mlp(critic_in_dim("coma", dims), critic_out_dim("coma", dims, dueling=True), seed=13)
    assert critic_out_dim("coma", dims, dueling=True) == 5 and critic_out_dim("iac", dims, dueling=True) == 1
    critic = DuelingQ(net)
    gen = torch.Generator().manual_seed(14)
    state, obs = torch.randn(2, 4, generator=gen), torch.randn(2, 3, 2, generator=gen)
    actions = torch.randint(0, 4, (2, 3), generator=gen)
    q = critic_forward("coma", critic, state, obs, actions, 4)
    raw = net(coma_critic_inputs(state, obs, actions, 4))
    assert torch.allclose(q.mean(-1), raw[..., 0], atol=1e-6)  # the mean over actions is v
    assert torch.allclose(q[..., 1] - q[..., 0], raw[..., 2] - raw[..., 1], atol=1e-6)
    pi = torch.softmax(torch.randn(2, 3, 4, generator=gen), -1)
    adv, _ = counterfactual_advantage(q, pi, actions)
    with torch.no_grad():
        net[-1].bias[0] += 7.0  # shift v only
    adv_shifted, _ = counterfactual_advantage(critic_forward("coma", critic, state, obs, actions, 4), pi, actions)
    assert torch.allclose(adv, adv_shifted, atol=1e-5)


@pytest.mark.parametrize("kind", ["coma", "central_v", "iac"])
def test_diagnostics_of_an_update_by_hand(kind: str) -> None:
    """train.csv's row of a server update: the critic's loss and its explained variance of the targets
    (before its step), the policy-gradient term, the entropy, and the k3 KL of the actor from the
    behaviour policy on the taken actions: ln pi - ln pi_behav = 0.5 everywhere gives (e^0.5 - 1) - 0.5."""
    import numpy as np

    dims = Dims(2, 3, 4, 3)
    actor, critic = _mlp(5, 3, seed=3), _mlp(critic_in_dim(kind, dims), critic_out_dim(kind, dims), seed=4)
    learner = ComaLearner(kind, actor, critic, dims, _hp(entropy_coef=0.01))
    batch = stack_episodes(_random_episodes(dims, 3, 4, seed=2))
    steps = 4
    with torch.no_grad():
        pi = policy(actor, batch.obs[:, :steps], batch.avail[:, :steps], 0.0)
        batch.behaviour_logp = pi.gather(-1, batch.actions[:, :steps].unsqueeze(-1)).squeeze(-1).log() - 0.5
        targets = learner._targets(batch)
        out = critic_forward(kind, critic, batch.state[:, :steps], batch.obs[:, :steps], batch.actions[:, :steps], 3)
        taken = out.gather(-1, batch.actions[:, :steps].unsqueeze(-1)).squeeze(-1) if kind == "coma" else out
    stats = learner.learn(batch)
    diag = learner.last_diagnostics
    assert diag["value_loss"] == stats["critic_loss"]
    assert diag["policy_loss"] == pytest.approx(stats["actor_loss"] + 0.01 * stats["entropy"], rel=1e-5, abs=1e-7)
    assert diag["entropy"] == pytest.approx(stats["entropy"], rel=1e-6)
    assert diag["approx_kl"] == pytest.approx(np.exp(0.5) - 1.0 - 0.5, rel=1e-5)
    residual, t = (targets - taken).reshape(-1).numpy(), targets.reshape(-1).numpy()
    assert diag["explained_variance"] == pytest.approx(1.0 - residual.var() / t.var(), rel=1e-5)
    assert diag["clipfrac"] is None  # no ratio clip
