"""The metro network: tiers, candidate paths against brute-force enumeration, edge placement of URLLC."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from scenarios.routing_demand import SERVICE_PROFILES
from scenarios.routing_network import (TIER_CORE, TIER_CU, TIER_DU, TIER_RU, NetworkShape, PathCatalog,
                                       build_metro_network, candidate_paths)


@pytest.fixture(scope="module")
def topo():
    return build_metro_network(NetworkShape(), seed=0)


def test_tiers_and_sizes(topo) -> None:
    g = topo.graph
    tiers = [g.nodes[n]["tier"] for n in g]
    shape = NetworkShape()
    assert tiers.count(TIER_CORE) == shape.n_core and tiers.count(TIER_CU) == shape.n_cu
    assert tiers.count(TIER_DU) == shape.n_du and tiers.count(TIER_RU) == shape.n_du * shape.cells_per_du
    assert 24 <= g.number_of_nodes() <= 60 and nx.is_connected(g)
    # radio units connect only to DUs; capacities are positive integers (kb/s)
    for ru in topo.cells:
        assert {g.nodes[m]["tier"] for m in g.neighbors(ru)} == {TIER_DU}
    assert topo.link_capacity.dtype == np.int64 and (topo.link_capacity > 0).all()
    assert (topo.node_capacity[topo.cells] == 0).all()


def test_same_seed_same_city(topo) -> None:
    again = build_metro_network(NetworkShape(), seed=0)
    assert np.array_equal(again.link_capacity, topo.link_capacity)
    assert nx.utils.graphs_equal(again.graph, topo.graph)


def brute_force_delays(topo, src: int, dst: int) -> list[float]:
    """Delay of every simple path, summed by hand from edge and node attributes, sorted."""
    g = topo.graph
    out = []
    for nodes in nx.all_simple_paths(g, src, dst, cutoff=8):
        d = sum(g.edges[a, b]["delay_ms"] for a, b in zip(nodes, nodes[1:]))
        d += sum(g.nodes[n]["processing_delay_ms"] for n in nodes)
        out.append(d)
    return sorted(out)


@pytest.mark.parametrize("cell, target", [(0, "edge"), (5, "core0"), (23, "core1"), (11, "edge")])
def test_k_paths_are_the_k_shortest_by_delay(topo, cell: int, target: str) -> None:
    src = topo.cells[cell]
    dst = topo.edge_cu_of_cell[cell] if target == "edge" else topo.cores[int(target[-1])]
    k = 4
    paths = candidate_paths(topo, src, dst, k)
    assert len(paths) == k
    expected = brute_force_delays(topo, src, dst)[:k]
    assert [p.delay_ms for p in paths] == pytest.approx(expected)
    for p in paths:
        assert p.nodes[0] == src and p.nodes[-1] == dst and len(set(p.nodes)) == len(p.nodes)
        assert len(p.links) == len(p.nodes) - 1
        for a, b, link in zip(p.nodes, p.nodes[1:], p.links):
            assert topo.link_between(a, b) == link
        assert sorted(p.processing_nodes.tolist()) == sorted(n for n in p.nodes if topo.node_capacity[n] > 0)


def test_urllc_fits_its_budget_only_at_the_edge(topo) -> None:
    """Every cell reaches its edge site within the URLLC budget; no cell reaches the core within it."""
    budget = SERVICE_PROFILES["urllc"].budget_ms
    catalog = PathCatalog(topo, 4)
    for c, ru in enumerate(topo.cells):
        assert catalog.paths(ru, topo.edge_cu_of_cell[c])[0].delay_ms <= budget
        for core in topo.cores:
            assert catalog.paths(ru, core)[0].delay_ms > budget


def test_unreachable_destination_gives_no_paths(topo) -> None:
    g = topo.graph.copy()
    cut = type(topo)(**{**topo.__dict__, "graph": g})
    ru = cut.cells[0]
    for nb in list(g.neighbors(ru)):
        g.remove_edge(ru, nb)
    assert candidate_paths(cut, ru, cut.cores[0], 3) == []
    assert candidate_paths(cut, ru, 10_000, 3) == []


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="network.n_du must be at least 1"):
        build_metro_network(NetworkShape(n_du=0), seed=0)
    with pytest.raises(ValueError, match="k_paths must be at least 1"):
        candidate_paths(build_metro_network(NetworkShape(), 0), 30, 0, 0)
