"""A multi-lane highway with road-side units and mmWave vehicles: traffic, line of sight and relays.

Pure numpy, no PettingZoo: ``vehicular_relay.py`` wraps this in the Parallel API. The design is the
one in ``docs/vehicular.md``: a Nagel-Schreckenberg cellular automaton per lane (with a symmetric
lane-change rule), an open road that vehicles enter and leave, LOS links between mmWave nodes
(range R, blocked by any vehicle body on the segment), relays found by graph search from the RSUs.

Coordinates: x runs along the road in metres (cell ``c`` has its centre at ``(c + 0.5) * cell_m``),
y across it (lane ``l`` has its centre at ``(l + 0.5) * lane_width_m``); RSUs stand beside lane 0
at ``y = -rsu_offset_m``. Lane "left" means lane index + 1 (away from the RSUs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

# Actions a controlled vehicle can take (the spec's five moves). KEEP keeps driving as the traffic
# model does (its speed rule, random slowdown and lane-change rule), so an agent that always keeps is
# exactly an uncontrolled vehicle; the other four override the model for that second.
KEEP, ACCELERATE, DECELERATE, LANE_LEFT, LANE_RIGHT = range(5)
ACTION_NAMES = ("keep", "accelerate", "decelerate", "lane_left", "lane_right")
# Observation grid channels.
CHANNELS = ("vehicle", "mmwave", "rsu", "connected")
_T_EPS = 1e-9  # a segment must run inside a body for more than this fraction of its length to be blocked


@dataclass
class VehicularRelayConfig:
    """Road, radio, traffic and reward settings of the ``vehicular_relay`` scenario (units in names)."""

    lanes: int = 3
    road_length_m: float = 3000.0
    cell_m: float = 5.0
    lane_width_m: float = 4.0
    vehicle_length_m: float = 4.5
    vehicle_width_m: float = 1.8
    rsu_spacing_m: float = 1000.0
    rsu_offset_m: float = 2.0
    radio_range_m: float = 100.0
    penetration: float = 0.2
    n_agents: int = 20
    density: float = 0.15
    inflow: float = 0.6
    vmax: int = 5
    slowdown_prob: float = 0.2
    lane_change_prob: float = 0.5
    max_steps: int = 200
    warmup_steps: int = 60
    view_cells: int = 20
    reward_coverage: float = 1.0
    reward_connected: float = 0.1
    penalty_unsafe: float = 0.1
    # Per-agent coverage term: "marginal_coverage" (coverage lost if its radio were off, its body still
    # blocking), "difference" (coverage with minus without the whole vehicle, radio and body: a
    # counterfactual that also charges the links its body blocks), or "shared_coverage" (the road's
    # coverage, the same for every agent). The first two are scaled so one vehicle covering a fresh
    # 2R stretch earns 1.
    reward: Literal["marginal_coverage", "difference", "shared_coverage"] = "marginal_coverage"
    reward_team: float = 0.0      # weight of a shared term every agent gets: the road's coverage, same scale
    penalty_slow: float = 0.0     # weight of (1 - speed/vmax) while the road ahead is free (speed-keeping)
    observation: Literal["grid", "grid_features"] = "grid"  # grid_features adds RSU / relay-end / gap features
    # For the learner: a vehicle driving off the road is terminal (True: its future rewards are 0, so a
    # positive per-step reward pays it to dawdle and stay on the road), or bootstrapped from its last
    # observation (False: leaving is neither sought nor avoided, a new agent takes its place).
    exit_terminal: bool = True

    @property
    def n_cells(self) -> int:
        """Cells per lane."""
        return int(round(self.road_length_m / self.cell_m))

    @property
    def vehicles_at_reset(self) -> int:
        """How many vehicles the road holds right after reset (density x lanes x cells)."""
        return int(round(self.density * self.lanes * self.n_cells))

    def validate(self) -> None:
        """Reject settings that make no road, no radio or an impossible agent count (ValueError names the key)."""
        for key in ("lanes", "n_agents", "vmax", "max_steps", "view_cells"):
            if getattr(self, key) < (0 if key == "n_agents" else 1):
                raise ValueError(f"{key}: {getattr(self, key)} must be at least {0 if key == 'n_agents' else 1}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: {self.warmup_steps} must be >= 0")
        for key in ("cell_m", "lane_width_m", "vehicle_length_m", "vehicle_width_m", "rsu_spacing_m",
                    "radio_range_m", "road_length_m"):
            value = getattr(self, key)
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"{key}: {value} must be a positive number of metres")
        for key in ("penetration", "density", "inflow", "slowdown_prob", "lane_change_prob"):
            value = getattr(self, key)
            if not (0.0 <= value <= 1.0):
                raise ValueError(f"{key}: {value} is outside [0, 1]")
        if self.vehicle_length_m > self.cell_m:
            raise ValueError(f"vehicle_length_m: {self.vehicle_length_m} is longer than a cell (cell_m={self.cell_m})")
        if self.vehicle_width_m > self.lane_width_m:
            raise ValueError(f"vehicle_width_m: {self.vehicle_width_m} is wider than a lane "
                             f"(lane_width_m={self.lane_width_m})")
        if self.road_length_m < self.radio_range_m:
            raise ValueError(f"road_length_m: {self.road_length_m} m is shorter than the radio range "
                             f"(radio_range_m={self.radio_range_m} m)")
        if self.rsu_spacing_m > self.road_length_m:
            raise ValueError(f"rsu_spacing_m: {self.rsu_spacing_m} m leaves no RSU on a "
                             f"{self.road_length_m} m road")
        if self.reward not in ("marginal_coverage", "difference", "shared_coverage"):
            raise ValueError(f"reward: {self.reward!r} is not one of marginal_coverage, difference, shared_coverage")
        if self.observation not in ("grid", "grid_features"):
            raise ValueError(f"observation: {self.observation!r} is not one of grid, grid_features")
        for key in ("reward_team", "penalty_slow", "penalty_unsafe"):
            value = getattr(self, key)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{key}: {value} must be a non-negative number")
        if self.n_agents > self.vehicles_at_reset:
            raise ValueError(f"n_agents: {self.n_agents} agents but only {self.vehicles_at_reset} vehicles on the "
                             f"road (density*lanes*cells = {self.density}*{self.lanes}*{self.n_cells})")


# ---------------------------------------------------------------------------------------------
# Geometry: line of sight, relays, coverage (pure functions, tested against brute force)
# ---------------------------------------------------------------------------------------------

def segment_blocked(p0: np.ndarray, p1: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """For segments p0[k]->p1[k] and boxes rects[k] = (xmin, xmax, ymin, ymax): does the segment cross the box's interior?

    Liang-Barsky clipping: the parameter interval where the segment is inside both slabs must have
    positive length, so touching a corner or running along an edge does not block.
    """
    d = p1 - p0
    t_lo = np.zeros(len(d))
    t_hi = np.ones(len(d))
    for axis in range(2):
        lo, hi = rects[:, 2 * axis], rects[:, 2 * axis + 1]
        start, delta = p0[:, axis], d[:, axis]
        moving = np.abs(delta) > 0
        safe = np.where(moving, delta, 1.0)
        t1 = (lo - start) / safe
        t2 = (hi - start) / safe
        enter = np.where(moving, np.minimum(t1, t2), np.where((start > lo) & (start < hi), -np.inf, np.inf))
        leave = np.where(moving, np.maximum(t1, t2), np.where((start > lo) & (start < hi), np.inf, -np.inf))
        t_lo = np.maximum(t_lo, enter)
        t_hi = np.minimum(t_hi, leave)
    return (t_hi - t_lo) > _T_EPS


def los_adjacency(node_xy: np.ndarray, node_body: np.ndarray, body_rects: np.ndarray,
                  radio_range_m: float, sole_blocker: bool = False):
    """Symmetric boolean (N, N): nodes i, j are linked iff within range and no other body blocks the segment.

    node_body[i] is the index in body_rects of node i's own vehicle (-1 for an RSU); a node's own
    body never blocks its links. Bodies are only tested against segments they could reach in x.
    With ``sole_blocker`` also returns a symmetric int (N, N): for an in-range pair blocked by
    exactly one body, that body's index (removing it would link the pair); -1 otherwise.
    """
    n = len(node_xy)
    adj = np.zeros((n, n), dtype=bool)
    sole = np.full((n, n), -1, dtype=np.int64)
    if n < 2:
        return (adj, sole) if sole_blocker else adj
    diff = node_xy[:, None, :] - node_xy[None, :, :]
    in_range = np.einsum("ijk,ijk->ij", diff, diff) <= radio_range_m ** 2 + 1e-9
    ii, jj = np.nonzero(np.triu(in_range, 1))
    if len(ii) == 0:
        return (adj, sole) if sole_blocker else adj
    blocked = np.zeros(len(ii), dtype=bool)
    if len(body_rects):
        order = np.argsort(body_rects[:, 0], kind="stable")
        xmin_sorted = body_rects[order, 0]
        max_len = float(np.max(body_rects[:, 1] - body_rects[:, 0]))
        seg_lo = np.minimum(node_xy[ii, 0], node_xy[jj, 0]) - max_len
        seg_hi = np.maximum(node_xy[ii, 0], node_xy[jj, 0])
        first = np.searchsorted(xmin_sorted, seg_lo, side="left")
        last = np.searchsorted(xmin_sorted, seg_hi, side="right")
        counts = last - first
        pair = np.repeat(np.arange(len(ii)), counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        body = order[np.repeat(first, counts) + offsets]
        own = (body == node_body[ii[pair]]) | (body == node_body[jj[pair]])
        pair, body = pair[~own], body[~own]
        hit = segment_blocked(node_xy[ii[pair]], node_xy[jj[pair]], body_rects[body])
        blocked[pair[hit]] = True
        if sole_blocker:
            hits = np.bincount(pair[hit], minlength=len(ii))
            only = hits[pair[hit]] == 1
            p1, b1 = pair[hit][only], body[hit][only]
            sole[ii[p1], jj[p1]] = b1
            sole[jj[p1], ii[p1]] = b1
    adj[ii[~blocked], jj[~blocked]] = True
    adj = adj | adj.T
    return (adj, sole) if sole_blocker else adj


def reachable_from(adj: np.ndarray, sources: np.ndarray, removed: Optional[np.ndarray] = None) -> np.ndarray:
    """Which nodes a graph search from ``sources`` reaches; rows of ``removed`` (B, N) give batched node deletions.

    Returns (N,) bool, or (B, N) bool when ``removed`` is given (node b removed in row b, etc.).
    Breadth-first by frontier expansion: each round adds every neighbour of the reached set.
    """
    single = removed is None
    keep = np.ones((1, len(adj)), dtype=bool) if single else ~removed
    reach = reachable_batched(adj[None, :, :], sources, keep)
    return reach[0] if single else reach


def reachable_batched(adj: np.ndarray, sources: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Graph search from ``sources`` on B graphs at once: adj (B or 1, N, N), keep (B, N) -> reached (B, N) bool.

    Frontier expansion in boolean arrays (no BLAS call: tiny matrix products pay thread start-up
    costs that dwarf the work on a loaded machine).
    """
    reach = sources[None, :] & keep
    while True:
        grown = reach | ((reach[:, :, None] & adj).any(axis=1) & keep)
        if np.array_equal(grown, reach):
            return reach
        reach = grown


def covered_counts(node_x: np.ndarray, reach: np.ndarray, cell_m: float, n_cells: int,
                   radio_range_m: float) -> np.ndarray:
    """Per row of ``reach`` (B, N): how many cells lie within range of a reached node (a union of intervals).

    Node i covers the cells whose centre is within radio_range_m of node_x[i], a contiguous index
    range [lo_i, hi_i]; with the nodes sorted by lo, a running maximum of hi gives each node's new cells.
    """
    eps = 1e-9
    lo = np.maximum(np.ceil((node_x - radio_range_m - eps) / cell_m - 0.5), 0).astype(np.int64)
    hi = np.minimum(np.floor((node_x + radio_range_m + eps) / cell_m - 0.5), n_cells - 1).astype(np.int64)
    order = np.argsort(lo, kind="stable")
    lo, hi, reach = lo[order], hi[order], reach[:, order]
    top = np.where(reach, hi, -1)
    before = np.concatenate([np.full((len(reach), 1), -1), np.maximum.accumulate(top, axis=1)[:, :-1]], axis=1)
    new = np.where(reach, np.maximum(hi - np.maximum(lo, before + 1) + 1, 0), 0)
    return new.sum(axis=1)


def component_labels(adj: np.ndarray) -> np.ndarray:
    """Connected-component label of each node (the smallest node index in its component)."""
    n = len(adj)
    labels = np.arange(n)
    while True:
        neighbour_min = np.where(adj, labels[None, :], n).min(axis=1) if n else labels
        new = np.minimum(labels, neighbour_min)
        new = new[new]  # pointer jumping speeds up long chains
        if np.array_equal(new, labels):
            return labels
        labels = new


def relay_lengths(node_x: np.ndarray, is_rsu: np.ndarray, adj: np.ndarray) -> np.ndarray:
    """Per RSU: the farthest along-road distance (m) from it to a vehicle reachable through LOS hops (0 if none)."""
    labels = component_labels(adj)
    rsu_idx = np.nonzero(is_rsu)[0]
    vehicle = ~is_rsu
    out = np.zeros(len(rsu_idx))
    for k, r in enumerate(rsu_idx):
        members = (labels == labels[r]) & vehicle
        if members.any():
            out[k] = np.abs(node_x[members] - node_x[r]).max()
    return out


def covered_cells(node_x: np.ndarray, connected: np.ndarray, cell_centres: np.ndarray,
                  radio_range_m: float) -> np.ndarray:
    """Which road cells lie within radio range (along the road) of at least one RSU-connected node."""
    near = np.abs(cell_centres[None, :] - node_x[connected][:, None]) <= radio_range_m + 1e-9
    return near.any(axis=0)


# ---------------------------------------------------------------------------------------------
# The highway: vehicles, traffic, agents
# ---------------------------------------------------------------------------------------------

@dataclass
class RelayState:
    """What the graph search found at one instant: the nodes, their links and what is RSU-connected."""

    node_x: np.ndarray        # (N,) along-road position, m
    node_y: np.ndarray        # (N,) across-road position, m
    node_vehicle: np.ndarray  # (N,) vehicle index, -1 for RSUs
    is_rsu: np.ndarray        # (N,) bool
    adj: np.ndarray           # (N, N) LOS links
    sole_blocker: np.ndarray  # (N, N) the one vehicle whose body alone blocks an in-range pair, else -1
    connected: np.ndarray     # (N,) bool, reachable from some RSU
    coverage: float           # fraction of road cells within range of a connected node
    relay_length_m: float     # mean over RSUs of the farthest reachable vehicle distance
    relay_length_max_m: float


class Highway:
    """The road and its vehicles; ``step`` advances traffic by one second given moves for controlled vehicles.

    Vehicle arrays are kept sorted by (lane, cell). ``agent_id`` holds -1 for an uncontrolled
    vehicle, else the index of the agent that drives it; agents enter (new ids) and leave the road.
    """

    def __init__(self, cfg: VehicularRelayConfig, rng: np.random.Generator) -> None:
        cfg.validate()
        self.cfg = cfg
        self.rng = rng
        self.n_cells = cfg.n_cells
        self.cell_centres = (np.arange(self.n_cells) + 0.5) * cfg.cell_m
        self.lane_centres = (np.arange(cfg.lanes) + 0.5) * cfg.lane_width_m
        first = cfg.rsu_spacing_m / 2.0
        self.rsu_x = np.arange(first, cfg.road_length_m, cfg.rsu_spacing_m)
        self.rsu_y = np.full(len(self.rsu_x), -cfg.rsu_offset_m)
        self.next_agent_id = 0
        self.lane = np.zeros(0, dtype=np.int64)
        self.cell = np.zeros(0, dtype=np.int64)
        self.speed = np.zeros(0, dtype=np.int64)
        self.mmwave = np.zeros(0, dtype=bool)
        self.agent_id = np.zeros(0, dtype=np.int64)
        self.t = 0

    # -- population ---------------------------------------------------------------------------
    def populate(self, n_agents: int) -> None:
        """Place density*lanes*cells vehicles on distinct random cells, run warm-up traffic, then hand n_agents to agents."""
        cfg = self.cfg
        total = cfg.vehicles_at_reset
        if n_agents > total:
            raise ValueError(f"n_agents: {n_agents} agents but only {total} vehicles on the road")
        flat = self.rng.choice(cfg.lanes * self.n_cells, size=total, replace=False)
        self.lane, self.cell = np.divmod(flat, self.n_cells)
        self.speed = self.rng.integers(0, cfg.vmax + 1, size=total)
        self.mmwave = self.rng.random(total) < cfg.penetration
        self.agent_id = np.full(total, -1, dtype=np.int64)
        self._sort()
        for _ in range(cfg.warmup_steps):
            self.step({}, admit_agents=False)
        if n_agents > len(self.lane):
            raise ValueError(f"n_agents: {n_agents} agents but only {len(self.lane)} vehicles after warm-up")
        chosen = self.rng.choice(len(self.lane), size=n_agents, replace=False)
        self.agent_id[np.sort(chosen)] = np.arange(n_agents)
        self.mmwave[chosen] = True
        self.next_agent_id = n_agents
        self.t = 0

    def _sort(self) -> None:
        self._reorder(np.lexsort((self.cell, self.lane)))

    def _reorder(self, index: np.ndarray) -> None:
        """Apply one index (a permutation or a selection) to every per-vehicle array."""
        for name in ("lane", "cell", "speed", "mmwave", "agent_id"):
            setattr(self, name, getattr(self, name)[index])

    def occupancy(self) -> np.ndarray:
        """(lanes, cells) grid of vehicle indices, -1 where empty."""
        occ = np.full((self.cfg.lanes, self.n_cells), -1, dtype=np.int64)
        occ[self.lane, self.cell] = np.arange(len(self.lane))
        return occ

    def gap_ahead(self) -> np.ndarray:
        """Empty cells to the vehicle ahead in the same lane (open road: effectively unlimited for the leader)."""
        gap = np.full(len(self.lane), self.n_cells + self.cfg.vmax, dtype=np.int64)
        if len(self.lane) > 1:
            same = self.lane[1:] == self.lane[:-1]
            gap[:-1][same] = (self.cell[1:] - self.cell[:-1] - 1)[same]
        return gap

    def _neighbours_in(self, target_lane: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For positions (target_lane, cells): cell occupied?, gap ahead, gap behind, speed of the follower."""
        cfg = self.cfg
        n = len(cells)
        occupied = np.zeros(n, dtype=bool)
        ahead = np.full(n, self.n_cells + cfg.vmax, dtype=np.int64)
        behind = np.full(n, self.n_cells + cfg.vmax, dtype=np.int64)
        follower_speed = np.zeros(n, dtype=np.int64)
        for lane in range(cfg.lanes):
            sel = np.nonzero(target_lane == lane)[0]
            if len(sel) == 0:
                continue
            in_lane = np.nonzero(self.lane == lane)[0]
            lane_cells = self.cell[in_lane]
            pos = np.searchsorted(lane_cells, cells[sel], side="left")
            has_next = pos < len(lane_cells)
            nxt = np.where(has_next, lane_cells[np.minimum(pos, len(lane_cells) - 1)] if len(lane_cells) else 0, 0)
            occupied[sel] = has_next & (nxt == cells[sel])
            ahead[sel] = np.where(has_next, nxt - cells[sel] - 1, ahead[sel])
            has_prev = pos > 0
            prev = np.maximum(pos - 1, 0)
            if len(lane_cells):
                behind[sel] = np.where(has_prev, cells[sel] - lane_cells[prev] - 1, behind[sel])
                follower_speed[sel] = np.where(has_prev, self.speed[in_lane[prev]], 0)
        return occupied, ahead, behind, follower_speed

    # -- dynamics -----------------------------------------------------------------------------
    def step(self, actions: dict[int, int], admit_agents: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Advance one second: lane changes, Nagel-Schreckenberg speeds, moves, exits, entries.

        ``actions`` maps agent id -> action; vehicles without one, or with KEEP, follow the traffic model.
        Returns (agent ids that left the road, agent ids whose requested move was unsafe or impossible).
        """
        cfg, rng = self.cfg, self.rng
        n = len(self.lane)
        action = np.full(n, -1, dtype=np.int64)
        if actions:
            index_of = np.full(self.next_agent_id + 1, -1, dtype=np.int64)
            driven = np.nonzero(self.agent_id >= 0)[0]
            index_of[self.agent_id[driven]] = driven
            ids = np.fromiter(actions.keys(), dtype=np.int64, count=len(actions))
            acts = np.fromiter(actions.values(), dtype=np.int64, count=len(actions))
            if ids.min() < 0 or ids.max() >= self.next_agent_id or (index_of[ids] < 0).any():
                raise ValueError(f"actions: agent ids {sorted(ids.tolist())} include ones not on the road")
            if acts.min() < 0 or acts.max() >= len(ACTION_NAMES):
                raise ValueError(f"actions: {acts.tolist()} must each be in 0..{len(ACTION_NAMES) - 1}")
            action[index_of[ids]] = acts
        controlled = action > KEEP  # KEEP and no action both drive as the traffic model
        unsafe = np.zeros(n, dtype=bool)

        # 1. lane changes (decided on the current positions, applied together)
        gap = self.gap_ahead()
        target = self.lane.copy()
        # uncontrolled: symmetric rule; change when blocked and the other lane offers more room
        want = (~controlled) & (gap < np.minimum(self.speed + 1, cfg.vmax)) & (rng.random(n) < cfg.lane_change_prob)
        direction = np.where(rng.random(n) < 0.5, 1, -1)
        for attempt in (direction, -direction):
            cand = np.nonzero(want & (target == self.lane))[0]
            if len(cand) == 0:
                break
            lane_to = self.lane[cand] + attempt[cand]
            exists = (lane_to >= 0) & (lane_to < cfg.lanes)
            cand, lane_to = cand[exists], lane_to[exists]
            occ, ahead, behind, _ = self._neighbours_in(lane_to, self.cell[cand])
            ok = (~occ) & (ahead > gap[cand]) & (behind >= cfg.vmax)
            target[cand[ok]] = lane_to[ok]
        # controlled: the requested lane change if the lane exists, the cell is free and the follower need not brake
        movers = np.nonzero(controlled & ((action == LANE_LEFT) | (action == LANE_RIGHT)))[0]
        if len(movers):
            lane_to = self.lane[movers] + np.where(action[movers] == LANE_LEFT, 1, -1)
            exists = (lane_to >= 0) & (lane_to < cfg.lanes)
            occ, _, behind, follower_speed = self._neighbours_in(np.clip(lane_to, 0, cfg.lanes - 1), self.cell[movers])
            ok = exists & (~occ) & (behind >= follower_speed)
            target[movers[ok]] = lane_to[ok]
            unsafe[movers[~ok]] = True
        changing = np.nonzero(target != self.lane)[0]
        if len(changing):
            # two vehicles may aim at one cell from both sides: a random one of them goes
            key = target[changing] * self.n_cells + self.cell[changing]
            shuffled = rng.permutation(len(changing))
            _, first = np.unique(key[shuffled], return_index=True)
            winners = np.zeros(len(changing), dtype=bool)
            winners[shuffled[first]] = True
            target[changing[~winners]] = self.lane[changing[~winners]]
            self.lane = target
            order = np.lexsort((self.cell, self.lane))
            self._reorder(order)
            action, controlled, unsafe = action[order], controlled[order], unsafe[order]
        # 2. speeds (Nagel-Schreckenberg; agents choose their own, capped by the gap)
        gap = self.gap_ahead()
        free = np.minimum(self.speed + 1, cfg.vmax)
        auto = np.minimum(free, gap)
        auto = np.where(rng.random(len(auto)) < cfg.slowdown_prob, np.maximum(auto - 1, 0), auto)
        wanted = self.speed + np.where(action == ACCELERATE, 1, 0) - np.where(action == DECELERATE, 1, 0)
        wanted = np.clip(wanted, 0, cfg.vmax)
        unsafe |= controlled & (action == ACCELERATE) & (wanted > gap)
        self.speed = np.where(controlled, np.minimum(wanted, gap), auto)
        # 3. moves and exits
        self.cell = self.cell + self.speed
        gone = self.cell >= self.n_cells
        left_ids = self.agent_id[gone & (self.agent_id >= 0)]
        unsafe_ids = self.agent_id[unsafe & (self.agent_id >= 0) & ~gone]
        self._reorder(~gone)
        # 4. entries at cell 0 of each lane
        self._admit(admit_agents)
        self.t += 1
        return left_ids, unsafe_ids

    def _admit(self, admit_agents: bool) -> None:
        cfg, rng = self.cfg, self.rng
        arrive = rng.random(cfg.lanes) < cfg.inflow
        lanes = np.nonzero(arrive)[0]
        if len(lanes) == 0:
            return
        occ, ahead, _, _ = self._neighbours_in(lanes, np.zeros(len(lanes), dtype=np.int64))
        lanes, ahead = lanes[~occ], ahead[~occ]
        if len(lanes) == 0:
            return
        k = len(lanes)
        mm = rng.random(k) < cfg.penetration
        agent = np.full(k, -1, dtype=np.int64)
        if admit_agents:
            active = int((self.agent_id >= 0).sum())
            for i in range(k):
                if active < cfg.n_agents:
                    agent[i] = self.next_agent_id
                    self.next_agent_id += 1
                    mm[i] = True
                    active += 1
        self.lane = np.concatenate([self.lane, lanes])
        self.cell = np.concatenate([self.cell, np.zeros(k, dtype=np.int64)])
        self.speed = np.concatenate([self.speed, np.minimum(cfg.vmax, ahead)])
        self.mmwave = np.concatenate([self.mmwave, mm])
        self.agent_id = np.concatenate([self.agent_id, agent])
        self._sort()

    # -- radio --------------------------------------------------------------------------------
    def body_rects(self) -> np.ndarray:
        """(V, 4) vehicle bodies as (xmin, xmax, ymin, ymax) in metres."""
        cfg = self.cfg
        x = self.cell_centres[self.cell]
        y = self.lane_centres[self.lane]
        hl, hw = cfg.vehicle_length_m / 2, cfg.vehicle_width_m / 2
        return np.stack([x - hl, x + hl, y - hw, y + hw], axis=1)

    def relay_state(self) -> RelayState:
        """LOS graph over RSUs and mmWave vehicles, the RSU-connected set, coverage and relay length."""
        cfg = self.cfg
        mm = np.nonzero(self.mmwave)[0]
        node_x = np.concatenate([self.rsu_x, self.cell_centres[self.cell[mm]]])
        node_y = np.concatenate([self.rsu_y, self.lane_centres[self.lane[mm]]])
        node_vehicle = np.concatenate([np.full(len(self.rsu_x), -1), mm])
        is_rsu = node_vehicle < 0
        adj, sole = los_adjacency(np.stack([node_x, node_y], axis=1), node_vehicle, self.body_rects(),
                                  cfg.radio_range_m, sole_blocker=True)
        connected = reachable_from(adj, is_rsu)
        covered = covered_cells(node_x, connected, self.cell_centres, cfg.radio_range_m)
        relay = relay_lengths(node_x, is_rsu, adj)
        return RelayState(node_x, node_y, node_vehicle, is_rsu, adj, sole, connected, float(covered.mean()),
                          float(relay.mean()) if len(relay) else 0.0, float(relay.max()) if len(relay) else 0.0)

    def marginal_coverage(self, state: RelayState, agent_vehicles: np.ndarray) -> np.ndarray:
        """Per given vehicle: coverage lost if its radio were switched off (its body still blocks)."""
        out = np.zeros(len(agent_vehicles))
        node_of = {int(v): i for i, v in enumerate(state.node_vehicle) if v >= 0}
        rows = [(k, node_of[int(v)]) for k, v in enumerate(agent_vehicles)
                if int(v) in node_of and state.connected[node_of[int(v)]]]
        if not rows:
            return out
        removed = np.zeros((len(rows), len(state.node_x)), dtype=bool)
        removed[np.arange(len(rows)), [r[1] for r in rows]] = True
        reach = reachable_from(state.adj, state.is_rsu, removed)
        without = covered_counts(state.node_x, reach, self.cfg.cell_m, self.n_cells, self.cfg.radio_range_m) / self.n_cells
        out[[r[0] for r in rows]] = state.coverage - without
        return out

    def difference_coverage(self, state: RelayState, vehicles: np.ndarray) -> np.ndarray:
        """Per given vehicle: coverage minus the coverage of the same road without that vehicle (radio and body).

        The counterfactual "this vehicle was not here": its node goes, and every in-range pair that
        only its body blocked becomes linked. Negative when its body cuts more relay than its radio
        adds. All vehicles at once: one graph search over a (B, N, N) stack of adjacencies.
        """
        out = np.zeros(len(vehicles))
        if len(vehicles) == 0:
            return out
        n = len(state.node_x)
        node_of = np.full(len(self.lane), -1, dtype=np.int64)
        veh_nodes = np.nonzero(state.node_vehicle >= 0)[0]
        node_of[state.node_vehicle[veh_nodes]] = veh_nodes
        vehicles = np.asarray(vehicles, dtype=np.int64)
        adj = state.adj[None, :, :] | (state.sole_blocker[None, :, :] == vehicles[:, None, None])
        keep = np.ones((len(vehicles), n), dtype=bool)
        own = node_of[vehicles]
        rows = np.nonzero(own >= 0)[0]
        keep[rows, own[rows]] = False
        reach = reachable_batched(adj, state.is_rsu, keep)
        without = covered_counts(state.node_x, reach, self.cfg.cell_m, self.n_cells, self.cfg.radio_range_m) / self.n_cells
        return state.coverage - without
