"""Replay storage against independent references: exact priorities (chi-square), brute-force sums, a
row-by-row ring buffer, hand-computed weights and n-step windows, and COMA's n-step targets."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from agents.coma_estimators import n_step_targets
from agents.replay import (EpisodeBuffer, Field, PrioritizedReplayBuffer, ReplayBuffer, ReplayConfigError, SumTree,
                           n_step_chunk, n_step_windows, transition_fields)
from marl_q.errors import ConfigError

SCALAR = [Field("x", (), np.float32)]


def scalar_chunk(values) -> dict[str, np.ndarray]:
    return {"x": np.asarray(values, dtype=np.float32)}


def many_samples(buf, batches: int, rng: np.random.Generator, **kw) -> list[np.ndarray]:
    """``batches`` batches of ``buf.capacity`` rows each, concatenated field by field (rows first)."""
    draws = [buf.sample(buf.capacity, rng, **kw) for _ in range(batches)]
    out = [np.concatenate([d[0] for d in draws])]
    out.append({k: np.concatenate([d[1][k] for d in draws]) for k in draws[0][1]})
    if len(draws[0]) == 3:
        out.append(np.concatenate([d[2] for d in draws]))
    return out


# ----------------------------------------------------------------------------- sum tree
def test_sum_tree_totals_and_minima_match_brute_force_after_updates():
    rng = np.random.default_rng(0)
    tree = SumTree(11)  # not a power of two: 16 leaves, 5 never written
    leaves = np.zeros(11)
    written = np.zeros(11, dtype=bool)
    for _ in range(50):
        idx = rng.integers(0, 11, size=rng.integers(1, 8))  # repeats: the last value wins
        vals = rng.random(len(idx)) * 10
        tree.update(idx, vals)
        for i, v in zip(idx, vals):
            leaves[i] = v
            written[i] = True
        assert tree.total == pytest.approx(leaves.sum(), rel=1e-12)
        assert tree.min == leaves[written].min()
        np.testing.assert_array_equal(tree.get(np.arange(11)), leaves)
        # every internal node is the sum of its leaves
        for node in range(1, tree.first_leaf):
            lo, hi = node, node
            while lo < tree.first_leaf:
                lo, hi = 2 * lo, 2 * hi + 1
            span = np.zeros(tree.first_leaf)
            span[:11] = leaves
            below = span[lo - tree.first_leaf:hi - tree.first_leaf + 1]
            assert tree.sums[node] == pytest.approx(below.sum(), rel=1e-12)


def test_sum_tree_sampling_matches_exact_priorities_chi_square():
    rng = np.random.default_rng(1)
    priorities = np.array([0.5, 3.0, 0.0, 1.25, 7.0, 0.1, 2.0, 0.0, 4.4, 1.0])  # zeros are never drawn
    tree = SumTree(len(priorities))
    tree.update(np.arange(len(priorities)), priorities)
    draws = tree.find(rng.random(50_000) * tree.total)
    counts = np.bincount(draws, minlength=len(priorities))
    assert counts[priorities == 0].sum() == 0
    nz = priorities > 0
    expected = priorities[nz] / priorities.sum() * len(draws)
    assert chisquare(counts[nz], expected).pvalue > 1e-3


def test_sum_tree_find_at_the_edges():
    tree = SumTree(6)
    tree.update(np.arange(6), [0.0, 2.0, 0.0, 1.0, 0.0, 0.0])
    # u = 0 goes to the first nonzero leaf, u = total (rounding's worst case) to the last nonzero one
    np.testing.assert_array_equal(tree.find([0.0, 1.999, 2.0, 2.999, 3.0, 3.5]), [1, 1, 3, 3, 3, 3])
    single = SumTree(1)
    single.update([0], [2.0])
    np.testing.assert_array_equal(single.find([0.0, 1.9]), [0, 0])


def test_prioritized_sampling_matches_p_alpha_chi_square():
    alpha = 0.7
    buf = PrioritizedReplayBuffer(SCALAR, capacity=8, alpha=alpha)
    buf.add(scalar_chunk(np.arange(8)))
    td = np.array([0.3, 2.0, 0.05, 1.0, 4.0, 0.5, 0.0, 1.5])
    buf.update_priorities(np.arange(8), td)
    rows, batch, _ = many_samples(buf, 5000, np.random.default_rng(2), beta=0.4)
    np.testing.assert_array_equal(batch["x"], rows.astype(np.float32))
    p = (np.abs(td) + buf.priority_eps) ** alpha
    assert chisquare(np.bincount(rows, minlength=8), p / p.sum() * len(rows)).pvalue > 1e-3


def test_importance_weights_by_hand():
    # td errors 0, 3, 8 with eps 1: p = 1, 4, 9; alpha 0.5: p^alpha = 1, 2, 3, P = 1/6, 2/6, 3/6.
    # N P_i = 0.5, 1, 1.5; w_i = (N P_i)^-beta / max_j w_j with beta 0.5 = (P_i / P_min)^-0.5 = 1, 1/sqrt2, 1/sqrt3
    buf = PrioritizedReplayBuffer(SCALAR, capacity=4, alpha=0.5, priority_eps=1.0)
    buf.add(scalar_chunk([10.0, 11.0, 12.0]))
    buf.update_priorities([0, 1, 2], [0.0, -3.0, 8.0])  # |delta|
    assert buf.tree.total == pytest.approx(6.0)
    rows, _, weights = many_samples(buf, 50, np.random.default_rng(3), beta=0.5)
    by_hand = {0: 1.0, 1: 2 ** -0.5, 2: 3 ** -0.5}
    assert set(rows.tolist()) == {0, 1, 2}
    for r, w in zip(rows, weights):
        assert w == pytest.approx(by_hand[int(r)], rel=1e-6)
    # beta = 0: no correction; alpha = 0: uniform priorities, all weights 1
    assert np.all(buf.sample(4, np.random.default_rng(4), beta=0.0)[2] == 1.0)
    flat = PrioritizedReplayBuffer(SCALAR, capacity=4, alpha=0.0)
    flat.add(scalar_chunk([1.0, 2.0]))
    flat.update_priorities([0, 1], [0.1, 50.0])
    assert np.all(flat.sample(4, np.random.default_rng(5), beta=1.0)[2] == 1.0)


def test_new_transitions_get_the_largest_priority_seen():
    buf = PrioritizedReplayBuffer(SCALAR, capacity=4, alpha=0.5, priority_eps=1.0)
    buf.add(scalar_chunk([0.0, 1.0]))
    np.testing.assert_allclose(buf.tree.get([0, 1]), [1.0, 1.0])  # 1 before any update
    buf.update_priorities([0, 1], [8.0, 2.0])  # p = 9, 3
    rows = buf.add(scalar_chunk([2.0]))
    np.testing.assert_allclose(buf.tree.get(rows), [3.0])  # 9 ** 0.5
    buf.update_priorities([0], [0.0])  # lowering a priority keeps the max seen
    assert buf.max_priority == 9.0


# ----------------------------------------------------------------------------- ring buffer
def naive_ring(capacity: int, chunks: list[np.ndarray]) -> tuple[np.ndarray, int, int]:
    """A row-by-row ring buffer: the reference for the vectorised writes."""
    data, pos, size = np.zeros(capacity, dtype=np.float32), 0, 0
    for chunk in chunks:
        for v in chunk:
            data[pos] = v
            pos = (pos + 1) % capacity
            size = min(capacity, size + 1)
    return data, pos, size


def test_ring_buffer_wraps_around_like_row_by_row_writes():
    buf = ReplayBuffer(SCALAR, capacity=5)
    np.testing.assert_array_equal(buf.add(scalar_chunk([0, 1, 2])), [0, 1, 2])
    np.testing.assert_array_equal(buf.add(scalar_chunk([3, 4, 5, 6])), [3, 4, 0, 1])
    np.testing.assert_array_equal(buf.data["x"], [5, 6, 2, 3, 4])
    assert (buf.pos, buf.size) == (2, 5)
    rows = buf.add(scalar_chunk(np.arange(10, 22)))  # longer than the capacity: its last 5 rows stay
    np.testing.assert_array_equal(rows, [4, 0, 1, 2, 3])
    np.testing.assert_array_equal(buf.data["x"], [18, 19, 20, 21, 17])
    assert (buf.pos, buf.size, buf.inserted) == (4, 5, 19)

    rng = np.random.default_rng(6)
    for capacity in (1, 3, 7, 16):
        buf = ReplayBuffer(SCALAR, capacity=capacity)
        chunks = [rng.random(rng.integers(0, 20)).astype(np.float32) for _ in range(12)]
        for c in chunks:
            buf.add(scalar_chunk(c))
        data, pos, size = naive_ring(capacity, chunks)
        np.testing.assert_array_equal(buf.data["x"], data)
        assert (buf.pos, buf.size, buf.inserted) == (pos, size, sum(map(len, chunks)))


def test_uniform_sampling_draws_only_filled_rows_uniformly():
    buf = ReplayBuffer(SCALAR, capacity=100)
    buf.add(scalar_chunk(np.arange(6)))
    rows, batch = many_samples(buf, 300, np.random.default_rng(7))
    assert rows.max() < 6
    np.testing.assert_array_equal(batch["x"], rows)
    assert chisquare(np.bincount(rows, minlength=6)).pvalue > 1e-3


def roundtrip(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Through an .npz as the checkpoints are written: plain arrays, no pickle."""
    fh = io.BytesIO()
    np.savez(fh, **state)
    fh.seek(0)
    with np.load(fh, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def spread_chunk(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    return {"obs": rng.random((rows, 3, 18)), "action": rng.integers(0, 5, (rows, 3)), "reward": rng.random(rows),
            "next_obs": rng.random((rows, 3, 18)), "terminated": rng.random(rows) < 0.1,
            "discount": np.full(rows, 0.99), "avail": np.ones((rows, 3, 5), bool),
            "next_avail": np.ones((rows, 3, 5), bool)}


@pytest.mark.parametrize("prioritized", [False, True])
def test_state_dict_round_trip_gives_the_same_samples(prioritized):
    fields = transition_fields((18,), n_agents=3, n_actions=5)
    def make():
        return PrioritizedReplayBuffer(fields, 50, alpha=0.6) if prioritized else ReplayBuffer(fields, 50)
    data_rng = np.random.default_rng(8)
    for rows_in in (30, 70):  # partly filled, then wrapped
        buf = make()
        buf.add(spread_chunk(data_rng, rows_in))
        if prioritized:
            buf.update_priorities(np.arange(20), data_rng.random(20) * 3)
        twin = make()
        twin.load_state_dict(roundtrip(buf.state_dict()))
        assert (twin.pos, twin.size, twin.inserted) == (buf.pos, buf.size, buf.inserted)
        rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
        for _ in range(3):
            a, b = buf.sample(16, rng_a), twin.sample(16, rng_b)
            np.testing.assert_array_equal(a[0], b[0])
            for key in a[1]:
                np.testing.assert_array_equal(a[1][key], b[1][key])
            if prioritized:
                np.testing.assert_array_equal(a[2], b[2])
        more = spread_chunk(data_rng, 9)
        buf.add(more)
        twin.add(more)
        for key in buf.data:
            np.testing.assert_array_equal(buf.data[key], twin.data[key])
        if prioritized:
            np.testing.assert_array_equal(buf.tree.sums, twin.tree.sums)
            np.testing.assert_array_equal(buf.tree.mins, twin.tree.mins)


def test_load_state_dict_rejects_another_layout():
    buf = ReplayBuffer(SCALAR, capacity=4)
    buf.add(scalar_chunk([1.0, 2.0]))
    state = buf.state_dict()
    with pytest.raises(ValueError, match="capacity 4"):
        ReplayBuffer(SCALAR, capacity=5).load_state_dict(state)
    with pytest.raises(ValueError, match="data.y"):
        ReplayBuffer([Field("y")], capacity=4).load_state_dict(state)
    with pytest.raises(ValueError, match="priorities"):
        PrioritizedReplayBuffer(SCALAR, capacity=4, alpha=0.5).load_state_dict(state)


def test_bytes_per_transition_for_spread_observations():
    # simple_spread N=3: 18 floats per agent's observation, 5 actions, a 54-float global state
    fields = transition_fields((18,), n_agents=3, n_actions=5, state_dim=54)
    by_hand = (2 * 3 * 18 * 4  # obs, next_obs float32
               + 3 * 8  # action int64 per agent
               + 4 + 1 + 4  # team reward float32, terminated bool, discount float32
               + 2 * 3 * 5  # avail, next_avail bool
               + 2 * 54 * 4)  # state, next_state float32
    buf = ReplayBuffer(fields, capacity=1000)
    assert by_hand == 927
    assert buf.bytes_per_transition == by_hand
    assert buf.nbytes == 1000 * by_hand
    per = PrioritizedReplayBuffer(fields, capacity=1000, alpha=0.6)
    assert per.nbytes == 1000 * by_hand + 2 * (2 * 1024) * 8  # sums and minima over 1024 leaves, float64


# ----------------------------------------------------------------------------- n-step
def test_n_step_windows_by_hand():
    # env 0: termination at t=1, truncation at t=3; env 1: no episode end. n = 3, gamma = 0.5
    rewards = np.array([[1, 1], [2, 1], [3, 1], [4, 1], [5, 1]], dtype=float)
    term = np.zeros((5, 2), bool)
    trunc = np.zeros((5, 2), bool)
    term[1, 0] = True
    trunc[3, 0] = True
    w = n_step_windows(rewards, term, trunc, gamma=0.5, n=3)
    # env 0: t=0 -> r0 + .5 r1 = 2, stops at the termination; t=1 -> 2; t=2 -> 3 + .5*4 = 5, stops at the
    # truncation and bootstraps from next_obs[3]; t=3 -> 4; t=4 -> 5, cut by the chunk's end
    np.testing.assert_allclose(w.returns[:, 0], [2, 2, 5, 4, 5])
    np.testing.assert_array_equal(w.last[:, 0], [1, 1, 3, 3, 4])
    np.testing.assert_allclose(w.discount[:, 0], [0.25, 0.5, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(w.terminated[:, 0], [True, True, False, False, False])
    np.testing.assert_array_equal(w.complete[:, 0], [True, True, True, True, False])
    # env 1: 1 + .5 + .25 while 3 steps fit, then the chunk's end
    np.testing.assert_allclose(w.returns[:, 1], [1.75, 1.75, 1.75, 1.5, 1])
    np.testing.assert_array_equal(w.last[:, 1], [2, 3, 4, 4, 4])
    np.testing.assert_allclose(w.discount[:, 1], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(w.terminated[:, 1], False)
    np.testing.assert_array_equal(w.complete[:, 1], [True, True, True, False, False])
    # a step both terminated and truncated is a termination
    both = n_step_windows(rewards[:, :1], term[:, :1] | trunc[:, :1], trunc[:, :1], 0.5, 3)
    np.testing.assert_array_equal(both.terminated[:, 0], [True, True, True, True, False])


def test_n_step_chunk_rows_by_hand():
    T, N = 5, 2
    obs = np.arange(T * N, dtype=np.float32).reshape(T, N, 1)  # obs[t, e] = 2t + e
    chunk = {"obs": obs, "next_obs": obs + 100, "action": np.zeros((T, N), np.int64),
             "reward": np.ones((T, N)), "terminated": np.zeros((T, N), bool), "truncated": np.zeros((T, N), bool)}
    chunk["terminated"][1, 0] = True
    chunk["truncated"][3, 0] = True
    rows = n_step_chunk(chunk, gamma=0.5, n=3)
    assert set(rows) == {"obs", "next_obs", "action", "reward", "terminated", "discount"}
    np.testing.assert_array_equal(rows["obs"][:, 0], np.arange(10))  # (t, env) order
    # next_obs taken at t + k - 1: env 0 -> [1, 1, 3, 3, 4], env 1 -> [2, 3, 4, 4, 4]
    np.testing.assert_array_equal(rows["next_obs"][0::2, 0], 100 + 2 * np.array([1, 1, 3, 3, 4]))
    np.testing.assert_array_equal(rows["next_obs"][1::2, 0], 100 + 2 * np.array([2, 3, 4, 4, 4]) + 1)
    assert rows["reward"].dtype == np.float32 and rows["discount"].dtype == np.float32
    kept = n_step_chunk(chunk, gamma=0.5, n=3, drop_incomplete=True)
    np.testing.assert_array_equal(kept["obs"][:, 0], [0, 1, 2, 3, 4, 5, 6])  # env 0's t=4, env 1's t=3, 4 dropped
    buf = ReplayBuffer(transition_fields((1,)), capacity=16)
    buf.add(rows)  # the rows have exactly the declared fields
    assert len(buf) == 10


@pytest.mark.parametrize("seed", range(4))
def test_n_step_targets_equal_comas_on_single_episodes(seed):
    """R_t + gamma^k (1 - terminated) V(next_obs[t+k-1]) against agents.coma_estimators.n_step_targets."""
    rng = np.random.default_rng(seed)
    T, n, gamma = 7, int(rng.integers(1, 5)), 0.9
    rewards = rng.normal(size=(T, 1))
    term = np.zeros((T, 1), bool)
    term[-1, 0] = bool(seed % 2)  # the episode terminates at its last step, or the chunk cuts it
    values = rng.normal(size=T + 1)  # V(obs_0..obs_T); V(next_obs[t]) = values[t + 1]
    w = n_step_windows(rewards, term, np.zeros_like(term), gamma, n)
    ours = w.returns[:, 0] + w.discount[:, 0] * (1 - w.terminated[:, 0]) * values[w.last[:, 0] + 1]
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)[None]  # noqa: E731
    ref = n_step_targets(t(rewards[:, 0]), t(term[:, 0]), t(np.ones(T)), t(values), gamma, n)[0]
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-12)


# ----------------------------------------------------------------------------- episodes
def test_episode_buffer_pads_masks_and_samples_whole_episodes():
    fields = [Field("obs", (2,)), Field("action", (), np.int64)]
    buf = EpisodeBuffer(fields, capacity=3, max_len=4)
    obs = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) + 1
    rows = buf.add({"obs": obs, "action": np.ones((2, 3), np.int64)}, lengths=[3, 2])
    np.testing.assert_array_equal(rows, [0, 1])
    np.testing.assert_array_equal(buf.data["mask"][:2], [[1, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(buf.data["obs"][0, :3], obs[0])
    assert not buf.data["obs"][1, 2:].any() and not buf.data["action"][1, 2:].any()  # padding is zeros
    assert buf.bytes_per_transition == 4 * (2 * 4 + 8 + 1)  # one episode row
    buf.add({"obs": np.ones((2, 4, 2)), "action": np.zeros((2, 4), np.int64)})  # wraps: episode 0 replaced
    assert (buf.pos, buf.size) == (1, 3)
    idx, batch = many_samples(buf, 200, np.random.default_rng(10))
    assert batch["obs"].shape == (600, 4, 2) and batch["mask"].shape == (600, 4)
    assert chisquare(np.bincount(idx, minlength=3)).pvalue > 1e-3
    twin = EpisodeBuffer(fields, capacity=3, max_len=4)
    twin.load_state_dict(roundtrip(buf.state_dict()))
    for key in buf.data:
        np.testing.assert_array_equal(buf.data[key], twin.data[key])
    with pytest.raises(ReplayConfigError, match="replay.max_episode_len=4"):
        buf.add({"obs": np.ones((1, 5, 2)), "action": np.zeros((1, 5), np.int64)})


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("make, match", [
    (lambda: ReplayBuffer(SCALAR, capacity=0), r"replay.capacity must be an integer >= 1, got 0"),
    (lambda: ReplayBuffer(SCALAR, capacity=8).check_batch_size(32),
     r"replay.capacity=8 is smaller than a batch \(batch_size=32\)"),
    (lambda: PrioritizedReplayBuffer(SCALAR, capacity=8, alpha=1.5), r"replay.alpha must lie in \[0, 1\], got 1.5"),
    (lambda: PrioritizedReplayBuffer(SCALAR, capacity=8, alpha=-0.1), r"replay.alpha must lie in \[0, 1\], got -0.1"),
    (lambda: PrioritizedReplayBuffer(SCALAR, capacity=8, alpha=0.5, priority_eps=0.0),
     r"replay.priority_eps must be a finite number > 0, got 0.0"),
    (lambda: n_step_windows(np.zeros((3, 1)), np.zeros((3, 1)), np.zeros((3, 1)), 0.9, 0),
     r"replay.n_step must be an integer >= 1, got 0"),
    (lambda: ReplayBuffer(SCALAR, capacity=8).add({"x": np.zeros((3, 2))}),
     r"replay field 'x': expected shape \(B\), got \(3, 2\)"),
    (lambda: ReplayBuffer(transition_fields((18,), n_agents=3), capacity=8).add(
        {**spread_chunk(np.random.default_rng(0), 2), "obs": np.zeros((2, 3, 17))}),
     r"unknown fields \['avail', 'next_avail'\]"),
    (lambda: ReplayBuffer([Field("obs", (3, 18)), Field("a", (3,), np.int64)], capacity=8).add(
        {"obs": np.zeros((2, 3, 17)), "a": np.zeros((2, 3), np.int64)}),
     r"replay field 'obs': expected shape \(B, 3, 18\), got \(2, 3, 17\)"),
    (lambda: ReplayBuffer([Field("obs", (2,)), Field("a", (), np.int64)], capacity=8).add(
        {"obs": np.zeros((2, 2)), "a": np.zeros(3, np.int64)}),
     r"replay field 'a': expected shape \(2\), got \(3,\)"),
    (lambda: ReplayBuffer([Field("a", (), np.int64)], capacity=8).add({"a": np.zeros(2)}),
     r"replay field 'a': cannot store float64 values as int64"),
])
def test_bad_settings_raise_one_clear_error(make, match):
    with pytest.raises(ReplayConfigError, match=match) as info:
        make()
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_bad_beta_and_empty_buffer():
    buf = PrioritizedReplayBuffer(SCALAR, capacity=8, alpha=0.5)
    with pytest.raises(ValueError, match="cannot sample from an empty replay buffer"):
        buf.sample(4, np.random.default_rng(0))
    buf.add(scalar_chunk([1.0]))
    for beta in (-0.5, 1.01):
        with pytest.raises(ReplayConfigError, match=rf"replay.beta must lie in \[0, 1\], got {beta}"):
            buf.sample(4, np.random.default_rng(0), beta=beta)
    with pytest.raises(ValueError, match="TD errors must be finite"):
        buf.update_priorities([0], [np.nan])
