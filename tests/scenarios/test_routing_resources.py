"""The shared resource environment: optimistic commits, refusals, releases, and their invariants.

The reference for every check is an independent model: plain Python dicts of what each accepted
request took, summed with loops, never the environment's own arrays.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scenarios.routing_resources import ResourceDelta, ResourceError, SharedResources

N_LINKS, N_NODES = 5, 3


def delta(rid: int, links: list[int], link_amt: list[int], nodes: list[int], node_amt: list[int]) -> ResourceDelta:
    return ResourceDelta(rid, np.array(links, dtype=np.int64), np.array(link_amt, dtype=np.int64),
                         np.array(nodes, dtype=np.int64), np.array(node_amt, dtype=np.int64))


def test_commit_applies_exactly_and_release_gives_it_back() -> None:
    env = SharedResources(np.array([10, 10, 10]), np.array([5]))
    snap = env.snapshot()
    result = env.commit(delta(1, [0, 2], [4, 3], [0], [2]), snap.version)
    assert result.accepted and result.version == 1 and not result.stale
    assert env.link_residual.tolist() == [6, 10, 7] and env.node_residual.tolist() == [3]
    env.release(1)
    assert env.link_residual.tolist() == [10, 10, 10] and env.node_residual.tolist() == [5]
    assert env.version == 2 and env.holdings == {}


def test_commit_exceeding_capacity_is_refused_and_changes_nothing() -> None:
    env = SharedResources(np.array([10, 10]), np.array([5]))
    env.commit(delta(1, [0], [7], [0], [1]), 0)
    before = (env.link_residual.copy(), env.node_residual.copy(), env.version, dict(env.holdings))
    result = env.commit(delta(2, [0, 1], [4, 1], [0], [1]), env.version)   # link 0 has 3 left
    assert not result.accepted and result.reason == "insufficient capacity"
    assert np.array_equal(env.link_residual, before[0]) and np.array_equal(env.node_residual, before[1])
    assert env.version == before[2] and env.holdings == before[3]
    assert env.counters.refused == 1 and env.counters.conflicts == 0   # planned on a fresh snapshot


def test_stale_snapshot_alone_is_no_conflict() -> None:
    env = SharedResources(np.array([10, 10]), np.array([10]))
    old = env.snapshot()
    env.commit(delta(1, [0], [5], [], []), old.version)
    result = env.commit(delta(2, [1], [5], [0], [5]), old.version)        # stale but still fits
    assert result.accepted and result.stale
    assert env.counters.stale_commits == 1 and env.counters.conflicts == 0


def test_lost_race_is_a_conflict() -> None:
    env = SharedResources(np.array([10]), np.array([0]))
    snap = env.snapshot()
    assert env.commit(delta(1, [0], [6], [], []), snap.version).accepted
    result = env.commit(delta(2, [0], [6], [], []), snap.version)         # fit on the snapshot, not now
    assert not result.accepted and result.stale and env.counters.conflicts == 1


def test_duplicate_links_in_one_delta_are_summed() -> None:
    env = SharedResources(np.array([10]), np.array([0]))
    assert not env.commit(delta(1, [0, 0], [6, 6], [], []), 0).accepted
    assert env.commit(delta(2, [0, 0], [5, 5], [], []), 0).accepted and env.link_residual.tolist() == [0]


def test_double_release_is_an_error_and_changes_nothing() -> None:
    env = SharedResources(np.array([10]), np.array([10]))
    env.commit(delta(1, [0], [4], [0], [4]), 0)
    env.release(1)
    state = (env.link_residual.copy(), env.version)
    with pytest.raises(ResourceError, match="request 1 holds no resources"):
        env.release(1)
    with pytest.raises(ResourceError, match="request 9 holds no resources"):
        env.release(9)
    assert np.array_equal(env.link_residual, state[0]) and env.version == state[1]


@pytest.mark.parametrize("bad, message", [
    (delta(1, [7], [1], [], []), "link index out of range"),
    (delta(1, [0], [-1], [], []), "negative link amount"),
    (delta(1, [], [], [0, 1], [1]), "must be 1-D arrays of equal length"),
])
def test_malformed_deltas_are_named(bad: ResourceDelta, message: str) -> None:
    env = SharedResources(np.array([10, 10]), np.array([10]))
    with pytest.raises(ResourceError, match=message):
        env.commit(bad, 0)
    assert env.version == 0 and env.counters.commits == 0


def test_a_request_cannot_commit_twice() -> None:
    env = SharedResources(np.array([10]), np.array([10]))
    assert env.commit(delta(1, [0], [1], [], []), 0).accepted
    result = env.commit(delta(1, [0], [1], [], []), 1)
    assert not result.accepted and "already holds" in result.reason and env.link_residual.tolist() == [9]


def test_snapshots_are_read_only_copies() -> None:
    env = SharedResources(np.array([10]), np.array([10]))
    snap = env.snapshot()
    env.commit(delta(1, [0], [3], [], []), 0)
    assert snap.link_residual.tolist() == [10] and snap.version == 0
    with pytest.raises(ValueError):
        snap.link_residual[0] = 1


class ConcurrentCommits(RuleBasedStateMachine):
    """Several agents plan on snapshots of their own age and commit in any interleaving."""

    @initialize(links=st.lists(st.integers(0, 30), min_size=N_LINKS, max_size=N_LINKS),
                nodes=st.lists(st.integers(0, 30), min_size=N_NODES, max_size=N_NODES))
    def start(self, links: list[int], nodes: list[int]) -> None:
        self.env = SharedResources(np.array(links), np.array(nodes))
        self.capacity_links, self.capacity_nodes = list(links), list(nodes)
        self.snapshots = {agent: self.env.snapshot() for agent in range(3)}
        self.taken: dict[int, tuple[list[int], list[int]]] = {}   # reference model: request -> per-resource totals
        self.released: set[int] = set()
        self.next_id = 0

    @rule(agent=st.integers(0, 2))
    def refresh(self, agent: int) -> None:
        self.snapshots[agent] = self.env.snapshot()

    @rule(agent=st.integers(0, 2), data=st.data())
    def plan_and_commit(self, agent: int, data: st.DataObject) -> None:
        snap = self.snapshots[agent]
        links = data.draw(st.lists(st.integers(0, N_LINKS - 1), max_size=4))
        nodes = data.draw(st.lists(st.integers(0, N_NODES - 1), max_size=2))
        link_amt = [data.draw(st.integers(0, 12)) for _ in links]
        node_amt = [data.draw(st.integers(0, 12)) for _ in nodes]
        rid = self.next_id
        self.next_id += 1
        need_l = [sum(a for l, a in zip(links, link_amt) if l == i) for i in range(N_LINKS)]
        need_n = [sum(a for n, a in zip(nodes, node_amt) if n == i) for i in range(N_NODES)]
        fits_now = all(need_l[i] <= int(self.env.link_residual[i]) for i in range(N_LINKS)) and \
            all(need_n[i] <= int(self.env.node_residual[i]) for i in range(N_NODES))
        before = (self.env.link_residual.copy(), self.env.node_residual.copy(), self.env.version)
        result = self.env.commit(delta(rid, links, link_amt, nodes, node_amt), snap.version)
        assert result.accepted == fits_now, "a commit is accepted iff it fits the current state"
        assert result.stale == (snap.version < before[2])
        if result.accepted:
            self.taken[rid] = (need_l, need_n)
            assert self.env.version == before[2] + 1
        else:
            assert np.array_equal(self.env.link_residual, before[0])
            assert np.array_equal(self.env.node_residual, before[1]) and self.env.version == before[2]

    @precondition(lambda self: bool(self.taken))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.taken)))
        before_l, before_n = self.env.link_residual.copy(), self.env.node_residual.copy()
        self.env.release(rid)
        need_l, need_n = self.taken.pop(rid)
        assert (self.env.link_residual - before_l).tolist() == need_l, "release gives back exactly what was taken"
        assert (self.env.node_residual - before_n).tolist() == need_n
        self.released.add(rid)

    @rule(agent=st.integers(0, 2), data=st.data())
    def releases_and_commit_in_one_message(self, agent: int, data: st.DataObject) -> None:
        """What a worker's message does: give back some holdings, then commit, as one version step."""
        snap = self.snapshots[agent]
        give_back = data.draw(st.lists(st.sampled_from(sorted(self.taken)), unique=True)) if self.taken else []
        links = data.draw(st.lists(st.integers(0, N_LINKS - 1), max_size=3))
        link_amt = [data.draw(st.integers(0, 12)) for _ in links]
        rid = self.next_id
        self.next_id += 1
        freed = [sum(self.taken[r][0][i] for r in give_back) for i in range(N_LINKS)]
        need_l = [sum(a for l, a in zip(links, link_amt) if l == i) for i in range(N_LINKS)]
        fits = all(need_l[i] <= int(self.env.link_residual[i]) + freed[i] for i in range(N_LINKS))
        version = self.env.version
        result = self.env.transact(give_back, delta(rid, links, link_amt, [], []), snap.version)
        assert result.accepted == fits
        assert self.env.version == version + int(bool(give_back) or fits)
        for r in give_back:
            self.taken.pop(r)
            self.released.add(r)
        if fits:
            self.taken[rid] = (need_l, [0] * N_NODES)

    @precondition(lambda self: bool(self.released))
    @rule(data=st.data())
    def bad_release_in_a_message_changes_nothing(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.released)))
        before = (self.env.link_residual.copy(), self.env.version, dict(self.env.holdings))
        good = sorted(self.taken)[:1]
        with pytest.raises(ResourceError):
            self.env.transact(good + [rid], delta(self.next_id, [0], [0], [], []), self.env.version)
        assert np.array_equal(self.env.link_residual, before[0]) and self.env.version == before[1]
        assert self.env.holdings == before[2]

    @precondition(lambda self: bool(self.released))
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.released)))
        before = (self.env.link_residual.copy(), self.env.version)
        with pytest.raises(ResourceError):
            self.env.release(rid)
        assert np.array_equal(self.env.link_residual, before[0]) and self.env.version == before[1]

    @invariant()
    def bookkeeping_is_exact(self) -> None:
        if not hasattr(self, "env"):
            return
        assert (self.env.link_residual >= 0).all() and (self.env.node_residual >= 0).all()
        for i in range(N_LINKS):
            held = sum(need_l[i] for need_l, _ in self.taken.values())
            assert held + int(self.env.link_residual[i]) == self.capacity_links[i]
        for i in range(N_NODES):
            held = sum(need_n[i] for _, need_n in self.taken.values())
            assert held + int(self.env.node_residual[i]) == self.capacity_nodes[i]
        assert set(self.env.holdings) == set(self.taken)


ConcurrentCommits.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestConcurrentCommits = ConcurrentCommits.TestCase


@settings(max_examples=50, deadline=None)
@given(amounts=st.lists(st.integers(1, 8), min_size=1, max_size=12), cap=st.integers(1, 40))
def test_racing_agents_from_one_snapshot_never_overbook(amounts: list[int], cap: int) -> None:
    """Every agent plans on the same version-0 snapshot; accepted commits exactly fill what fits."""
    env = SharedResources(np.array([cap]), np.array([cap]))
    snap = env.snapshot()
    accepted, lost_races = [], 0
    for rid, a in enumerate(amounts):
        if env.commit(delta(rid, [0], [a], [0], [a]), snap.version).accepted:
            accepted.append(a)
        else:
            lost_races += bool(accepted)   # refused after someone else moved the version on
    # greedy in arrival order is what first-come optimistic commits must produce
    used = 0
    expected = []
    for a in amounts:
        if used + a <= cap:
            expected.append(a)
            used += a
    assert accepted == expected
    assert int(env.link_residual[0]) == cap - sum(expected) >= 0
    assert env.counters.conflicts == lost_races
    assert env.counters.refused == len(amounts) - len(expected)
