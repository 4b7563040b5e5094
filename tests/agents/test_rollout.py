"""agents/rollout.py, the one rollout loop and the one evaluation loop: against loops written out by
hand here (the per-family loops they replaced), and workers pickled before the loop moved there."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from agents.actor_critic import ActorCriticWorker
from agents.mappo import TeamWorker
from agents.rollout import (AgentEpisodeBook, BatchedCopies, EpisodeBook, GymVector, ParallelCopies, Step, book_step, evaluate,
                            rollout, team_copies)
from agents.vehicular import VehicularA3CWorker
from marl_q.config import build_config
from marl_q.rundir import load_snapshot, save_snapshot
from marl_q.state_format import upgrade
from tests.agents.test_mappo import REFERENCE, _raw as team_raw
from tests.agents.test_vehicular import _raw as vehicular_raw


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


def test_after_sees_each_booked_step_with_its_episodes_and_ends_the_rollout_when_it_says():
    """``after(t, step, closed)``: called once step t is booked, with the rows of the episodes that ended
    in it (copy order); a true return ends the rollout there (batched seeds run until every seed has its
    budget). By hand on Countdown(3): the episode ends of the test above, and a stop at the step in
    which copy 2's first episode ends (step 3)."""
    vec, book = Countdown(3), EpisodeBook(3)
    seen = []

    def after(t, step, closed):
        seen.append((t, np.flatnonzero(step.ended).tolist(), [(r["copy"], r["length"]) for r in closed],
                     book.lengths.tolist()))
        return any(r["copy"] == 2 for r in closed)

    rows, steps = rollout(vec, book, None, act=lambda obs: obs * 0 + 1, row=lambda i: {"copy": i}, after=after)
    assert seen == [(0, [], [], [1, 1, 1]),
                    (1, [0], [(0, 2)], [0, 2, 2]),  # the book already closed copy 0's episode
                    (2, [1], [(1, 3)], [0, 0, 3]),
                    (3, [2], [(2, 4)], [1, 0, 0])]
    assert [(r["copy"], r["length"], r["return"]) for r in rows] == [(0, 2, 2.0), (1, 3, 33.0), (2, 4, 84.0)]
    assert steps == 4 * 3 - 2  # copy 0 restarted at step 2, copy 1 at step 3
    with pytest.raises(ValueError):
        rollout(Countdown(1), EpisodeBook(1), None, act=lambda obs: obs)


def test_a_deferred_step_is_counted_and_stored_but_booked_by_its_caller():
    """``Step.deferred``: the loop counts and stores the step but leaves it out of the book; ``book_step``
    books it as resolved later (routing books a commit when the service's reply comes). Booking each
    deferred step before the next is made gives the rows and book of the loop that knew every reward."""
    vec, book = Countdown(3), EpisodeBook(3)
    want, want_steps = rollout(vec, book, 9, act=lambda obs: obs * 0 + 1, row=lambda i: {"copy": i})

    class Deferring(Countdown):
        """Countdown whose odd steps' rewards come later: they are held in ``held``."""

        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.k, self.held = 0, None

        def step(self, actions: np.ndarray) -> Step:
            step = super().step(actions)
            self.k += 1
            if self.k % 2:
                self.held = step
                return Step(step.valid, np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=bool), deferred=True)
            return step

    vec, book2 = Deferring(3), EpisodeBook(3)
    rows, stored, steps = [], [], 0
    for _ in range(9):
        got, taken = rollout(vec, book2, 1, act=lambda obs: obs * 0 + 1, store=lambda t, o, a, s: stored.append(s.deferred),
                             row=lambda i: {"copy": i})
        assert got == [] or not stored[-1]  # the loop booked no deferred step
        rows += got
        steps += taken
        if vec.held is not None:  # its reply: booked now
            rows += book_step(book2, vec.held, row=lambda i: {"copy": i})
            vec.held = None
    assert stored == [True, False] * 4 + [True] and steps == want_steps
    assert rows == want
    np.testing.assert_array_equal(book2.returns, book.returns)
    np.testing.assert_array_equal(book2.lengths, book.lengths)


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


def test_parallel_copies_restart_on_the_next_step_and_sum_the_team_reward():
    worker = TeamWorker(build_config(team_raw("ippo", REFERENCE, envs_per_worker=2, n_steps=5)), 0)
    vec = ParallelCopies(worker.envs, worker.desc.agents, False)
    step = vec.step(np.zeros(4, dtype=np.int64))  # both copies start pending: this step only resets them
    data = step.data
    assert not step.valid.any() and not vec.pending_reset.any()
    assert not data.live.any() and not data.dones.any() and not data.rewards.any()
    step = vec.step(np.zeros(4, dtype=np.int64))
    assert step.valid.all() and step.data.live.all() and not step.ended.any() and not step.data.dones.any()
    for e in range(2):
        assert step.reward[e] == step.data.rewards[e, 0] + step.data.rewards[e, 1]



def assert_same_team_step(batched, one_by_one, actions, obs_dim: int, t: int):
    """Two team vectors over the same copies: equal rows and states now, then equal steps (valid, reward,
    ended and every TeamStep field) under ``actions``, bit for bit; the first vector's step."""
    E, N = batched.num_envs, len(batched.agents)
    got, want = np.empty((E, N, obs_dim), np.float32), np.empty((E, N, obs_dim), np.float32)
    got_s, want_s = np.empty((E, N * obs_dim), np.float32), np.empty((E, N * obs_dim), np.float32)
    batched.rows(got, got_s)
    one_by_one.rows(want, want_s)
    assert got.tobytes() == want.tobytes() and got_s.tobytes() == want_s.tobytes(), t
    a, b = batched.step(actions), one_by_one.step(actions)
    for field in ("valid", "reward", "ended"):
        assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), (t, field)
    for field in ("live", "rewards", "terminated", "dones"):
        assert getattr(a.data, field).tobytes() == getattr(b.data, field).tobytes(), (t, field)
    return a


def _spread_copies(n_copies: int, n_agents: int = 3, max_cycles: int = 25):
    from scenarios.spread_native import SpreadNative
    envs = []
    for k in range(n_copies):
        env = SpreadNative(N=n_agents, local_ratio=0.5, max_cycles=max_cycles)
        env.reset(seed=1000 + k)
        envs.append(env)
    return envs


@pytest.mark.parametrize("n_agents, max_cycles", [(3, 25), (4, 7)])
def test_batched_spread_equals_the_copies_stepped_one_by_one(n_agents, max_cycles):
    """The vectorised spread (every copy and agent in one call) against the same copies stepped one at
    a time through ParallelCopies: observations, states, rewards, terminations, truncations (dones),
    valid/ended and the team reward, equal bit for bit over 2,000 cycles of random actions."""
    E = 5
    agents = [f"agent_{i}" for i in range(n_agents)]
    one_by_one = ParallelCopies(_spread_copies(E, n_agents, max_cycles), agents, False)
    batched = team_copies(_spread_copies(E, n_agents, max_cycles), agents, False)
    assert isinstance(batched, BatchedCopies) and type(one_by_one) is ParallelCopies
    rng = np.random.default_rng(7)
    D = 6 * n_agents
    ended = 0
    for t in range(2000):
        a = assert_same_team_step(batched, one_by_one, rng.integers(0, 5, size=E * n_agents), D, t)
        ended += int(a.ended.sum())
    assert ended == E * (2000 // (max_cycles + 1))  # every episode ran to its time limit
    with pytest.raises(ValueError, match="actions must be"):
        batched.step(np.full(E * n_agents, 5))


def test_batched_spread_compiled_and_plain_loops_agree(monkeypatch):
    """SpreadBatch's loops compiled by numba and run as plain Python (``MARLQ_KERNELS=0``'s path): the
    same observations, positions, velocities, rewards and truncations bit for bit, with some copies left
    out of each step (they stay as they were) and copies reset along the way."""
    from marl_q import compiled
    from scenarios import spread_native

    compiled_kernels = spread_native.kernels()
    if compiled.allowed():  # numba is a dependency: the default path is the compiled one
        assert all(hasattr(f, "py_func") for f in compiled_kernels)
    plain = (spread_native._contact_py, spread_native._step_py, spread_native._observe_py)
    batches = [spread_native.SpreadNative.batched(_spread_copies(4, 3, 9)) for _ in range(2)]
    rng = np.random.default_rng(3)
    for t in range(300):
        active = rng.random(4) < 0.7
        actions = rng.integers(0, 5, size=(4, 3))
        out = []
        for batch, kernels in zip(batches, (compiled_kernels, plain)):
            monkeypatch.setattr(spread_native, "_KERNELS", kernels)
            before = batch.pos.copy()
            rewards, terminated, truncated = batch.step(actions, active)
            assert (batch.pos[~active] == before[~active]).all() and not rewards[~active].any()
            assert not terminated.any() and not truncated[~active].any()
            out.append((batch.observations().tobytes(), batch.pos.tobytes(), batch.vel.tobytes(),
                        rewards.tobytes(), truncated.tobytes()))
            for e in np.flatnonzero(truncated):
                batch.reset(int(e))
        assert out[0] == out[1], t
    monkeypatch.setattr(spread_native, "_KERNELS", plain)
    with pytest.raises(ValueError, match="actions must be"):
        batches[1].step(np.full((4, 3), -1))


def test_batched_spread_evaluates_as_the_copies_do():
    """Greedy evaluation through the batched vector (copies reset with seeds) gives the returns of the
    copies stepped one by one."""
    agents = ["agent_0", "agent_1", "agent_2"]
    seeds = [11, 12, 13]
    greedy = lambda vec: (lambda rows: rows.sum(axis=2).reshape(-1).astype(np.int64) % 5)  # noqa: E731

    def play(vec):
        buf = np.empty((3, 3, 18), np.float32)

        def act(v):
            v.rows(buf)
            return greedy(v)(np.floor(buf * 10))
        return evaluate(vec, 7, act)

    a = play(team_copies(_spread_copies(3), agents, False, reset_seeds=seeds))
    b = play(ParallelCopies(_spread_copies(3), agents, False, reset_seeds=seeds))
    assert a == b and len(a) == 7


def test_team_worker_rollouts_alike_on_both_vectors():
    """A MAPPO worker on spread (native engine: the batched vector) gives the same rollout batches as
    the same worker whose copies are stepped one by one."""
    raw = team_raw("mappo", REFERENCE, envs_per_worker=3, n_steps=30)
    raw["scenario"] = {"name": "spread", "n_agents": 3, "max_cycles": 25}
    cfg = build_config(raw)
    fast, slow = TeamWorker(cfg, 0), TeamWorker(cfg, 0)
    assert isinstance(fast.vec, BatchedCopies)
    slow.vec = ParallelCopies(slow.envs, slow.desc.agents, False)
    for _ in range(3):
        (b1, e1, s1), (b2, e2, s2) = fast.rollout(), slow.rollout()
        assert sorted(b1) == sorted(b2) and e1 == e2 and s1 == s2
        for key in b1:
            assert b1[key].tobytes() == b2[key].tobytes(), key
        fast.learn(b1)
        slow.learn(b2)
        assert fast.flat.numpy().tobytes() == slow.flat.numpy().tobytes()


# ----------------------------------------------------------------------------- old snapshots
def _same_but_unknown_agent_returns(rows, old_rows):
    """The episode rows of a worker and of its twin from a snapshot that kept no per-agent returns
    (state format 1, migrated): alike, but for the per-agent returns of the episodes under way at the
    snapshot, NaN in the twin's (marl_q.state_format._v1_to_v2)."""
    assert len(rows) == len(old_rows)
    for row, old in zip(rows, old_rows):
        assert {k: v for k, v in row.items() if k != "agent_returns"} == \
               {k: v for k, v in old.items() if k != "agent_returns"}
        if "agent_returns" in old:
            assert all(a == b or np.isnan(b) for a, b in zip(row["agent_returns"], old["agent_returns"]))


def _continues_alike(worker, old_fields, tmp_path):
    """A worker snapshotted with its rollout state under the old field names continues exactly as the
    same snapshot in today's format: the same next rollouts (batch, episodes, steps) and book."""
    digest = save_snapshot(tmp_path / "w.pkl", {"worker": worker})
    twin, loaded = (load_snapshot(tmp_path / "w.pkl", digest)["worker"] for _ in range(2))
    state = dict(loaded.__dict__)
    state.update(old_fields(state.pop("vec"), state.pop("book")))
    back = type(worker).__new__(type(worker))
    back.__dict__.update(state)  # what unpickling an old snapshot does
    upgrade({"workers": [back]}, 0)  # and then its migration to state format 1
    assert "vec" in back.__dict__ and "ep_return" not in back.__dict__
    for _ in range(2):
        (b1, e1, s1), (b2, e2, s2) = twin.rollout(), back.rollout()
        _same_but_unknown_agent_returns(e1, e2)
        assert sorted(b1) == sorted(b2) and s1 == s2
        for key in b1:
            np.testing.assert_array_equal(b1[key], b2[key], err_msg=key)
    np.testing.assert_array_equal(twin.book.returns, back.book.returns)


def test_an_actor_critic_worker_pickled_before_the_rollout_core_resumes_exactly(small_raw, tmp_path):
    small_raw["scenario"]["max_episode_steps"] = 7
    small_raw["algorithm"]["n_steps"] = 6
    worker = ActorCriticWorker(build_config(small_raw), 0)
    worker.rollout()
    _continues_alike(worker, lambda vec, book: {"obs": vec.obs, "prev_done": vec.prev_done, "ep_return": book.returns,
                                                "ep_length": book.lengths, "n_envs": vec.num_envs}, tmp_path)


def test_a_team_worker_pickled_before_the_rollout_core_resumes_exactly(tmp_path):
    worker = TeamWorker(build_config(team_raw("mappo", REFERENCE, n_steps=7)), 0)
    worker.rollout()
    _continues_alike(worker, lambda vec, book: {"obs": vec.obs, "infos": vec.infos, "pending_reset": vec.pending_reset,
                                                "ep_return": book.returns, "ep_length": book.lengths}, tmp_path)


def test_a_team_worker_of_state_format_1_continues_with_per_agent_returns(tmp_path):
    """A team worker snapshotted before per-agent returns (a plain EpisodeBook, state format 1) is
    migrated to an AgentEpisodeBook: the same rollouts and returns as its twin, per-agent returns for
    every episode that starts after the snapshot, NaN for the ones under way at it."""
    worker = TeamWorker(build_config(team_raw("mappo", REFERENCE, n_steps=7)), 0)
    worker.rollout()
    digest = save_snapshot(tmp_path / "w.pkl", {"worker": worker})
    twin, back = (load_snapshot(tmp_path / "w.pkl", digest)["worker"] for _ in range(2))
    under_way = back.book.lengths > 0
    assert under_way.any()
    back.book = EpisodeBook.resumed(back.book.returns, back.book.lengths)  # what a version-1 file holds
    upgrade({"workers": [back]}, 1)
    assert type(back.book) is AgentEpisodeBook
    np.testing.assert_array_equal(np.isnan(back.book.agent_returns).any(axis=1), under_way)
    rows, old_rows = [], []
    for _ in range(8):
        (b1, e1, s1), (b2, e2, s2) = twin.rollout(), back.rollout()
        assert s1 == s2
        rows += e1
        old_rows += e2
        for key in b1:
            np.testing.assert_array_equal(b1[key], b2[key], err_msg=key)
    _same_but_unknown_agent_returns(rows, old_rows)
    unknown = [bool(np.isnan(r["agent_returns"]).any()) for r in old_rows]
    assert sum(unknown) == int(under_way.sum()) and len(unknown) > sum(unknown)
    assert not any(unknown[sum(unknown):])  # only the first episode of each copy


def test_a_vehicular_worker_pickled_before_the_rollout_core_resumes_exactly(tmp_path):
    worker = VehicularA3CWorker(build_config(vehicular_raw()), 0)
    worker.ac.n_steps = 8
    worker.rollout()
    _continues_alike(worker, lambda vec, book: {"obs": vec.obs, "episode": vec.episode, "ep_return": float(book.returns[0]),
                                                "ep_length": int(book.lengths[0]), "ep_coverage": vec.coverage,
                                                "ep_relay": vec.relay}, tmp_path)


@pytest.mark.parametrize("alg", ["ippo", "mappo"])
def test_the_critic_reads_the_state_as_its_family_says(alg):
    worker = TeamWorker(build_config(team_raw(alg, REFERENCE)), 0)
    assert worker.central == worker.desc.central == (alg == "mappo")


# ----------------------------------------------------------------------------- seeded model builds
def test_a_model_build_draws_what_manual_seed_drew_and_leaves_the_callers_stream_alone(small_raw):
    import torch

    from agents.actor_critic import build_models
    from agents.heads import build_head

    cfg = build_config(small_raw)
    env = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")])
    torch.manual_seed(123)
    before = torch.random.get_rng_state().clone()
    actor, critic = build_models(cfg, env.single_observation_space, env.single_action_space)
    assert torch.equal(torch.random.get_rng_state(), before)  # no fork_rng needed around a build
    torch.manual_seed(cfg.run.seed)  # the reference: what the build did before seeded_init
    ref_actor, ref_critic = build_head(cfg.actor, 4, 2), build_head(cfg.critic, 4, 1)
    for got, want in ((actor, ref_actor), (critic, ref_critic)):
        for a, b in zip(got.parameters(), want.parameters(), strict=True):
            assert torch.equal(a, b)


def test_the_vehicular_evaluation_matches_the_loop_it_replaced():
    """analysis.vehicular.evaluate_policy on the shared loop against its old per-episode loop."""
    from agents.vehicular import BASELINES
    from analysis.vehicular import evaluate_policy, make_relay_env
    from marl_q.seeding import vehicular_eval_episode_seed

    cfg = build_config(vehicular_raw())
    for name, make in BASELINES.items():
        env = make_relay_env(cfg.scenario.params, penetration=0.3)
        got = evaluate_policy(env, make(env.cfg, 4), seed=11, episodes=2)
        policy, coverage, reward = make(env.cfg, 4), [], []
        for ep in range(2):
            obs, _ = env.reset(seed=vehicular_eval_episode_seed(11, ep))
            while env.agents:
                obs, rew, _, _, _ = env.step(policy({a: obs[a] for a in env.agents}))
                coverage.append(env.metrics["coverage"])
                if rew:
                    reward.append(float(np.mean(list(rew.values()))))
        assert got["coverage"] == float(np.mean(coverage)) and got["reward"] == float(np.mean(reward)), name


def test_the_routing_replay_matches_the_loop_it_replaced():
    """agents.routing.evaluate_routing on the shared evaluation loop against its old request-by-request
    loop (written out), for the three heuristics on two demands, the seed alternating (0 or 5): the same
    outcomes."""
    from agents.routing import HEURISTICS, evaluate_routing
    from scenarios.routing import AgentStream, RoutingConfig, RoutingWorld

    released = []  # the releases of holdings whose time has passed: the window must reach some

    def old_loop(world, policy, start_s, end_s, seed):
        resources = world.new_resources()
        stream = AgentStream(world, world.services, np.random.default_rng(seed), False, start_s=start_s,
                             horizon_s=end_s - start_s)
        while stream.advance() is not None:
            for rid in stream.take_releases():
                resources.release(rid)
                released.append(rid)
            while True:
                snap = resources.snapshot()
                obs, feasible = stream.observe(snap)
                plan = stream.act(policy(stream.current.service, obs, feasible), feasible)
                if plan.delta is None:
                    break
                _, finished = stream.resolve(plan, resources.commit(plan.delta, snap.version).accepted)
                if finished:
                    break
        for rid in stream.release_all():
            resources.release(rid)
        return stream.outcomes

    kinds = set()
    for shift in ("none", "urllc_surge"):
        world = RoutingWorld(RoutingConfig(load_scale=3.0, max_replans=2), shift)
        for k, (name, make) in enumerate(HEURISTICS.items()):
            for seed in ((0, 5)[(k + (shift != "none")) % 2],):
                # 30 s of demand: 500-700 requests per heuristic here (was 120 s), with releases and rejections
                got = evaluate_routing(world, make(seed), False, 0.0, 30.0, seed)
                want = old_loop(world, make(seed), 0.0, 30.0, seed)
                assert len(got) > 20 and got == want, (shift, name, seed)
                kinds |= {o.outcome for o in got}
    assert len(kinds) >= 3, kinds  # accepted, rejected and infeasible requests at least
    assert released  # holdings ended within the window: the release path was compared too
    empty = evaluate_routing(RoutingWorld(RoutingConfig()), HEURISTICS["uniform_random"](0), False, 0.0, 0.0, 0)
    assert empty == []
