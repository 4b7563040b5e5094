"""The routing world and its per-service PettingZoo view: conformance, observations, evaluation, bad input."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

import scenarios
from agents.routing import evaluate_routing
from scenarios.routing import (ACCEPTED, CONFLICT, REJECTED, UNREACHABLE, AgentStream, RequestOutcome,
                               RoutingConfig, RoutingParallelEnv, RoutingWorld, encode_observation,
                               path_table, plan_action, summarize_outcomes)
from scenarios.routing_demand import DemandError, Request
from scenarios.routing_resources import SharedResources

SMALL = dict(episode_seconds=15.0)


def first_feasible(service: str, obs: np.ndarray, feasible: np.ndarray) -> int:
    idx = np.flatnonzero(feasible)
    return int(idx[0]) if len(idx) else len(feasible)


def test_registered_with_pettingzoo_and_marl_q() -> None:
    env = pettingzoo.make("parallel", "marlq/routing-v0")
    assert env.possible_agents == ["embb", "urllc", "mmtc"]
    assert scenarios.SCENARIOS["routing"].kind == "parallel"


def test_parallel_api() -> None:
    parallel_api_test(RoutingParallelEnv(RoutingConfig(**SMALL)), num_cycles=100)


def test_parallel_seed() -> None:
    parallel_seed_test(lambda: RoutingParallelEnv(RoutingConfig(**SMALL)), num_cycles=100)


@pytest.mark.parametrize("replans", [0, 2])
def test_parallel_view_keeps_the_invariants_and_replans_conflicts(replans: int) -> None:
    """Agents take the first path feasible on their shared snapshot of a network shrunk 10x: races
    happen, refusals re-plan, nothing overbooks."""
    env = RoutingParallelEnv(RoutingConfig(load_scale=4.0, episode_seconds=15.0, max_replans=replans))
    env.world.topology.link_capacity //= 10
    env.world.topology.node_capacity //= 10
    _, infos = env.reset(seed=4)
    while env.agents:
        _, _, _, _, infos = env.step({a: int(np.argmax(infos[a]["action_mask"])) for a in env.agents})
        env.resources.check_invariants()
    c = env.resources.counters
    assert c.conflicts > 0 and c.refused >= c.conflicts
    assert any(o.outcome == ACCEPTED for o in env.outcomes)
    # a request blocked by conflicts was refused max_replans + 1 times; with re-plans some recover
    assert all(o.refusals == replans + 1 for o in env.outcomes if o.outcome == CONFLICT)
    if replans == 0:
        assert any(o.outcome == CONFLICT for o in env.outcomes)
    else:
        replanned = [o for o in env.outcomes if o.refusals > 0 and o.outcome != CONFLICT]
        assert replanned, "a refused request is offered again on a fresh snapshot"


def _world(**kw) -> RoutingWorld:
    return RoutingWorld(RoutingConfig(**kw))


def test_observation_by_hand() -> None:
    world = _world(k_paths=3)
    cell = 2   # a dual-homed cell: its second radio link leaves another way out
    dest = world.topology.edge_cu_of_cell[cell]
    req = Request(0, world.cfg.day_seconds / 4, cell, "urllc", 10_000, 5.0, dest)
    paths = world.paths_for(req)
    res = SharedResources(world.topology.link_capacity, world.topology.node_capacity)
    # squeeze the first path's first link to 5 Mb/s left: the 10 Mb/s request no longer fits there
    link0 = int(paths[0].links[0])
    res.link_residual[link0] = 5_000
    feats, feasible = path_table(world, req, paths, res.snapshot())
    budget = 2.5
    cap0 = world.topology.link_capacity[link0]
    assert feats[0, 0] == 1.0 and feasible[0] == False and feats[0, 1] == 0.0
    assert feats[0, 2] == pytest.approx(paths[0].delay_ms / budget)
    expected_headroom = min((5_000 - 10_000) / cap0,
                            min((world.topology.link_capacity[l] - 10_000) / world.topology.link_capacity[l]
                                for l in paths[0].links[1:]))
    assert feats[0, 3] == pytest.approx(expected_headroom)
    proc = 10_000 * 4
    expected_node = min((world.topology.node_capacity[n] - proc) / world.topology.node_capacity[n]
                        for n in paths[0].processing_nodes)
    assert feats[0, 4] == pytest.approx(expected_node)
    assert feats[0, 5] == pytest.approx(len(paths[0].links) / 10)
    for i, p in enumerate(paths[1:], start=1):
        assert feasible[i] == (p.delay_ms <= budget and link0 not in p.links.tolist())
    assert feasible[1:].any(), "the test should leave some path feasible"
    obs, mask = encode_observation(world, req, paths, res.snapshot(), service_onehot=True)
    assert obs.shape == (world.obs_dim(True),) and np.array_equal(mask, feasible)
    assert obs[:4] == pytest.approx([10_000 / 160_000, math.log10(2.5) / 2, 1.0, 0.0], abs=1e-6)
    assert obs[-3:].tolist() == [0.0, 1.0, 0.0]


def test_plan_action_outcomes() -> None:
    world = _world(k_paths=2)
    req = Request(0, 0.0, 0, "embb", 1000, 1.0, world.topology.cores[0])
    paths = world.paths_for(req)
    assert plan_action(world, req, paths, np.array([True, False]), 2).outcome == REJECTED
    infeasible = plan_action(world, req, paths, np.array([True, False]), 1)
    assert infeasible.outcome == "infeasible" and infeasible.reward == -world.cfg.infeasible_penalty
    ok = plan_action(world, req, paths, np.array([True, False]), 0)
    assert ok.delta is not None and ok.delta.link_amounts.tolist() == [1000] * len(paths[0].links)
    with pytest.raises(ValueError, match="routing action must be in 0..2"):
        plan_action(world, req, paths, np.array([True, True]), 3)


def test_evaluation_releases_everything_once_and_counts() -> None:
    world = _world(load_scale=4.0)
    out = evaluate_routing(world, first_feasible, False, 0.0, 60.0, seed=0)
    assert len({o.request_id for o in out}) == len(out)
    stats = summarize_outcomes(out, world.services)
    assert 0.0 < stats["gos"] < 1.0
    for s in world.services:
        n = sum(o.service == s for o in out)
        acc = [o.latency_ms for o in out if o.service == s and o.outcome == ACCEPTED]
        assert stats[f"{s}_gos"] == pytest.approx(len(acc) / n)
        assert stats[f"{s}_latency_mean_ms"] == pytest.approx(np.mean(acc))


def test_summary_by_hand() -> None:
    rows = [RequestOutcome(0, "embb", 0.0, ACCEPTED, 2.0), RequestOutcome(1, "embb", 0.0, ACCEPTED, 4.0),
            RequestOutcome(2, "urllc", 0.0, REJECTED), RequestOutcome(3, "urllc", 0.0, ACCEPTED, 1.0)]
    s = summarize_outcomes(rows, ["embb", "urllc"])
    assert s["gos"] == 0.75 and s["embb_gos"] == 1.0 and s["urllc_gos"] == 0.5
    assert s["latency_mean_ms"] == pytest.approx(7.0 / 3) and s["embb_latency_mean_ms"] == 3.0
    assert s["embb_latency_p95_ms"] == pytest.approx(2.0 + 0.95 * 2.0)
    assert s["rejected_share"] == 0.25


def test_unreachable_destinations_are_counted_not_fatal() -> None:
    world = _world()
    g = world.topology.graph
    ru = world.topology.cells[0]
    for nb in list(g.neighbors(ru)):
        g.remove_edge(ru, nb)
    out = evaluate_routing(world, first_feasible, False, 0.0, 200.0, seed=1)
    lost = [o for o in out if o.outcome == UNREACHABLE]
    assert lost and all(o.no_feasible_path for o in lost)
    assert {o.request_id for o in lost} >= {o.request_id for o in out if o.outcome == UNREACHABLE}
    assert any(o.outcome == ACCEPTED for o in out)


def test_service_with_no_feasible_path_is_rejected_not_fatal(monkeypatch) -> None:
    import scenarios.routing_demand as demand
    tight = demand.ServiceProfile("urllc", (5.0, 20.0), 0.1, 20.0, 0.13, 11.0, 0.3, 4, "edge")
    monkeypatch.setitem(demand.SERVICE_PROFILES, "urllc", tight)
    world = RoutingWorld(RoutingConfig(services=["urllc"]))
    out = evaluate_routing(world, first_feasible, False, 0.0, 30.0, seed=0)
    assert out and all(o.outcome == REJECTED and o.no_feasible_path for o in out)


def test_agent_stream_releases_each_holding_once() -> None:
    world = _world(load_scale=3.0)
    res = world.new_resources()
    stream = AgentStream(world, ["embb"], np.random.default_rng(0), False, horizon_s=120.0)
    released: list[int] = []
    while stream.advance() is not None:
        for rid in stream.take_releases():
            res.release(rid)
            released.append(rid)
        obs, feasible = stream.observe(res.snapshot())
        plan = stream.act(first_feasible("embb", obs, feasible), feasible)
        if plan.delta is not None:
            stream.resolve(plan, res.commit(plan.delta, res.version).accepted)
    for rid in stream.release_all():
        res.release(rid)
        released.append(rid)
    accepted = [o.request_id for o in stream.outcomes if o.outcome == ACCEPTED]
    assert sorted(released) == sorted(accepted) and len(set(released)) == len(released)
    assert not res.holdings and np.array_equal(res.link_residual, res.link_capacity)


@pytest.mark.parametrize("kw, message", [
    ({"services": ["embb", "video"]}, "scenario.services"),
    ({"k_paths": 0}, "scenario.k_paths must be >= 1"),
    ({"max_replans": -1}, "scenario.max_replans"),
    ({"slot_seconds": 0.0}, "scenario.slot_seconds must be > 0"),
])
def test_bad_config_is_named(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutingWorld(RoutingConfig(**kw))


def test_trace_world_and_its_shift_check(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("time,cell,service,rate\n0,0,embb,0.5\n0,3,urllc,0.5\n")
    world = RoutingWorld(RoutingConfig(trace_csv=str(p), services=["embb", "urllc"]))
    out = evaluate_routing(world, first_feasible, False, 0.0, 40.0, seed=0)
    assert out and {o.service for o in out} == {"embb", "urllc"}
    with pytest.raises(DemandError, match="embb_peak_moved"):
        RoutingWorld(RoutingConfig(trace_csv=str(p), services=["embb"]), shift="embb_peak_moved")


def test_shifts_change_the_demand() -> None:
    base, surge = _world(), RoutingWorld(RoutingConfig(), shift="urllc_surge")
    assert surge.demand.peak_rate("urllc", 0) == pytest.approx(2.5 * base.demand.peak_rate("urllc", 0))
    moved = RoutingWorld(RoutingConfig(), shift="embb_peak_moved")
    assert moved.profiles["embb"].peak_hour == 11.0 and base.profiles["embb"].peak_hour == 20.0
