"""GAE and n-step returns against hand-computed values and a brute-force definition."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from agents.returns import discounted_returns, gae


def test_gae_hand_computed():
    # one env, 3 steps, no episode end: gamma 0.5, lambda 0.5
    r = np.array([[1.0], [2.0], [3.0]])
    v = np.array([[1.0], [1.0], [1.0]])
    nv = np.array([[1.0], [1.0], [2.0]])
    z = np.zeros((3, 1), dtype=bool)
    # deltas: 1+0.5-1=0.5, 2+0.5-1=1.5, 3+1-1=3 ; A2=3, A1=1.5+.25*3=2.25, A0=.5+.25*2.25=1.0625
    np.testing.assert_allclose(gae(r, v, nv, z, z, 0.5, 0.5)[:, 0], [1.0625, 2.25, 3.0])


def test_gae_episode_end_terminal_vs_truncated():
    r = np.array([[1.0], [1.0]])
    v = np.array([[0.5], [0.5]])
    nv = np.array([[2.0], [4.0]])
    done = np.array([[True], [False]])
    term = np.array([[True], [False]])
    # terminal at t=0: no bootstrap, no recursion: A0 = 1 - 0.5
    a = gae(r, v, nv, term, done, 0.9, 1.0)
    np.testing.assert_allclose(a[:, 0], [0.5, 1 + 0.9 * 4 - 0.5])
    # truncated at t=0: bootstrap from V(final obs) = 2, still no recursion
    a = gae(r, v, nv, np.zeros_like(term), done, 0.9, 1.0)
    np.testing.assert_allclose(a[:, 0], [1 + 0.9 * 2 - 0.5, 1 + 0.9 * 4 - 0.5])


def brute_force_lambda_return(r, v, nv, term, done, gamma, lam, t):
    """(1-lam) sum_n lam^(n-1) G_t^(n) + lam^(N-1) G_t^(N), G^(n) the n-step bootstrapped return."""
    T = len(r)
    horizon = T - t
    for k in range(t, T):  # the episode may end inside the rollout
        if done[k]:
            horizon = k - t + 1
            break

    def g(n):
        total, disc = 0.0, 1.0
        for k in range(t, t + n):
            total += disc * r[k]
            disc *= gamma
        last = t + n - 1
        return total + disc * (0.0 if term[last] else nv[last])

    out = sum((1 - lam) * lam ** (n - 1) * g(n) for n in range(1, horizon))
    return out + lam ** (horizon - 1) * g(horizon) - v[t]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_gae_equals_lambda_weighted_nstep_returns(T, gamma, lam, seed):
    rng = np.random.default_rng(seed)
    r, v, nv = rng.normal(size=T), rng.normal(size=T), rng.normal(size=T)
    done = rng.random(T) < 0.3
    term = done & (rng.random(T) < 0.5)
    # within an episode the next state's value is the value of the next step's state
    nv[:-1] = np.where(done[:-1], nv[:-1], v[1:])
    a = gae(r[:, None], v[:, None], nv[:, None], term[:, None], done[:, None], gamma, lam)[:, 0]
    expected = [brute_force_lambda_return(r, v, nv, term, done, gamma, lam, t) for t in range(T)]
    np.testing.assert_allclose(a, expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 7), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_lambda_one_is_nstep_return_minus_value(T, gamma, seed):
    rng = np.random.default_rng(seed)
    r, v, nv = rng.normal(size=(T, 3)), rng.normal(size=(T, 3)), rng.normal(size=(T, 3))
    done = rng.random((T, 3)) < 0.3
    term = done & (rng.random((T, 3)) < 0.5)
    nv[:-1] = np.where(done[:-1], nv[:-1], v[1:])
    np.testing.assert_allclose(gae(r, v, nv, term, done, gamma, 1.0) + v,
                               discounted_returns(r, nv, term, done, gamma), atol=1e-9)
