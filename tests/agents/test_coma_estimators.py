"""COMA's estimators against independent references: brute-force loops and direct sums of returns."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.coma_estimators import (
    counterfactual_advantage,
    epsilon_floored_policy,
    n_step_targets,
    td_lambda_targets,
)

torch.set_num_threads(1)


def test_counterfactual_advantage_matches_a_joint_q_table_looped_over_each_agents_actions() -> None:
    """Q(s,u) is an arbitrary table over joint actions; the baseline loops over u'_a, others fixed."""
    gen = torch.Generator().manual_seed(0)
    n_agents, n_actions, batch = 3, 4, 5
    q_table = torch.randn(batch, *([n_actions] * n_agents), generator=gen, dtype=torch.float64)
    pi = torch.softmax(torch.randn(batch, n_agents, n_actions, generator=gen, dtype=torch.float64), dim=-1)
    actions = torch.randint(0, n_actions, (batch, n_agents), generator=gen)
    # Q(s,(u^-a,u')) for every agent and alternative, as the critic's one pass would hand them over.
    q_alt = torch.empty(batch, n_agents, n_actions, dtype=torch.float64)
    for b, a, alt in itertools.product(range(batch), range(n_agents), range(n_actions)):
        joint = actions[b].tolist()
        joint[a] = alt
        q_alt[b, a, alt] = q_table[(b, *joint)]
    adv, baseline = counterfactual_advantage(q_alt, pi, actions)
    for b, a in itertools.product(range(batch), range(n_agents)):
        joint = actions[b].tolist()
        expected_baseline = 0.0
        for alt in range(n_actions):
            other = list(joint)
            other[a] = alt
            expected_baseline += float(pi[b, a, alt]) * float(q_table[(b, *other)])
        expected_adv = float(q_table[(b, *joint)]) - expected_baseline
        assert float(baseline[b, a]) == pytest.approx(expected_baseline, abs=1e-12)
        assert float(adv[b, a]) == pytest.approx(expected_adv, abs=1e-12)


def test_counterfactual_advantage_hand_computed_two_agents() -> None:
    """Climbing-game payoffs, agent 0 plays 0 and agent 1 plays 1 under known policies."""
    payoff = torch.tensor([[11.0, -30.0, 0.0], [-30.0, 7.0, 6.0], [0.0, 0.0, 5.0]])
    # agent 0 varies its row with agent 1 fixed at column 1; agent 1 varies its column with row 0.
    q_alt = torch.stack([payoff[:, 1], payoff[0, :]])
    pi = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    adv, baseline = counterfactual_advantage(q_alt, pi, torch.tensor([0, 1]))
    # agent 0: Q = -30, baseline = .5(-30) + .25(7) + .25(0) = -13.25 -> A = -16.75
    # agent 1: Q = -30, baseline = .2(11) + .3(-30) + .5(0) = -6.8 -> A = -23.2
    assert baseline.tolist() == pytest.approx([-13.25, -6.8])
    assert adv.tolist() == pytest.approx([-16.75, -23.2])


def test_counterfactual_advantage_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        counterfactual_advantage(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))


@given(st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
@settings(max_examples=30, deadline=None)
def test_epsilon_floored_policy_is_a_distribution_with_the_floor(eps: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=gen) < 0.7).to(torch.float64)
    mask[:, 0] = 1.0
    pi = epsilon_floored_policy(logits, eps, mask)
    assert torch.allclose(pi.sum(-1), torch.ones(6, dtype=torch.float64))
    assert torch.all(pi[mask == 0] == 0)
    floor = eps / mask.sum(-1, keepdim=True)
    assert torch.all((pi + 1e-12 >= floor) | (mask == 0))


def _direct_lambda_return(r, q, term_step, t, gamma, lam):
    """(1-lam) sum_n lam^(n-1) G^(n) + lam^(N-1) G^(N): n-step returns summed with lambda weights."""
    steps = len(r)
    last = steps if term_step is None else term_step + 1  # transitions that happened
    horizon = steps - t

    def n_step(n):
        g = sum(gamma**j * r[t + j] for j in range(n) if t + j < last)
        alive = term_step is None or t + n <= term_step
        return g + (gamma**n * q[t + n] if alive else 0.0)

    total = sum((1 - lam) * lam ** (n - 1) * n_step(n) for n in range(1, horizon))
    return total + lam ** (horizon - 1) * n_step(horizon)


@given(
    st.integers(1, 9),
    st.floats(0.0, 1.0),
    st.floats(0.5, 1.0),
    st.one_of(st.none(), st.integers(0, 8)),
    st.integers(0, 2**31 - 1),
)
@settings(max_examples=60, deadline=None)
def test_td_lambda_targets_equal_the_lambda_weighted_sum_of_n_step_returns(
    steps: int, lam: float, gamma: float, term_step, seed: int
) -> None:
    if term_step is not None and term_step >= steps:
        term_step = steps - 1
    rng = np.random.default_rng(seed)
    r = rng.normal(size=steps)
    q = rng.normal(size=steps + 1)
    terminated = np.zeros(steps)
    mask = np.ones(steps)
    if term_step is not None:
        terminated[term_step] = 1.0
        mask[term_step + 1 :] = 0.0
        r[term_step + 1 :] = 0.0
    as_t = lambda x: torch.tensor(x, dtype=torch.float64)[None]  # noqa: E731
    got = td_lambda_targets(as_t(r), as_t(terminated), as_t(mask), as_t(q), gamma, lam)[0]
    for t in range(steps):
        if mask[t] == 0:
            assert float(got[t]) == 0.0
            continue
        assert float(got[t]) == pytest.approx(_direct_lambda_return(r, q, term_step, t, gamma, lam), abs=1e-9)


def test_td_lambda_extremes_are_one_step_td_and_monte_carlo() -> None:
    r = torch.tensor([[1.0, 2.0, 3.0]])
    q = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    zeros, ones = torch.zeros(1, 3), torch.ones(1, 3)
    td0 = td_lambda_targets(r, zeros, ones, q, 0.5, 0.0)
    assert td0[0].tolist() == pytest.approx([1 + 0.5 * 20, 2 + 0.5 * 30, 3 + 0.5 * 40])
    mc = td_lambda_targets(r, zeros, ones, q, 0.5, 1.0)
    assert mc[0].tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 40, 2 + 0.5 * 3 + 0.25 * 40, 3 + 0.5 * 40])


def test_td_lambda_targets_work_per_agent() -> None:
    """A trailing agent dim is carried through: each agent column equals its own 1-D computation."""
    gen = torch.Generator().manual_seed(3)
    r = torch.randn(2, 6, 3, generator=gen)
    q = torch.randn(2, 7, 3, generator=gen)
    term = torch.zeros(2, 6, 3)
    mask = torch.ones(2, 6, 3)
    full = td_lambda_targets(r, term, mask, q, 0.9, 0.7)
    for a in range(3):
        one = td_lambda_targets(r[..., a], term[..., a], mask[..., a], q[..., a], 0.9, 0.7)
        assert torch.allclose(full[..., a], one)


@given(st.integers(1, 8), st.integers(1, 10), st.one_of(st.none(), st.integers(0, 7)), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_n_step_targets_match_a_direct_loop(steps: int, n: int, term_step, seed: int) -> None:
    if term_step is not None and term_step >= steps:
        term_step = steps - 1
    gamma = 0.9
    rng = np.random.default_rng(seed)
    r = rng.normal(size=steps)
    q = rng.normal(size=steps + 1)
    terminated = np.zeros(steps)
    mask = np.ones(steps)
    if term_step is not None:
        terminated[term_step] = 1.0
        mask[term_step + 1 :] = 0.0
    as_t = lambda x: torch.tensor(x, dtype=torch.float64)[None]  # noqa: E731
    got = n_step_targets(as_t(r), as_t(terminated), as_t(mask), as_t(q), gamma, n)[0]
    last = steps if term_step is None else term_step + 1
    for t in range(steps):
        if t >= last:
            assert float(got[t]) == 0.0
            continue
        m = min(n, last - t)
        expected = sum(gamma**j * r[t + j] for j in range(m))
        if term_step is None or t + m <= term_step:
            expected += gamma**m * q[t + m]
        assert float(got[t]) == pytest.approx(expected, abs=1e-9)


def test_n_step_target_with_n_beyond_the_episode_is_the_monte_carlo_return() -> None:
    r = torch.tensor([[1.0, 1.0]])
    q = torch.tensor([[5.0, 5.0, 7.0]])
    got = n_step_targets(r, torch.zeros(1, 2), torch.ones(1, 2), q, 0.5, 10)
    assert got[0].tolist() == pytest.approx([1 + 0.5 + 0.25 * 7, 1 + 0.5 * 7])
