"""The highway model: LOS against hand-made geometries, relays and coverage against brute force, traffic invariants."""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenarios.vehicular_road import (Highway, VehicularRelayConfig, covered_cells, covered_counts, los_adjacency,
                                      reachable_batched, reachable_from, relay_lengths, segment_blocked)



# ----------------------------------------------------------------------------- hand-made LOS
def box(x: float, y: float, half_len: float = 2.0, half_wid: float = 1.0) -> list[float]:
    return [x - half_len, x + half_len, y - half_wid, y + half_wid]


def test_segment_through_box_is_blocked_and_beside_it_is_not():
    p0, p1 = np.array([[0.0, 0.0]] * 4), np.array([[20.0, 0.0]] * 4)
    rects = np.array([box(10, 0), box(10, 1.5), box(10, -1.0), box(30, 0)])
    # through the middle; 0.5 m above it (box spans y 0.5..2.5); touching its top edge; beyond the end
    assert segment_blocked(p0, p1, rects).tolist() == [True, False, False, False]


def test_diagonal_through_corner_only_is_not_blocked_and_through_interior_is():
    # the segment y = x passes exactly through the corner (2, 2) of the box [2, 4] x [0, 2]
    p0, p1 = np.array([[0.0, 0.0], [0.0, 0.0]]), np.array([[4.0, 4.0], [4.0, 1.0]])
    rects = np.array([[2.0, 4.0, 0.0, 2.0], [2.0, 4.0, 0.0, 2.0]])
    # the second segment y = x/4 enters the box at x = 2 (y = 0.5): interior
    assert segment_blocked(p0, p1, rects).tolist() == [False, True]


def test_vertical_segment_blocked_only_strictly_inside_the_box_span():
    p0 = np.array([[10.0, -5.0], [12.0, -5.0], [11.0, -5.0]])
    p1 = np.array([[10.0, 5.0], [12.0, 5.0], [11.0, 5.0]])
    rects = np.array([box(10, 0)] * 3)  # x from 8 to 12
    assert segment_blocked(p0, p1, rects).tolist() == [True, False, True]


def _nodes(*xy: tuple[float, float]) -> np.ndarray:
    return np.array(xy, dtype=float)


def test_los_links_blocked_unblocked_at_range_and_beyond_range():
    R = 100.0
    # A at 0 and B at 50 in lane y=2 with a car between them in the same lane -> blocked
    blocked = los_adjacency(_nodes((0, 2), (50, 2)), np.array([0, 1]),
                            np.array([box(0, 2), box(50, 2), box(25, 2)]), R)
    assert not blocked[0, 1]
    # the car in the next lane (y=6) does not touch the segment -> linked
    clear = los_adjacency(_nodes((0, 2), (50, 2)), np.array([0, 1]),
                          np.array([box(0, 2), box(50, 2), box(25, 6)]), R)
    assert clear[0, 1] and clear[1, 0]
    # exactly R apart -> linked; R + 5 apart -> not linked (nothing in between)
    at_range = los_adjacency(_nodes((0, 2), (100, 2), (205, 2)), np.array([0, 1, 2]),
                             np.array([box(0, 2), box(100, 2), box(205, 2)]), R)
    assert at_range[0, 1] and not at_range[1, 2] and not at_range[0, 2]
    # diagonal at range: 3-4-5 triangle scaled to 100 m
    diag = los_adjacency(_nodes((0, 0), (80, 60)), np.array([-1, -1]), np.zeros((0, 4)), R)
    assert diag[0, 1]


def test_own_bodies_never_block_their_own_link():
    adj = los_adjacency(_nodes((0, 2), (10, 2)), np.array([0, 1]), np.array([box(0, 2), box(10, 2)]), 100.0)
    assert adj[0, 1]


def test_rsu_link_blocked_by_car_in_the_near_lane():
    # RSU at y=-2 beside the road; a vehicle 40 m ahead in lane 1 (y=6); a car in lane 0 (y=2) at x=20
    # sits where the segment crosses y=2 (x = 40 * 4/8 = 20): blocked; moved to x=30 it is clear.
    bodies = np.array([box(40, 6), box(20, 2)])
    assert not los_adjacency(_nodes((0, -2), (40, 6)), np.array([-1, 0]), bodies, 100.0)[0, 1]
    bodies[1] = box(30, 2)
    assert los_adjacency(_nodes((0, -2), (40, 6)), np.array([-1, 0]), bodies, 100.0)[0, 1]


# ----------------------------------------------------------------------------- brute force
def _frac(v: float) -> Fraction:
    return Fraction(float(v))


def blocked_exact(p0, p1, rect) -> bool:
    """Separating-axis test in exact arithmetic: does the segment meet the open box?"""
    p0 = [_frac(v) for v in p0]
    p1 = [_frac(v) for v in p1]
    xmin, xmax, ymin, ymax = (_frac(v) for v in rect)
    corners = [(xmin, ymin), (xmin, ymax), (xmax, ymin), (xmax, ymax)]
    normal = (-(p1[1] - p0[1]), p1[0] - p0[0])
    for axis in ((Fraction(1), Fraction(0)), (Fraction(0), Fraction(1)), normal):
        seg = [axis[0] * p[0] + axis[1] * p[1] for p in (p0, p1)]
        box_proj = [axis[0] * c[0] + axis[1] * c[1] for c in corners]
        if max(seg) <= min(box_proj) or min(seg) >= max(box_proj):
            return False
    return True


def brute_force_relays(road: Highway):
    """Adjacency, RSU-connected set, relay length per RSU and coverage by plain loops."""
    cfg = road.cfg
    rects = road.body_rects()
    nodes = [(x, y, -1) for x, y in zip(road.rsu_x, road.rsu_y)]
    nodes += [(road.cell_centres[road.cell[v]], road.lane_centres[road.lane[v]], v)
              for v in range(len(road.lane)) if road.mmwave[v]]
    n = len(nodes)
    adj = [[False] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        (xi, yi, vi), (xj, yj, vj) = nodes[i], nodes[j]
        if (_frac(xi) - _frac(xj)) ** 2 + (_frac(yi) - _frac(yj)) ** 2 > _frac(cfg.radio_range_m) ** 2:
            continue
        if any(blocked_exact((xi, yi), (xj, yj), rects[b]) for b in range(len(rects)) if b not in (vi, vj)):
            continue
        adj[i][j] = adj[j][i] = True
    reach = [row[:] for row in adj]  # Warshall's transitive closure
    for i in range(n):
        reach[i][i] = True
    for k in range(n):
        for i in range(n):
            if reach[i][k]:
                for j in range(n):
                    reach[i][j] = reach[i][j] or reach[k][j]
    n_rsu = len(road.rsu_x)
    connected = [any(reach[r][i] for r in range(n_rsu)) for i in range(n)]
    relay = []
    for r in range(n_rsu):
        dists = [abs(nodes[i][0] - nodes[r][0]) for i in range(n_rsu, n) if reach[r][i]]
        relay.append(max(dists, default=0.0))
    covered = [any(connected[i] and abs(c - nodes[i][0]) <= cfg.radio_range_m for i in range(n))
               for c in road.cell_centres]
    return np.array(adj), np.array(connected), np.array(relay), float(np.mean(covered)), nodes


def small_road(seed: int, lanes: int, cells: int, n_vehicles: int, p: float) -> Highway:
    cfg = VehicularRelayConfig(lanes=lanes, road_length_m=5.0 * cells, rsu_spacing_m=100.0, radio_range_m=40.0,
                               n_agents=0, density=0.1, penetration=p, warmup_steps=0)
    rng = np.random.default_rng(seed)
    road = Highway(cfg, rng)
    flat = rng.choice(lanes * cells, size=n_vehicles, replace=False)
    road.lane, road.cell = np.divmod(flat, cells)
    road.speed = np.zeros(n_vehicles, dtype=np.int64)
    road.mmwave = rng.random(n_vehicles) < p
    road.agent_id = np.full(n_vehicles, -1, dtype=np.int64)
    road._sort()
    return road


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), lanes=st.integers(1, 3), cells=st.integers(30, 48),
       fill=st.floats(0.05, 0.4), p=st.floats(0.2, 1.0))
def test_relays_and_coverage_equal_brute_force_on_random_small_roads(seed, lanes, cells, fill, p):
    road = small_road(seed, lanes, cells, max(1, int(fill * lanes * cells)), p)
    state = road.relay_state()
    adj, connected, relay, coverage, _ = brute_force_relays(road)
    assert np.array_equal(state.adj, adj)
    assert np.array_equal(state.connected, connected)
    assert np.allclose(relay_lengths(state.node_x, state.is_rsu, state.adj), relay)
    assert state.relay_length_m == pytest.approx(relay.mean())
    assert state.coverage == pytest.approx(coverage)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), cells=st.integers(30, 50))
def test_marginal_coverage_equals_recomputing_without_that_radio(seed, cells):
    road = small_road(seed, 2, cells, int(0.3 * 2 * cells), 0.6)
    state = road.relay_state()
    vehicles = np.nonzero(road.mmwave)[0]
    got = road.marginal_coverage(state, vehicles)
    for k, v in enumerate(vehicles):
        road.mmwave[v] = False  # radio off, body still on the road
        without = road.relay_state().coverage
        road.mmwave[v] = True
        assert got[k] == pytest.approx(state.coverage - without)


def _without_vehicle(road: Highway, v: int) -> float:
    """Coverage of the same road with vehicle v deleted outright (radio and body), by recomputing everything."""
    saved = {name: getattr(road, name).copy() for name in ("lane", "cell", "speed", "mmwave", "agent_id")}
    keep = np.ones(len(road.lane), dtype=bool)
    keep[v] = False
    road._reorder(keep)
    try:
        return road.relay_state().coverage
    finally:
        for name, value in saved.items():
            setattr(road, name, value)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lanes=st.integers(1, 3), cells=st.integers(30, 50),
       fill=st.floats(0.1, 0.45), p=st.floats(0.3, 1.0))
def test_difference_coverage_equals_recomputing_without_that_vehicle(seed, lanes, cells, fill, p):
    road = small_road(seed, lanes, cells, max(2, int(fill * lanes * cells)), p)
    state = road.relay_state()
    vehicles = np.arange(len(road.lane))  # mmWave or not: a plain car's body can still cut a relay
    got = road.difference_coverage(state, vehicles)
    for k, v in enumerate(vehicles):
        assert got[k] == pytest.approx(state.coverage - _without_vehicle(road, v))


def test_difference_coverage_charges_a_body_that_cuts_a_relay():
    # one lane; one RSU at x=150 (beside lane 0); mmWave car A at cell 34 (x=172.5) links to it; mmWave
    # car B at cell 44 (x=222.5, 72.5 m from the RSU: out of range) would link to A, 50 m away, but a
    # plain car C at cell 39 (x=197.5) sits between them
    cfg = VehicularRelayConfig(lanes=1, road_length_m=300.0, rsu_spacing_m=300.0, radio_range_m=60.0,
                               n_agents=0, density=0.05, warmup_steps=0)
    road = Highway(cfg, np.random.default_rng(0))
    road.lane, road.cell = np.zeros(3, dtype=np.int64), np.array([34, 39, 44])
    road.speed, road.mmwave, road.agent_id = np.zeros(3, dtype=np.int64), np.array([True, False, True]), np.full(3, -1)
    state = road.relay_state()
    diff = road.difference_coverage(state, np.arange(3))
    marginal = road.marginal_coverage(state, np.arange(3))
    assert diff[1] < 0 and marginal[1] == 0  # C's body is what cuts B off; only the difference reward sees it
    assert diff[1] == pytest.approx(state.coverage - _without_vehicle(road, 1))
    assert diff[0] > 0 and diff[2] == 0  # A relays for the RSU; B is cut off, so it adds nothing


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 12), cells=st.integers(10, 80))
def test_covered_counts_is_the_size_of_the_union_of_ranges(seed, n, cells):
    rng = np.random.default_rng(seed)
    node_x = rng.uniform(-50.0, 5.0 * cells + 50.0, size=n).round(1)
    reach = rng.random((4, n)) < 0.6
    centres = (np.arange(cells) + 0.5) * 5.0
    want = [covered_cells(node_x, row, centres, 37.5).sum() for row in reach]
    assert covered_counts(node_x, reach, 5.0, cells, 37.5).tolist() == want


def test_reachable_batched_with_one_graph_per_row_matches_single_searches():
    rng = np.random.default_rng(5)
    graphs = rng.random((6, 10, 10)) < 0.25
    graphs = np.triu(graphs, 1)
    graphs = graphs | np.transpose(graphs, (0, 2, 1))
    sources = np.zeros(10, dtype=bool)
    sources[0] = True
    keep = rng.random((6, 10)) < 0.85
    batched = reachable_batched(graphs, sources, keep)
    for b in range(6):
        sub = graphs[b] & keep[b][:, None] & keep[b][None, :]
        assert np.array_equal(batched[b], reachable_from(sub, sources & keep[b]))


def test_reachable_from_batched_removal_matches_single_searches():
    rng = np.random.default_rng(3)
    adj = rng.random((12, 12)) < 0.2
    adj = np.triu(adj, 1)
    adj = adj | adj.T
    sources = np.zeros(12, dtype=bool)
    sources[:2] = True
    removed = np.eye(12, dtype=bool)
    batched = reachable_from(adj, sources, removed)
    for b in range(12):
        keep = ~removed[b]
        sub = adj & keep[:, None] & keep[None, :]
        assert np.array_equal(batched[b], reachable_from(sub, sources & keep))


# ----------------------------------------------------------------------------- traffic
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), control=st.booleans())
def test_no_two_vehicles_ever_share_a_cell(seed, control):
    cfg = VehicularRelayConfig(lanes=3, road_length_m=400.0, rsu_spacing_m=200.0, n_agents=6, density=0.3,
                               inflow=0.9, warmup_steps=5, radio_range_m=60.0)
    rng = np.random.default_rng(seed)
    road = Highway(cfg, rng)
    road.populate(cfg.n_agents)
    for _ in range(60):
        ids = road.agent_id[road.agent_id >= 0]
        actions = {int(i): int(rng.integers(0, 5)) for i in ids} if control else {}
        road.step(actions)
        cells = road.lane * road.n_cells + road.cell
        assert len(np.unique(cells)) == len(cells)
        assert ((road.speed >= 0) & (road.speed <= cfg.vmax)).all()
        assert ((road.cell >= 0) & (road.cell < road.n_cells)).all()
        assert (road.agent_id[road.agent_id >= 0] < road.next_agent_id).all()
        assert len(np.unique(ids)) == len(ids)


def test_agent_that_cannot_change_lane_is_flagged_unsafe_and_stays():
    cfg = VehicularRelayConfig(lanes=2, road_length_m=200.0, rsu_spacing_m=100.0, radio_range_m=50.0,
                               n_agents=1, density=0.05, warmup_steps=0)
    road = Highway(cfg, np.random.default_rng(0))
    road.lane, road.cell = np.array([0, 1]), np.array([10, 10])
    road.speed, road.mmwave, road.agent_id = np.array([0, 0]), np.array([True, False]), np.array([0, -1])
    road.next_agent_id = 1
    road._sort()
    _, unsafe = road.step({0: 3})  # lane left into an occupied cell
    assert unsafe.tolist() == [0]
    assert road.lane[road.agent_id == 0].tolist() == [0]
    _, unsafe = road.step({0: 4})  # lane right from lane 0: no such lane
    assert unsafe.tolist() == [0]


def test_nagel_schreckenberg_speed_update_by_hand():
    # one lane, no randomness: a car at cell 0 with speed 2, leader at cell 4 standing still
    cfg = VehicularRelayConfig(lanes=1, road_length_m=200.0, rsu_spacing_m=100.0, radio_range_m=50.0,
                               n_agents=0, density=0.05, slowdown_prob=0.0, inflow=0.0, warmup_steps=0)
    road = Highway(cfg, np.random.default_rng(0))
    road.lane, road.cell, road.speed = np.array([0, 0]), np.array([0, 4]), np.array([2, 0])
    road.mmwave, road.agent_id = np.array([False, False]), np.array([-1, -1])
    road.step({})
    # follower: min(2+1, vmax, gap=3) = 3 -> cell 3; leader: min(0+1, 5, open road) = 1 -> cell 5
    assert road.cell.tolist() == [3, 5] and road.speed.tolist() == [3, 1]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("override, key", [
    ({"penetration": 1.5}, "penetration"), ({"penetration": -0.1}, "penetration"),
    ({"n_agents": 500, "density": 0.1}, "n_agents"),
    ({"road_length_m": 80.0, "radio_range_m": 100.0, "rsu_spacing_m": 50.0}, "road_length_m"),
])
def test_bad_config_names_the_key(override, key):
    cfg = VehicularRelayConfig(**override)
    with pytest.raises(ValueError, match=f"^{key}:"):
        cfg.validate()
