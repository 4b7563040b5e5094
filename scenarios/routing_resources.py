"""The shared global resource environment: residual link and node capacities under optimistic commits.

Agents read a versioned snapshot, plan, and submit a commit (base version, resource delta). A commit
is applied atomically iff it fits the *current* residuals; a stale base version alone is no conflict.
Every accepted request holds exactly what it took until it is released, exactly once. Amounts are
integers (kb/s) so that allocated + residual == capacity holds exactly, not up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


class ResourceError(ValueError):
    """A malformed commit or release (bad indices, negative amounts, double release)."""


@dataclass(frozen=True)
class Snapshot:
    """Residual capacities as of one version; the arrays are read-only copies."""

    version: int
    link_residual: np.ndarray
    node_residual: np.ndarray


@dataclass(frozen=True)
class ResourceDelta:
    """What one request takes: an amount on each listed link and on each listed node (kb/s)."""

    request_id: int
    link_ids: np.ndarray
    link_amounts: np.ndarray
    node_ids: np.ndarray
    node_amounts: np.ndarray

    @staticmethod
    def along_path(request_id: int, links: np.ndarray, nodes: np.ndarray, link_kbps: int,
                   node_kbps: int) -> "ResourceDelta":
        """The delta of a request using ``link_kbps`` on every link and ``node_kbps`` at every node."""
        links = np.asarray(links, dtype=np.int64)
        nodes = np.asarray(nodes, dtype=np.int64)
        return ResourceDelta(request_id, links, np.full(len(links), int(link_kbps), dtype=np.int64),
                             nodes, np.full(len(nodes), int(node_kbps), dtype=np.int64))


@dataclass(frozen=True)
class CommitResult:
    """The environment's answer to a commit: accepted or refused, and the version after it."""

    accepted: bool
    version: int
    stale: bool
    reason: str = ""


@dataclass
class ResourceCounters:
    """How many commits, refusals, conflicts and releases the environment has seen."""

    commits: int = 0
    accepted: int = 0
    refused: int = 0
    stale_commits: int = 0
    conflicts: int = 0          # refused commits planned on an older version (a lost race)
    releases: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict for summaries and the ledger."""
        return dict(self.__dict__)


@dataclass
class SharedResources:
    """Residual link and node capacities, versioned; applies commits and releases."""

    link_capacity: np.ndarray
    node_capacity: np.ndarray
    link_residual: np.ndarray = field(init=False)
    node_residual: np.ndarray = field(init=False)
    version: int = field(default=0, init=False)
    holdings: dict[int, ResourceDelta] = field(default_factory=dict, init=False)
    counters: ResourceCounters = field(default_factory=ResourceCounters, init=False)

    def __post_init__(self) -> None:
        self.link_capacity = np.array(self.link_capacity, dtype=np.int64)
        self.node_capacity = np.array(self.node_capacity, dtype=np.int64)
        if (self.link_capacity < 0).any() or (self.node_capacity < 0).any():
            raise ResourceError("capacities must be non-negative")
        self.link_residual = self.link_capacity.copy()
        self.node_residual = self.node_capacity.copy()

    def snapshot(self) -> Snapshot:
        """A read-only copy of the residuals tagged with the current version."""
        links, nodes = self.link_residual.copy(), self.node_residual.copy()
        links.flags.writeable = False
        nodes.flags.writeable = False
        return Snapshot(self.version, links, nodes)

    def _demand(self, delta: ResourceDelta) -> tuple[np.ndarray, np.ndarray]:
        """Total amount per link and per node a delta asks for (duplicates summed), validated."""
        for name, ids, amounts, size in (("link", delta.link_ids, delta.link_amounts, len(self.link_capacity)),
                                         ("node", delta.node_ids, delta.node_amounts, len(self.node_capacity))):
            ids = np.asarray(ids)
            amounts = np.asarray(amounts)
            if ids.shape != amounts.shape or ids.ndim != 1:
                raise ResourceError(f"request {delta.request_id}: {name} ids and amounts must be 1-D "
                                    f"arrays of equal length, got {ids.shape} and {amounts.shape}")
            if len(ids) and (ids.min() < 0 or ids.max() >= size):
                raise ResourceError(f"request {delta.request_id}: {name} index out of range 0..{size - 1}: "
                                    f"{ids.tolist()}")
            if len(amounts) and amounts.min() < 0:
                raise ResourceError(f"request {delta.request_id}: negative {name} amount {amounts.tolist()}")
        link_need = np.zeros_like(self.link_residual)
        node_need = np.zeros_like(self.node_residual)
        np.add.at(link_need, np.asarray(delta.link_ids, dtype=np.int64), np.asarray(delta.link_amounts, dtype=np.int64))
        np.add.at(node_need, np.asarray(delta.node_ids, dtype=np.int64), np.asarray(delta.node_amounts, dtype=np.int64))
        return link_need, node_need

    def fits(self, delta: ResourceDelta) -> bool:
        """Whether the delta fits the current residuals."""
        link_need, node_need = self._demand(delta)
        return bool((link_need <= self.link_residual).all() and (node_need <= self.node_residual).all())

    def commit(self, delta: ResourceDelta, base_version: int) -> CommitResult:
        """Apply delta atomically iff it fits the current residuals; otherwise change nothing."""
        result = self._commit(delta, base_version, base_version < self.version)
        self.version += int(result.accepted)
        return CommitResult(result.accepted, self.version, result.stale, result.reason)

    def release(self, request_id: int) -> ResourceDelta:
        """Give back exactly what an accepted request took; a second release is an error."""
        self._check_releasable([request_id])
        delta = self._release(request_id)
        self.version += 1
        return delta

    def transact(self, release_ids: list[int], delta: Optional[ResourceDelta], base_version: int
                 ) -> Optional[CommitResult]:
        """Releases, then (optionally) one commit, as one versioned step: what one message carries.

        The releases are checked first (all held, no repeats); if any is not, ResourceError is
        raised and nothing changes. The version moves by one if anything was applied.
        """
        self._check_releasable(release_ids)
        stale = base_version < self.version
        if delta is not None:
            self._demand(delta)       # validate the delta before anything changes
        for rid in release_ids:
            self._release(rid)
        result = self._commit(delta, base_version, stale) if delta is not None else None
        changed = bool(release_ids) or (result is not None and result.accepted)
        self.version += int(changed)
        if result is None:
            return None
        return CommitResult(result.accepted, self.version, result.stale, result.reason)

    def _check_releasable(self, release_ids: list[int]) -> None:
        if len(set(release_ids)) != len(release_ids):
            raise ResourceError(f"release ids repeat: {sorted(release_ids)}")
        missing = [rid for rid in release_ids if rid not in self.holdings]
        if missing:
            raise ResourceError(f"request {missing[0]} holds no resources (never accepted or already released)")

    def _commit(self, delta: ResourceDelta, base_version: int, stale: bool) -> CommitResult:
        link_need, node_need = self._demand(delta)
        self.counters.commits += 1
        self.counters.stale_commits += int(stale)
        if delta.request_id in self.holdings:
            self.counters.refused += 1
            return CommitResult(False, self.version, stale, f"request {delta.request_id} already holds resources")
        if not ((link_need <= self.link_residual).all() and (node_need <= self.node_residual).all()):
            self.counters.refused += 1
            self.counters.conflicts += int(stale)
            return CommitResult(False, self.version, stale, "insufficient capacity")
        self.link_residual -= link_need
        self.node_residual -= node_need
        self.holdings[delta.request_id] = delta
        self.counters.accepted += 1
        return CommitResult(True, self.version, stale)

    def _release(self, request_id: int) -> ResourceDelta:
        delta = self.holdings.pop(request_id)
        np.add.at(self.link_residual, np.asarray(delta.link_ids, dtype=np.int64),
                  np.asarray(delta.link_amounts, dtype=np.int64))
        np.add.at(self.node_residual, np.asarray(delta.node_ids, dtype=np.int64),
                  np.asarray(delta.node_amounts, dtype=np.int64))
        self.counters.releases += 1
        return delta

    def allocated(self) -> tuple[np.ndarray, np.ndarray]:
        """Link and node totals held by the current holdings, summed from the holdings themselves."""
        links = np.zeros_like(self.link_capacity)
        nodes = np.zeros_like(self.node_capacity)
        for delta in self.holdings.values():
            np.add.at(links, np.asarray(delta.link_ids, dtype=np.int64), np.asarray(delta.link_amounts, dtype=np.int64))
            np.add.at(nodes, np.asarray(delta.node_ids, dtype=np.int64), np.asarray(delta.node_amounts, dtype=np.int64))
        return links, nodes

    def check_invariants(self) -> None:
        """Assert residuals are non-negative and allocated + residual == capacity, exactly."""
        links, nodes = self.allocated()
        assert (self.link_residual >= 0).all() and (self.node_residual >= 0).all(), "negative residual"
        assert np.array_equal(links + self.link_residual, self.link_capacity), "link bookkeeping broken"
        assert np.array_equal(nodes + self.node_residual, self.node_capacity), "node bookkeeping broken"
