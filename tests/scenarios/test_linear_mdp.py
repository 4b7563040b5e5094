"""The linear MDP: exact V* and policy values against brute force, structure, and the PettingZoo view."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios.linear_mdp import LinearMDP, LinearMDPParallelEnv, make_linear_mdp


def trajectory_value(mdp: LinearMDP, policy: np.ndarray, h: int, state: int) -> float:
    """Expected return from (h, state) by enumerating every continuation (no dynamic programming table)."""
    if h == mdp.horizon:
        return 0.0
    action = policy[h, state]
    total = mdp.rewards[h, state, action]
    for next_state in range(mdp.n_states):
        p = mdp.transitions[h, state, action, next_state]
        if p > 0:
            total += p * trajectory_value(mdp, policy, h + 1, next_state)
    return total


def test_optimal_values_equal_best_of_all_deterministic_policies():
    mdp = LinearMDP(n_states=3, n_actions=2, d=3, horizon=3, seed=7)
    cells = mdp.horizon * mdp.n_states
    best = np.full(mdp.n_states, -np.inf)
    for choice in itertools.product(range(mdp.n_actions), repeat=cells):
        policy = np.array(choice).reshape(mdp.horizon, mdp.n_states)
        values = [trajectory_value(mdp, policy, 0, s) for s in range(mdp.n_states)]
        best = np.maximum(best, values)
    v_star, q_star = mdp.optimal_values()
    np.testing.assert_allclose(v_star[0], best, rtol=0, atol=1e-12)
    np.testing.assert_allclose(v_star[-1], 0.0)
    np.testing.assert_allclose(v_star[:-1], q_star.max(axis=2))


def test_exact_evaluation_matches_enumeration_for_random_policies():
    mdp = LinearMDP(n_states=4, n_actions=3, d=2, horizon=4, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        policy = rng.integers(mdp.n_actions, size=(mdp.horizon, mdp.n_states))
        values = mdp.evaluate(policy)
        for h in range(mdp.horizon):
            for s in range(mdp.n_states):
                assert values[h, s] == pytest.approx(trajectory_value(mdp, policy, h, s), abs=1e-12)
        assert np.all(values[0] <= mdp.optimal_values()[0][0] + 1e-12)


def test_greedy_policy_of_q_star_attains_v_star():
    mdp = LinearMDP(n_states=20, n_actions=5, d=8, horizon=10, seed=3)
    v_star, q_star = mdp.optimal_values()
    np.testing.assert_allclose(mdp.evaluate(q_star.argmax(axis=2)), v_star, atol=1e-12)


def test_mdp_is_exactly_linear_with_valid_probabilities_and_rewards():
    mdp = LinearMDP(n_states=6, n_actions=3, d=4, horizon=5, seed=2)
    assert np.all(mdp.phi >= 0) and np.allclose(mdp.phi.sum(-1), 1.0)
    assert np.all(np.linalg.norm(mdp.phi, axis=-1) <= 1.0 + 1e-12)
    np.testing.assert_allclose(mdp.transitions.sum(-1), 1.0, atol=1e-12)
    for h, s, a in itertools.product(range(mdp.horizon), range(mdp.n_states), range(mdp.n_actions)):
        assert mdp.rewards[h, s, a] == pytest.approx(float(mdp.phi[s, a] @ mdp.theta[h]), abs=1e-12)
        expected_row = sum(mdp.phi[s, a, i] * mdp.mu[h, i] for i in range(mdp.d))
        np.testing.assert_allclose(mdp.transitions[h, s, a], expected_row, atol=1e-12)
    assert mdp.rewards.min() >= 0 and mdp.rewards.max() <= 1


def test_same_seed_same_mdp_and_sampling_follows_transition_probabilities():
    a, b = LinearMDP(5, 2, 3, 2, seed=11), LinearMDP(5, 2, 3, 2, seed=11)
    np.testing.assert_array_equal(a.transitions, b.transitions)
    rng = np.random.default_rng(0)
    draws = [a.sample_next_state(1, 2, 1, u) for u in rng.random(20000)]
    frequencies = np.bincount(draws, minlength=a.n_states) / len(draws)
    np.testing.assert_allclose(frequencies, a.transitions[1, 2, 1], atol=0.015)


@pytest.mark.parametrize("key", ["n_states", "n_actions", "d", "horizon"])
@pytest.mark.parametrize("bad", [0, -3])
def test_non_positive_sizes_are_rejected_with_the_key(key, bad):
    cfg = SimpleNamespace(n_states=4, n_actions=2, d=3, horizon=2, seed=0)
    setattr(cfg, key, bad)
    with pytest.raises(ValueError, match=f"scenario.{key}"):
        make_linear_mdp(cfg)


def test_parallel_env_passes_pettingzoo_conformance():
    parallel_api_test(LinearMDPParallelEnv(n_agents=3, n_states=5, n_actions=3, d=3, horizon=6), num_cycles=20)
    parallel_seed_test(lambda: LinearMDPParallelEnv(n_agents=2, n_states=5, n_actions=3, d=3, horizon=6))


def test_registered_env_id_builds_the_parallel_env():
    env = pettingzoo.make("parallel", "marlq/linear_mdp-v0", n_agents=2, n_states=4, n_actions=2, d=2, horizon=3)
    observations, _ = env.reset(seed=0)
    assert set(observations) == {"agent_0", "agent_1"}
    steps = 0
    while env.agents:
        _, rewards, _, _, _ = env.step({a: 0 for a in env.agents})
        assert all(0.0 <= r <= 1.0 for r in rewards.values())
        steps += 1
    assert steps == 3
