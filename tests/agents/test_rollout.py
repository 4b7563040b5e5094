"""agents/rollout.py, the one rollout loop and the one evaluation loop: against loops written out by
hand here (the per-family loops they replaced), and workers pickled before the loop moved there."""
from __future__ import annotations

import gymnasium
import numpy as np

from agents.rollout import EpisodeBook, GymVector, Step, evaluate, rollout


class Countdown:
    """A toy vector: copy i's episodes last i + 2 steps, reward = the action + 10 * i, and (like a
    Gymnasium vector env) the step after an episode's end only restarts it."""

    def __init__(self, n: int) -> None:
        self.num_envs = n
        self.t = np.zeros(n, dtype=int)
        self.restart = np.zeros(n, dtype=bool)

    def observe(self) -> np.ndarray:
        return self.t.copy()

    def step(self, actions: np.ndarray) -> Step:
        valid = ~self.restart
        reward = np.where(valid, actions + 10.0 * np.arange(self.num_envs), 0.0)
        self.t = np.where(valid, self.t + 1, 0)
        ended = valid & (self.t == np.arange(self.num_envs) + 2)
        self.restart = ended
        return Step(valid, reward, ended, None)


def test_rollout_books_each_copy_on_its_valid_steps_and_reports_episodes_in_copy_order():
    vec, book = Countdown(3), EpisodeBook(3)
    seen = []
    rows, steps = rollout(vec, book, 9, act=lambda obs: obs * 0 + 1, store=lambda t, o, a, s: seen.append(t),
                          row=lambda i: {"copy": i})
    assert seen == list(range(9))
    # by hand: copy i runs i+2 valid steps, then a restart step; reward 1 + 10 i a step
    # copy 0: episodes end at steps 1, 4, 7; copy 1 at 2, 6; copy 2 at 3, 8
    assert [(r["copy"], r["length"], r["return"]) for r in rows] == [
        (0, 2, 2.0), (1, 3, 33.0), (2, 4, 84.0), (0, 2, 2.0), (1, 3, 33.0), (0, 2, 2.0), (2, 4, 84.0)]
    assert steps == 9 * 3 - (3 + 2 + 1)  # every step but the restarts (3 for copy 0, 2 for 1, 1 for 2)
    # what is left in the book is the running episode: copy 1 has stepped once since its restart at 7
    np.testing.assert_array_equal(book.lengths, [0, 1, 0])
    np.testing.assert_array_equal(book.returns, [0.0, 11.0, 0.0])


def test_evaluate_returns_the_first_episodes_to_end():
    returns = evaluate(Countdown(3), 4, act=lambda obs: obs * 0)
    assert returns == [0.0, 30.0, 80.0, 0.0]


def _reference_gym_rollout(env, seed, steps, rng):
    """The single-agent loop as it was written before agents.rollout (actor_critic.py's)."""
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    prev_done, ep_return, ep_length = np.zeros(n, dtype=bool), np.zeros(n), np.zeros(n, dtype=np.int64)
    episodes, valids, observed = [], [], []
    for _ in range(steps):
        observed.append(np.asarray(obs, dtype=np.float32))
        act = rng.integers(0, 2, size=n)
        obs, rew, term, trunc, _ = env.step(act)
        dones = term | trunc
        valid = ~prev_done
        ep_return += np.where(valid, rew, 0.0)
        ep_length += valid
        for i in np.flatnonzero(dones & valid):
            episodes.append({"return": float(ep_return[i]), "length": int(ep_length[i])})
            ep_return[i], ep_length[i] = 0.0, 0
        prev_done = dones.copy()
        valids.append(valid)
    return episodes, np.array(valids), np.array(observed)


def test_gym_vector_matches_the_loop_it_replaced():
    def make():
        return gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1", max_episode_steps=6)] * 3)

    want, want_valid, want_obs = _reference_gym_rollout(make(), 5, 40, np.random.default_rng(1))
    rng, valids, observed = np.random.default_rng(1), [], []

    def act(obs):
        observed.append(obs.copy())
        return rng.integers(0, 2, size=3)

    got, steps = rollout(GymVector(make(), 5), EpisodeBook(3), 40, act,
                         store=lambda t, o, a, step: valids.append(step.valid))
    assert got == want and len(want) >= 15
    np.testing.assert_array_equal(np.array(valids), want_valid)
    np.testing.assert_array_equal(np.array(observed), want_obs)
    assert steps == int(want_valid.sum())
