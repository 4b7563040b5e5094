"""The O-RAN-like metro network of the routing scenario: tiers, links, node capacities, k candidate paths.

Tiers: radio units (one per cell) -> distributed units (DU) -> central units (CU) -> core. Links carry
a capacity (kb/s, integer so that resource bookkeeping is exact) and a propagation delay (ms); DU,
CU and core nodes carry a processing capacity (kb/s of traffic they can handle) and a processing delay
(ms). The graph is built deterministically from a seed so every run of a scenario sees the same city.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import networkx as nx
import numpy as np

TIER_RU, TIER_DU, TIER_CU, TIER_CORE = "ru", "du", "cu", "core"

# Processing delay per tier (ms): fronthaul switching at a radio unit is negligible.
PROCESSING_DELAY_MS = {TIER_RU: 0.0, TIER_DU: 0.2, TIER_CU: 0.4, TIER_CORE: 0.5}


@dataclass(frozen=True)
class NetworkShape:
    """Sizes and capacities of the metro network (capacities in Mb/s, delays in ms)."""

    n_core: int = 2
    n_cu: int = 4
    n_du: int = 8
    cells_per_du: int = 3
    fronthaul_mbps: float = 2000.0
    midhaul_mbps: float = 3000.0
    du_lateral_mbps: float = 1500.0
    backhaul_mbps: float = 6000.0
    cu_ring_mbps: float = 3000.0
    core_mbps: float = 40000.0
    du_processing_mbps: float = 4000.0
    cu_processing_mbps: float = 6000.0
    core_processing_mbps: float = 60000.0


@dataclass(frozen=True)
class CandidatePath:
    """One loop-free route from a cell's radio unit to a destination, with what it consumes."""

    nodes: tuple[int, ...]
    links: np.ndarray          # indices into Topology.link_capacity
    processing_nodes: np.ndarray  # indices of DU/CU/core nodes whose processing it uses
    delay_ms: float            # propagation + processing delay end to end


@dataclass
class Topology:
    """The network as flat arrays (for fast, exact bookkeeping) plus its networkx graph."""

    graph: nx.Graph
    link_capacity: np.ndarray   # int64 kb/s, one per undirected link
    node_capacity: np.ndarray   # int64 kb/s of processing, 0 for nodes that do not process
    link_index: dict[tuple[int, int], int]
    cells: list[int]            # node id of each cell's radio unit, indexed by cell number
    cus: list[int]
    cores: list[int]
    edge_cu_of_cell: list[int]  # the CU hosting the edge (MEC) site that serves each cell

    def link_between(self, a: int, b: int) -> int:
        """Index of the undirected link a-b."""
        return self.link_index[(min(a, b), max(a, b))]


def _mbps_to_kbps(mbps: float) -> int:
    return int(round(mbps * 1000.0))


def build_metro_network(shape: NetworkShape, seed: int) -> Topology:
    """Build the tiered metro graph; link delays are jittered with ``seed`` so that paths differ."""
    for field_name in ("n_core", "n_cu", "n_du", "cells_per_du"):
        if getattr(shape, field_name) < 1:
            raise ValueError(f"network.{field_name} must be at least 1, got {getattr(shape, field_name)}")
    rng = np.random.default_rng(seed)
    g = nx.Graph()
    next_id = 0

    def add_nodes(count: int, tier: str, proc_mbps: float) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        for i, node in enumerate(ids):
            g.add_node(node, tier=tier, label=f"{tier}{i}", processing_kbps=_mbps_to_kbps(proc_mbps),
                       processing_delay_ms=PROCESSING_DELAY_MS[tier])
        next_id += count
        return ids

    cores = add_nodes(shape.n_core, TIER_CORE, shape.core_processing_mbps)
    cus = add_nodes(shape.n_cu, TIER_CU, shape.cu_processing_mbps)
    dus = add_nodes(shape.n_du, TIER_DU, shape.du_processing_mbps)
    cells = add_nodes(shape.n_du * shape.cells_per_du, TIER_RU, 0.0)

    def link(a: int, b: int, mbps: float, delay_ms: float) -> None:
        if a != b and not g.has_edge(a, b):
            g.add_edge(a, b, capacity_kbps=_mbps_to_kbps(mbps), delay_ms=float(delay_ms))

    for i in range(len(cores) - 1):
        link(cores[i], cores[i + 1], shape.core_mbps, 1.0)
    for i, cu in enumerate(cus):
        link(cu, cores[i % len(cores)], shape.backhaul_mbps, rng.uniform(4.0, 8.0))
        link(cu, cores[(i + 1) % len(cores)], shape.backhaul_mbps, rng.uniform(6.0, 10.0))
        if len(cus) > 1:
            link(cu, cus[(i + 1) % len(cus)], shape.cu_ring_mbps, rng.uniform(1.2, 2.0))
    du_primary_cu = []
    for j, du in enumerate(dus):
        primary = cus[(j * len(cus)) // len(dus)]
        du_primary_cu.append(primary)
        link(du, primary, shape.midhaul_mbps, rng.uniform(0.5, 1.0))
        link(du, cus[(cus.index(primary) + 1) % len(cus)], shape.midhaul_mbps, rng.uniform(1.5, 2.5))
        if j % 2 == 1:
            link(du, dus[j - 1], shape.du_lateral_mbps, rng.uniform(0.2, 0.4))
    edge_cu_of_cell = []
    for c, ru in enumerate(cells):
        j = c // shape.cells_per_du
        link(ru, dus[j], shape.fronthaul_mbps, rng.uniform(0.05, 0.15))
        if c % shape.cells_per_du == shape.cells_per_du - 1 and len(dus) > 1:
            link(ru, dus[(j + 1) % len(dus)], shape.fronthaul_mbps, rng.uniform(0.1, 0.2))
        edge_cu_of_cell.append(du_primary_cu[j])

    edges = sorted((min(a, b), max(a, b)) for a, b in g.edges())
    link_index = {e: i for i, e in enumerate(edges)}
    link_capacity = np.array([g.edges[e]["capacity_kbps"] for e in edges], dtype=np.int64)
    node_capacity = np.array([g.nodes[n]["processing_kbps"] for n in range(g.number_of_nodes())],
                             dtype=np.int64)
    return Topology(graph=g, link_capacity=link_capacity, node_capacity=node_capacity,
                    link_index=link_index, cells=cells, cus=cus, cores=cores,
                    edge_cu_of_cell=edge_cu_of_cell)


def path_delay_ms(topology: Topology, nodes: tuple[int, ...]) -> float:
    """End-to-end delay of a node sequence: link propagation plus processing at every node."""
    g = topology.graph
    links = sum(g.edges[a, b]["delay_ms"] for a, b in zip(nodes, nodes[1:]))
    processing = sum(g.nodes[n]["processing_delay_ms"] for n in nodes)
    return float(links + processing)


def _edge_weight_with_processing(g: nx.Graph):
    # Weight of a hop = link delay + processing delay at the node it enters; summed over a simple
    # path this differs from path_delay_ms only by the (constant) processing delay of the source.
    return lambda a, b, data: data["delay_ms"] + g.nodes[b]["processing_delay_ms"]


def candidate_paths(topology: Topology, source: int, destination: int, k: int) -> list[CandidatePath]:
    """Up to k loop-free paths from source to destination, shortest end-to-end delay first.

    Returns an empty list when the destination is unreachable (the caller counts such requests
    as blocked rather than failing).
    """
    if k < 1:
        raise ValueError(f"k_paths must be at least 1, got {k}")
    g = topology.graph
    if source not in g or destination not in g or not nx.has_path(g, source, destination):
        return []
    if source == destination:
        raise ValueError(f"a request's source and destination are the same node ({source})")
    routes = islice(nx.shortest_simple_paths(g, source, destination,
                                             weight=_edge_weight_with_processing(g)), k)
    out = []
    for nodes in routes:
        nodes = tuple(int(n) for n in nodes)
        links = np.array([topology.link_between(a, b) for a, b in zip(nodes, nodes[1:])], dtype=np.int64)
        processing = np.array([n for n in nodes if topology.node_capacity[n] > 0], dtype=np.int64)
        out.append(CandidatePath(nodes=nodes, links=links, processing_nodes=processing,
                                 delay_ms=path_delay_ms(topology, nodes)))
    return out


class PathCatalog:
    """k candidate paths per (source, destination), computed once on first use and cached."""

    def __init__(self, topology: Topology, k: int) -> None:
        self.topology = topology
        self.k = k
        self._paths: dict[tuple[int, int], list[CandidatePath]] = {}

    def paths(self, source: int, destination: int) -> list[CandidatePath]:
        """The cached candidate paths for one pair (empty when unreachable)."""
        key = (source, destination)
        if key not in self._paths:
            self._paths[key] = candidate_paths(self.topology, source, destination, self.k)
        return self._paths[key]
