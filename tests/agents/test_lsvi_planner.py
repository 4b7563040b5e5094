"""LSVI-UCB statistics and triggers against numpy and a from-scratch regression over raw data."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.lsvi_planner import (LsviStatistics, determinant_trigger, lsvi_beta, plan_optimistic,
                                 sync_condition)
from scenarios.linear_mdp import LinearMDP


def from_scratch_q(mdp: LinearMDP, data: list[tuple[int, int, int, float, int]], lam: float,
                   beta: float) -> np.ndarray:
    """LSVI-UCB straight from the definition: regress r + V(s') on phi over every stored transition."""
    H, S, A, d = mdp.horizon, mdp.n_states, mdp.n_actions, mdp.d
    q = np.zeros((H, S, A))
    next_values = np.zeros(S)
    for h in range(H - 1, -1, -1):
        rows = [(s, a, r, s2) for (hh, s, a, r, s2) in data if hh == h]
        gram = lam * np.eye(d)
        target = np.zeros(d)
        for s, a, r, s2 in rows:
            gram += np.outer(mdp.phi[s, a], mdp.phi[s, a])
            target += mdp.phi[s, a] * (r + next_values[s2])
        weights = np.linalg.solve(gram, target)
        for s in range(S):
            for a in range(A):
                x = mdp.phi[s, a]
                bonus = beta * math.sqrt(x @ np.linalg.solve(gram, x))
                q[h, s, a] = min(x @ weights + bonus, H)
        next_values = q[h].max(axis=1)
    return q


def random_episode(rng, H, d, S):
    return rng.dirichlet(np.ones(d), size=H), rng.random(H), rng.integers(S, size=H)


def test_sherman_morrison_inverse_and_logdet_match_numpy_after_many_updates():
    rng = np.random.default_rng(0)
    H, d, S, lam = 3, 6, 5, 0.5
    stats = LsviStatistics(H, d, S, lam)
    grams = np.repeat(np.eye(d)[None] * lam, H, axis=0)
    reward_sums, next_sums = np.zeros((H, d)), np.zeros((H, d, S))
    for _ in range(3000):
        phi, rewards, next_states = random_episode(rng, H, d, S)
        stats.add_episode(phi, rewards, next_states)
        for h in range(H):
            grams[h] += np.outer(phi[h], phi[h])
            reward_sums[h] += phi[h] * rewards[h]
            next_sums[h][:, next_states[h]] += phi[h]
    np.testing.assert_allclose(stats.gram, grams, rtol=1e-12)
    for h in range(H):
        np.testing.assert_allclose(stats.gram_inv[h] @ grams[h], np.eye(d), atol=1e-9)
        np.testing.assert_allclose(stats.gram_inv[h], np.linalg.inv(grams[h]), rtol=1e-7, atol=1e-12)
        assert stats.logdet[h] == pytest.approx(np.linalg.slogdet(grams[h])[1], rel=1e-12)
    np.testing.assert_allclose(stats.reward_sums, reward_sums, rtol=1e-12)
    np.testing.assert_allclose(stats.next_state_sums, next_sums, rtol=1e-12)


def test_statistics_from_downloaded_sums_equal_incremental_ones():
    rng = np.random.default_rng(1)
    stats = LsviStatistics(2, 3, 4, 1.0)
    for _ in range(50):
        stats.add_episode(*random_episode(rng, 2, 3, 4))
    rebuilt = LsviStatistics.from_sums(stats.gram, stats.reward_sums, stats.next_state_sums, 1.0)
    np.testing.assert_allclose(rebuilt.gram_inv, stats.gram_inv, rtol=1e-9)
    np.testing.assert_allclose(rebuilt.logdet, stats.logdet, rtol=1e-12)


def test_planner_equals_from_scratch_lsvi_ucb_on_the_same_data():
    mdp = LinearMDP(n_states=5, n_actions=3, d=4, horizon=4, seed=5)
    rng = np.random.default_rng(2)
    lam, beta = 1.0, 0.7
    stats = LsviStatistics(mdp.horizon, mdp.d, mdp.n_states, lam)
    data = []
    for _ in range(40):
        states = rng.integers(mdp.n_states, size=mdp.horizon)
        actions = rng.integers(mdp.n_actions, size=mdp.horizon)
        next_states = rng.integers(mdp.n_states, size=mdp.horizon)
        rewards = mdp.rewards[np.arange(mdp.horizon), states, actions]
        stats.add_episode(mdp.phi[states, actions], rewards, next_states)
        data += [(h, states[h], actions[h], rewards[h], next_states[h]) for h in range(mdp.horizon)]
    q = plan_optimistic(mdp.phi, stats.gram_inv, stats.reward_sums, stats.next_state_sums, beta)
    np.testing.assert_allclose(q, from_scratch_q(mdp, data, lam, beta), rtol=1e-9, atol=1e-9)
    assert np.all(q <= mdp.horizon)


def test_planner_with_no_data_and_no_bonus_is_zero_and_with_huge_bonus_is_capped_at_h():
    mdp = LinearMDP(n_states=3, n_actions=2, d=2, horizon=3, seed=0)
    stats = LsviStatistics(3, 2, 3, 1.0)
    args = (mdp.phi, stats.gram_inv, stats.reward_sums, stats.next_state_sums)
    np.testing.assert_array_equal(plan_optimistic(*args, 0.0), 0.0)
    np.testing.assert_array_equal(plan_optimistic(*args, 1e6), 3.0)


def brute_force_trigger(gram_server, gram_local, alpha):
    return any(np.linalg.det(gs + gl) > (1 + alpha) * np.linalg.det(gs) for gs, gl in zip(gram_server, gram_local))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 6), alpha=st.sampled_from([0.01, 0.1, 1.0, 10.0]))
def test_determinant_trigger_fires_exactly_when_the_determinant_condition_holds(seed, n, alpha):
    rng = np.random.default_rng(seed)
    H, d, S = 2, 3, 2
    server = LsviStatistics(H, d, S, 1.0)
    for _ in range(int(rng.integers(0, 20))):
        server.add_episode(*random_episode(rng, H, d, S))
    combined = server.copy()
    local = np.zeros((H, d, d))
    for _ in range(n):
        phi, rewards, next_states = random_episode(rng, H, d, S)
        combined.add_episode(phi, rewards, next_states)
        local += phi[:, :, None] * phi[:, None, :]
    assert determinant_trigger(combined.logdet, server.logdet, alpha) == brute_force_trigger(server.gram, local, alpha)


def test_determinant_trigger_at_the_threshold():
    # One step, Lambda_ser = I, Lambda_loc = x x^T: det ratio = 1 + |x|^2, so it fires iff |x|^2 > alpha.
    server = np.zeros(1)
    for squared_norm, fires in [(0.0999, False), (0.1001, True)]:
        assert determinant_trigger(np.array([math.log1p(squared_norm)]), server, 0.1) is fires


def test_sync_condition_against_direct_determinants():
    rng = np.random.default_rng(3)
    d = 3
    for _ in range(100):
        last = np.eye(d) + sum(np.outer(x, x) for x in rng.dirichlet(np.ones(d), size=5))
        now = last + sum(np.outer(x, x) for x in rng.dirichlet(np.ones(d), size=int(rng.integers(0, 4))))
        k = int(rng.integers(0, 10))
        threshold = float(rng.uniform(0.01, 2.0))
        expected = k * math.log(np.linalg.det(now) / np.linalg.det(last)) > threshold
        got = sync_condition(k, np.array([np.linalg.slogdet(now)[1]]), np.array([np.linalg.slogdet(last)[1]]), threshold)
        assert got == expected


def test_beta_formula_and_bad_values():
    assert lsvi_beta(8, 10, 20000, 1.0, 0.05) == pytest.approx(80 * math.sqrt(math.log(2 * 80 * 20000 / 0.05)))
    assert lsvi_beta(8, 10, 20000, 0.0) == 0.0
    with pytest.raises(ValueError, match="beta_scale"):
        lsvi_beta(8, 10, 100, -0.1)
    with pytest.raises(ValueError, match="lam"):
        LsviStatistics(2, 2, 2, 0.0)
