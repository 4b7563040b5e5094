"""The four LSVI agents' logic, driven by a tiny serial loop (no runtime): who uploads when, and what they plan."""
from __future__ import annotations

import numpy as np
import pytest

from agents.lsvi_agents import (AsyncCoopAgent, CoopSyncAgent, IndependentAgent, LsviServerRecord,
                                PooledAgent)
from scenarios.linear_mdp import LinearMDP
from tests.agents.test_lsvi_planner import brute_force_trigger, from_scratch_q

LAM, BETA = 1.0, 0.5


def tiny_mdp() -> LinearMDP:
    return LinearMDP(n_states=4, n_actions=3, d=3, horizon=3, seed=9)


def drive(agents, server, broadcast, episodes, seed, before=None, after=None):
    """Serial loop: the scheduled agent plays, uploads if it wants, and downloads reach the recipients."""
    rng = np.random.default_rng(seed)
    schedule = rng.integers(len(agents), size=episodes)
    for k, m in enumerate(schedule):
        agent = agents[m]
        if before:
            before(k, m, agent)
        result = agent.play_episode(rng)
        uploaded = None
        if agent.wants_upload():
            uploaded = agent.take_upload()
            server.absorb(uploaded)
            download = server.download()
            starts_sync = broadcast and not getattr(agent, "answers_request", False)
            recipients = range(len(agents)) if starts_sync else [m]
            for r in recipients:
                if isinstance(agents[r], CoopSyncAgent) and r != m:
                    agents[r].request_sync()
                agents[r].receive(download)
        if after:
            after(k, m, agent, result, uploaded)


def as_rows(result):
    return [(h, result.states[h], result.actions[h], result.rewards[h], result.next_states[h])
            for h in range(len(result.states))]


def test_pooled_agents_plan_exactly_like_one_from_scratch_learner_on_all_data():
    mdp = tiny_mdp()
    agents = [PooledAgent(mdp, LAM, BETA) for _ in range(3)]
    server = LsviServerRecord(mdp.phi, mdp.horizon, LAM)
    data = []

    def before(k, m, agent):
        np.testing.assert_allclose(agent.q_values, from_scratch_q(mdp, data, LAM, BETA), atol=1e-9)

    def after(k, m, agent, result, uploaded):
        data.extend(as_rows(result))
        assert uploaded is not None and len(uploaded.rewards) == mdp.horizon

    drive(agents, server, broadcast=True, episodes=25, seed=0, before=before, after=after)
    assert server.transitions_received == 25 * mdp.horizon


def test_independent_agents_plan_from_their_own_data_only_and_never_upload():
    mdp = tiny_mdp()
    agents = [IndependentAgent(mdp, LAM, BETA) for _ in range(2)]
    own = {0: [], 1: []}

    def before(k, m, agent):
        np.testing.assert_allclose(agent.q_values, from_scratch_q(mdp, own[m], LAM, BETA), atol=1e-9)

    def after(k, m, agent, result, uploaded):
        own[m].extend(as_rows(result))
        assert uploaded is None

    drive(agents, LsviServerRecord(mdp.phi, mdp.horizon, LAM), False, 20, 1, before, after)


@pytest.mark.parametrize("alpha", [0.05, 0.5, 5.0])
def test_async_agent_uploads_exactly_when_the_determinant_condition_holds(alpha):
    mdp = tiny_mdp()
    agents = [AsyncCoopAgent(mdp, LAM, BETA, alpha) for _ in range(3)]
    server = LsviServerRecord(mdp.phi, mdp.horizon, LAM)
    since_upload = {m: [] for m in range(3)}
    uploaded_rows = []
    counts = {"uploads": 0, "quiet": 0}
    snapshot = {}

    def before(k, m, agent):
        snapshot["server_gram"] = agent.server.gram.copy()
        snapshot["q"] = agent.q_values.copy()

    def after(k, m, agent, result, uploaded):
        since_upload[m].extend(as_rows(result))
        local = np.zeros((mdp.horizon, mdp.d, mdp.d))
        for h, s, a, _, _ in since_upload[m]:
            local[h] += np.outer(mdp.phi[s, a], mdp.phi[s, a])
        assert (uploaded is not None) == brute_force_trigger(snapshot["server_gram"], local, alpha)
        if uploaded is None:
            counts["quiet"] += 1
            np.testing.assert_array_equal(agent.q_values, snapshot["q"])  # policy fixed between syncs
            return
        counts["uploads"] += 1
        np.testing.assert_allclose(uploaded.gram, local, atol=1e-12)
        assert sorted(map(tuple, uploaded.transitions.tolist())) == sorted(
            (h, s, a, s2) for h, s, a, _, s2 in since_upload[m])
        uploaded_rows.extend(since_upload[m])
        since_upload[m] = []
        np.testing.assert_allclose(agent.q_values, from_scratch_q(mdp, uploaded_rows, LAM, BETA), atol=1e-9)

    drive(agents, server, broadcast=False, episodes=60, seed=2, before=before, after=after)
    assert counts["uploads"] > 0 and counts["quiet"] > 0


def test_async_agent_that_plans_with_local_data_replans_every_episode():
    mdp = tiny_mdp()
    agent = AsyncCoopAgent(mdp, LAM, BETA, alpha=100.0, use_local_data_for_planning=True)
    rng = np.random.default_rng(4)
    data = []
    for _ in range(8):
        data.extend(as_rows(agent.play_episode(rng)))
        np.testing.assert_allclose(agent.q_values, from_scratch_q(mdp, data, LAM, BETA), atol=1e-9)


def test_coop_sync_requests_every_other_agent_to_upload_after_a_sync():
    mdp = tiny_mdp()
    agents = [CoopSyncAgent(mdp, LAM, BETA, sync_threshold=0.5) for _ in range(3)]
    server = LsviServerRecord(mdp.phi, mdp.horizon, LAM)
    events, starts = [], []

    def after(k, m, agent, result, uploaded):
        events.append((m, uploaded is not None, uploaded is not None and not agent.answers_request))
        if uploaded is not None:
            assert not agent.sync_requested
            np.testing.assert_allclose(agent.server.gram, server.gram)
            if not agent.answers_request:  # a sync started: everyone has the server's statistics
                for other in agents:
                    np.testing.assert_allclose(other.server.gram, server.gram)
                    starts.append(k)

    drive(agents, server, broadcast=True, episodes=40, seed=3, after=after)
    assert sum(up for _, up, _ in events) >= 2 and starts
    assert sum(up for _, up, _ in events) < len(events)  # answering uploads do not start new syncs
    requested_at = {}
    for step, (m, up, started) in enumerate(events):
        if m in requested_at and not up:
            raise AssertionError(f"agent {m} was asked to sync at episode {requested_at[m]} but did not upload")
        requested_at.pop(m, None)
        if started:
            requested_at.update({o: step for o in range(3) if o != m})


def test_regret_is_exact_and_non_negative():
    mdp = tiny_mdp()
    agent = PooledAgent(mdp, LAM, BETA)
    rng = np.random.default_rng(0)
    v_star = mdp.optimal_values()[0][0]
    policy_values = mdp.evaluate(agent.q_values.argmax(axis=2))[0]
    result = agent.play_episode(rng)
    assert result.regret == pytest.approx(v_star[result.initial_state] - policy_values[result.initial_state])
    assert result.regret >= -1e-12


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_non_positive_alpha_and_threshold_are_rejected(bad):
    with pytest.raises(ValueError, match="alpha"):
        AsyncCoopAgent(tiny_mdp(), LAM, BETA, bad)
    with pytest.raises(ValueError, match="sync_threshold"):
        CoopSyncAgent(tiny_mdp(), LAM, BETA, bad)


def test_an_episode_on_the_rollout_core_matches_the_loop_it_replaced():
    """play_episode steps the MDP through agents.rollout.rollout (MDPEpisode): against its old loop
    (written out), on a policy that changes between episodes, the same states, actions, rewards, next
    states and first state, and the generator left where the old loop left it."""
    mdp = LinearMDP(n_states=6, n_actions=3, d=4, horizon=5, seed=2)

    def old_loop(policy, rng):
        uniforms = rng.random(mdp.horizon + 1)
        state = int(uniforms[0] * mdp.n_states)
        initial = state
        states, actions, next_states = (np.empty(mdp.horizon, dtype=np.int64) for _ in range(3))
        for h in range(mdp.horizon):
            action = int(policy[h, state])
            states[h], actions[h] = state, action
            state = mdp.sample_next_state(h, state, action, uniforms[h + 1])
            next_states[h] = state
        return initial, states, actions, mdp.rewards[np.arange(mdp.horizon), states, actions], next_states

    agent = IndependentAgent(mdp, LAM, BETA)
    rng, twin = np.random.default_rng(4), np.random.default_rng(4)
    seen = set()
    for _ in range(30):
        want = old_loop(agent.policy.copy(), twin)
        got = agent.play_episode(rng)  # (re-plans after it: the next episode's policy differs)
        assert got.initial_state == want[0]
        for a, b in zip((got.states, got.actions, got.rewards, got.next_states), want[1:]):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
        seen |= {tuple(got.actions)}
        assert rng.bit_generator.state == twin.bit_generator.state
    assert len(seen) > 1
