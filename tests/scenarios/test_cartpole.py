"""The native CartPole (scenarios/cartpole.py: Gymnasium's CartPoleVectorEnv, every copy stepped as numpy
arrays in one call) against the same copies stepped one at a time by Gymnasium's CartPoleEnv."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from scenarios.cartpole import CartPoleConfig, make_cartpole


@pytest.mark.parametrize("num_envs, max_steps", [(8, 500), (5, 12)])
def test_vectorised_step_equals_single_steps(num_envs: int, max_steps: int) -> None:
    """2,000 cycles of random actions: each copy's observation, reward, termination and truncation
    equal a single CartPoleEnv's step from the same state, bit for bit; a copy that ended restarts on
    its next step (reward 0, a fresh state in [-0.05, 0.05])."""
    vec = make_cartpole(CartPoleConfig(num_envs=num_envs, max_episode_steps=max_steps), seed=3)
    singles = [CartPoleEnv() for _ in range(num_envs)]
    for env in singles:
        env.reset(seed=0)
    rng = np.random.default_rng(0)
    state = vec.unwrapped.state.T.copy()  # (E, 4) after the seeded reset
    prev_done = np.zeros(num_envs, dtype=bool)
    lengths = np.zeros(num_envs, dtype=int)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(2000):
        actions = rng.integers(0, 2, size=num_envs)
        obs, rew, term, trunc, _ = vec.step(actions)
        for e, env in enumerate(singles):
            if prev_done[e]:  # next-step autoreset: this step only restarted the copy
                assert rew[e] == 0.0 and not term[e] and not trunc[e]
                assert np.all(np.abs(obs[e]) <= 0.05)
                lengths[e] = 0
                continue
            env.state = state[e].copy()
            env.steps_beyond_terminated = None
            s_obs, s_rew, s_term, _, _ = env.step(int(actions[e]))
            lengths[e] += 1
            assert obs[e].tobytes() == np.asarray(s_obs, dtype=np.float32).tobytes(), (t, e)
            assert rew[e] == np.float32(s_rew) and bool(term[e]) == s_term, (t, e)
            assert bool(trunc[e]) == (lengths[e] >= max_steps), (t, e)
            ends["terminated"] += int(term[e])
            ends["truncated"] += int(trunc[e] and not term[e])
        state = vec.unwrapped.state.T.copy()
        prev_done = term | trunc
    assert ends["terminated"] > 50  # random play topples the pole often
    if max_steps == 12:
        assert ends["truncated"] > 10


def test_observe_keeps_the_named_entries_of_the_full_observation() -> None:
    """scenario.observe: [x, theta] (the velocities hidden) gives columns 0 and 2 of the full CartPole's
    observations, step for step from the same seed and actions, with the same ends; and the space says so."""
    full = make_cartpole(CartPoleConfig(num_envs=3), 0)
    part = make_cartpole(CartPoleConfig(num_envs=3, observe=["theta", "x"]), 0)
    assert part.single_observation_space.shape == (2,)
    np.testing.assert_array_equal(part.single_observation_space.high, full.single_observation_space.high[[2, 0]])
    a, _ = full.reset(seed=4)
    b, _ = part.reset(seed=4)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(300):
        np.testing.assert_array_equal(b, a[:, [2, 0]])
        act = rng.integers(0, 2, 3)
        a, ra, ta, ua, _ = full.step(act)
        b, rb, tb, ub, _ = part.step(act)
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_array_equal(ta, tb)
        np.testing.assert_array_equal(ua, ub)
        ends += int(ta.sum())
    assert ends > 5


@pytest.mark.parametrize("observe", [[], ["x", "x"], ["x", "speed"]])
def test_a_bad_observe_list_is_refused_naming_the_entries(observe) -> None:
    with pytest.raises(ValueError, match=r"observe: a non-empty list of distinct entries of \['x', 'x_dot', 'theta'"):
        CartPoleConfig(observe=observe).validate()
