"""AMARL routing scenario: services route requests over a shared O-RAN-like network (docs/routing.md).

Pieces, each usable on its own:
- ``RoutingWorld``: the network, its candidate paths, the demand and the shared resources of one run;
- ``AgentStream``: one agent's request stream with its own holdings (releases) and the encoding of
  a request into an observation against a (possibly stale) snapshot; workers and evaluation use it;
- an exact global-clock replay in which a policy routes every request is ``agents.routing.RoutingReplay``,
  a vector of the shared rollout loop (``agents.routing.evaluate_routing``);
- ``RoutingParallelEnv``: the per-service PettingZoo view ``marlq/routing-v0``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional

import gymnasium
import numpy as np
import pettingzoo
from pettingzoo import ParallelEnv

from scenarios.routing_demand import (SERVICE_PROFILES, DemandError, DiurnalDemand, Request, ServiceProfile,
                                      city_cell_weights, load_trace_csv, request_stream)
from scenarios.routing_network import CandidatePath, NetworkShape, PathCatalog, build_metro_network
from scenarios.routing_resources import ResourceDelta, SharedResources, Snapshot
from scenarios.spec import ScenarioSpec

SHIFTS = ("none", "urllc_surge", "embb_peak_moved")
REQUEST_FEATURES = 4
PATH_FEATURES = 6
BANDWIDTH_REF_KBPS = 160_000.0


@dataclass
class RoutingConfig:
    """The ``scenario`` section for ``name: routing``."""

    services: list[str] = field(default_factory=lambda: ["embb", "urllc", "mmtc"])
    k_paths: int = 4
    max_replans: int = 2
    day_seconds: float = 1200.0
    load_scale: float = 1.4
    topology_seed: int = 0
    n_core: int = 2
    n_cu: int = 4
    n_du: int = 8
    cells_per_du: int = 3
    trace_csv: Optional[str] = None
    shift: Literal["none", "urllc_surge", "embb_peak_moved"] = "none"
    urllc_surge_factor: float = 2.5
    embb_shifted_peak_hour: float = 11.0
    latency_weight: float = 0.3
    reject_penalty: float = 0.1
    infeasible_penalty: float = 1.0
    slot_seconds: float = 0.05
    episode_seconds: float = 60.0

    def validate(self) -> None:
        """Called by the config loader: values the types alone do not rule out."""
        validate_routing_config(self)


def validate_routing_config(cfg: RoutingConfig) -> None:
    """Raise ValueError naming the key for values the types alone do not rule out."""
    unknown = [s for s in cfg.services if s not in SERVICE_PROFILES]
    if unknown or not cfg.services or len(set(cfg.services)) != len(cfg.services):
        raise ValueError(f"scenario.services: {cfg.services} must be distinct names from {list(SERVICE_PROFILES)}")
    for key in ("k_paths", "n_core", "n_cu", "n_du", "cells_per_du"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"scenario.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.max_replans < 0:
        raise ValueError(f"scenario.max_replans must be >= 0, got {cfg.max_replans}")
    for key in ("day_seconds", "slot_seconds", "episode_seconds"):
        if not getattr(cfg, key) > 0:
            raise ValueError(f"scenario.{key} must be > 0, got {getattr(cfg, key)}")
    if not cfg.load_scale >= 0 or not cfg.urllc_surge_factor >= 0:
        raise ValueError("scenario.load_scale and scenario.urllc_surge_factor must be >= 0")
    if cfg.shift not in SHIFTS:
        raise ValueError(f"scenario.shift: {cfg.shift!r} is not one of {SHIFTS}")


def shifted_profiles(cfg: RoutingConfig, shift: str) -> tuple[dict[str, ServiceProfile], dict[str, float]]:
    """Service profiles and rate multipliers under a demand shift (none, URLLC surge, moved eMBB peak)."""
    profiles = dict(SERVICE_PROFILES)
    multiplier: dict[str, float] = {}
    if shift == "urllc_surge":
        multiplier["urllc"] = cfg.urllc_surge_factor
    elif shift == "embb_peak_moved":
        p = profiles["embb"]
        profiles["embb"] = ServiceProfile(p.name, p.bandwidth_mbps, p.budget_ms, p.mean_holding_s,
                                          p.peak_rate_per_cell, cfg.embb_shifted_peak_hour,
                                          p.trough_fraction, p.processing_factor, p.destination)
    elif shift != "none":
        raise ValueError(f"shift {shift!r} is not one of {SHIFTS}")
    return profiles, multiplier


class RoutingWorld:
    """The fixed parts of a run: topology, candidate paths and the demand model (under one shift)."""

    def __init__(self, cfg: RoutingConfig, shift: Optional[str] = None) -> None:
        validate_routing_config(cfg)
        self.cfg = cfg
        self.shift = cfg.shift if shift is None else shift
        shape = NetworkShape(n_core=cfg.n_core, n_cu=cfg.n_cu, n_du=cfg.n_du, cells_per_du=cfg.cells_per_du)
        self.topology = build_metro_network(shape, cfg.topology_seed)
        self.catalog = PathCatalog(self.topology, cfg.k_paths)
        self.services = list(cfg.services)
        self.n_cells = len(self.topology.cells)
        self.profiles, multiplier = shifted_profiles(cfg, self.shift)
        if cfg.trace_csv:
            if self.shift == "embb_peak_moved":
                raise DemandError("shift embb_peak_moved moves a synthetic profile, so it needs trace_csv unset "
                                  "(with a trace, leave embb_peak_moved out of algorithm.eval_shifts)")
            self.demand = load_trace_csv(cfg.trace_csv, self.n_cells, self.services, cfg.day_seconds)
            self.demand.rate_multiplier = multiplier
        else:
            weights = city_cell_weights(self.n_cells, self.services, cfg.topology_seed)
            self.demand = DiurnalDemand(self.profiles, weights, cfg.day_seconds, cfg.load_scale, multiplier)

    def new_resources(self) -> SharedResources:
        """Fresh shared resources at full capacity."""
        return SharedResources(self.topology.link_capacity, self.topology.node_capacity)

    def stream(self, services: list[str], start_s: float, end_s: float, rng: np.random.Generator,
               first_id: int = 0, id_step: int = 1):
        """Time-ordered requests of ``services`` over [start_s, end_s)."""
        return request_stream(self.demand, self.profiles, services, self.n_cells, self.topology.cores,
                              self.topology.edge_cu_of_cell, start_s, end_s, rng, first_id, id_step)

    def paths_for(self, request: Request) -> list[CandidatePath]:
        """Candidate paths from the request's cell to its destination (empty when unreachable)."""
        return self.catalog.paths(self.topology.cells[request.cell], request.destination)

    def obs_dim(self, service_onehot: bool) -> int:
        """Length of an observation vector."""
        return REQUEST_FEATURES + PATH_FEATURES * self.cfg.k_paths + (len(self.services) if service_onehot else 0)


def path_table(world: RoutingWorld, request: Request, paths: list[CandidatePath], snapshot: Snapshot
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate slot: features (k, PATH_FEATURES) and whether that path is feasible on the snapshot.

    Features: exists, feasible, delay / budget, link headroom after the request relative to the
    bottleneck link's capacity, the same for processing nodes, hop count / 10.
    """
    k = world.cfg.k_paths
    profile = world.profiles[request.service]
    feats = np.zeros((k, PATH_FEATURES), dtype=np.float32)
    feasible = np.zeros(k, dtype=bool)
    bw = request.bandwidth_kbps
    proc = bw * profile.processing_factor
    for i, p in enumerate(paths[:k]):
        link_res = snapshot.link_residual[p.links]
        link_cap = world.topology.link_capacity[p.links]
        link_headroom = float(np.min((link_res - bw) / link_cap))
        if len(p.processing_nodes):
            node_res = snapshot.node_residual[p.processing_nodes]
            node_cap = world.topology.node_capacity[p.processing_nodes]
            node_headroom = float(np.min((node_res - proc) / node_cap))
        else:
            node_headroom = 1.0
        ok = link_headroom >= 0.0 and node_headroom >= 0.0 and p.delay_ms <= profile.budget_ms
        feasible[i] = ok
        feats[i] = (1.0, float(ok), min(p.delay_ms / profile.budget_ms, 4.0), max(link_headroom, -1.0),
                    max(node_headroom, -1.0), len(p.links) / 10.0)
    return feats, feasible


def request_features(world: RoutingWorld, request: Request) -> np.ndarray:
    """Bandwidth, budget and time of day of a request, scaled to order one."""
    profile = world.profiles[request.service]
    phase = 2.0 * math.pi * (request.time_s % world.cfg.day_seconds) / world.cfg.day_seconds
    return np.array([request.bandwidth_kbps / BANDWIDTH_REF_KBPS, math.log10(profile.budget_ms) / 2.0,
                     math.sin(phase), math.cos(phase)], dtype=np.float32)


def encode_observation(world: RoutingWorld, request: Request, paths: list[CandidatePath], snapshot: Snapshot,
                       service_onehot: bool) -> tuple[np.ndarray, np.ndarray]:
    """Observation vector for one request and the feasibility mask of its k path slots."""
    feats, feasible = path_table(world, request, paths, snapshot)
    parts = [request_features(world, request), feats.reshape(-1)]
    if service_onehot:
        onehot = np.zeros(len(world.services), dtype=np.float32)
        onehot[world.services.index(request.service)] = 1.0
        parts.append(onehot)
    return np.concatenate(parts).astype(np.float32), feasible


def delta_for(world: RoutingWorld, request: Request, path: CandidatePath) -> ResourceDelta:
    """The resources a request takes on a path: its bandwidth on each link, processing at each node."""
    proc = request.bandwidth_kbps * world.profiles[request.service].processing_factor
    return ResourceDelta.along_path(request.request_id, path.links, path.processing_nodes,
                                    request.bandwidth_kbps, proc)


# Outcome labels of one request (one row each in the outcome log).
ACCEPTED, REJECTED, INFEASIBLE, CONFLICT, UNREACHABLE = "accepted", "rejected", "infeasible", "conflict", "unreachable"


@dataclass
class RequestOutcome:
    """How one request ended: accepted with a latency, or blocked and why."""

    request_id: int
    service: str
    time_s: float
    outcome: str
    latency_ms: float = float("nan")
    refusals: int = 0
    no_feasible_path: bool = False


def accepted_reward(cfg: RoutingConfig, latency_ms: float, budget_ms: float) -> float:
    """Reward of an accepted request: 1 minus a latency term relative to the budget."""
    return 1.0 - cfg.latency_weight * latency_ms / budget_ms


@dataclass
class Plan:
    """What an action on a snapshot amounts to: a commit to submit, or a final outcome right away."""

    delta: Optional[ResourceDelta]
    path: Optional[CandidatePath]
    outcome: Optional[str]       # REJECTED or INFEASIBLE when no commit is submitted
    reward: float


def plan_action(world: RoutingWorld, request: Request, paths: list[CandidatePath], feasible: np.ndarray,
                action: int) -> Plan:
    """Turn an action (path slot, or k = reject) into a commit or an immediate outcome."""
    k = world.cfg.k_paths
    if not 0 <= int(action) <= k:
        raise ValueError(f"routing action must be in 0..{k}, got {action}")
    if action == k:
        return Plan(None, None, REJECTED, -world.cfg.reject_penalty)
    if not feasible[action]:
        return Plan(None, None, INFEASIBLE, -world.cfg.infeasible_penalty)
    path = paths[action]
    return Plan(delta_for(world, request, path), path, None, 0.0)


class AgentStream:
    """One agent's request stream: current request, re-plans left, own holdings and their releases.

    Transport-agnostic: a worker feeds it snapshots from server replies, evaluation feeds it the
    live state. Requests it cannot route at all (unreachable destination) are logged and skipped.
    """

    def __init__(self, world: RoutingWorld, services: list[str], rng: np.random.Generator,
                 service_onehot: bool, first_id: int = 0, id_step: int = 1, start_s: float = 0.0,
                 horizon_s: float = math.inf) -> None:
        self.world = world
        self.services = services
        self.service_onehot = service_onehot
        self._requests = world.stream(services, start_s, start_s + horizon_s, rng, first_id, id_step)
        self._holdings: list[tuple[float, int]] = []   # (release time, request id)
        self.current: Optional[Request] = None
        self.paths: list[CandidatePath] = []
        self.refusals = 0
        self.outcomes: list[RequestOutcome] = []
        self.exhausted = False
        self._pending_releases: list[int] = []
        self._no_feasible = False

    def advance(self) -> Optional[Request]:
        """Move to the next routable request; due releases of own holdings queue up on the way."""
        while True:
            request = next(self._requests, None)
            if request is None:
                self.exhausted = True
                self.current = None
                self._pending_releases.extend(rid for _, rid in self._holdings)
                self._holdings.clear()
                return None
            while self._holdings and self._holdings[0][0] <= request.time_s:
                self._pending_releases.append(heapq.heappop(self._holdings)[1])
            paths = self.world.paths_for(request)
            if not paths:
                self.outcomes.append(RequestOutcome(request.request_id, request.service, request.time_s,
                                                    UNREACHABLE, no_feasible_path=True))
                continue
            self.current, self.paths, self.refusals = request, paths, 0
            return request

    def take_releases(self) -> list[int]:
        """Request ids whose holding time has passed (each handed out exactly once)."""
        out, self._pending_releases = self._pending_releases, []
        return out

    def release_all(self) -> list[int]:
        """Hand back every holding now (end of a run), exactly once."""
        out = self.take_releases() + [rid for _, rid in self._holdings]
        self._holdings.clear()
        return out

    def observe(self, snapshot: Snapshot) -> tuple[np.ndarray, np.ndarray]:
        """Observation and feasibility mask of the current request against a snapshot."""
        assert self.current is not None, "observe() needs a current request; call advance() first"
        obs, feasible = encode_observation(self.world, self.current, self.paths, snapshot, self.service_onehot)
        self._no_feasible = not feasible.any()
        return obs, feasible

    def act(self, action: int, feasible: np.ndarray) -> Plan:
        """Plan the action; a final outcome (reject, infeasible) is logged here."""
        plan = plan_action(self.world, self.current, self.paths, feasible, action)
        if plan.outcome is not None:
            self._log(plan.outcome)
        return plan

    def resolve(self, plan: Plan, accepted: bool) -> tuple[float, bool]:
        """Apply the environment's answer to a submitted commit: (reward, request finished)."""
        request = self.current
        if accepted:
            heapq.heappush(self._holdings, (request.time_s + request.holding_s, request.request_id))
            latency = plan.path.delay_ms
            self._log(ACCEPTED, latency)
            return accepted_reward(self.world.cfg, latency, self.world.profiles[request.service].budget_ms), True
        self.refusals += 1
        if self.refusals > self.world.cfg.max_replans:
            self._log(CONFLICT)
            return -self.world.cfg.reject_penalty, True
        return 0.0, False

    def _log(self, outcome: str, latency_ms: float = float("nan")) -> None:
        r = self.current
        self.outcomes.append(RequestOutcome(r.request_id, r.service, r.time_s, outcome, latency_ms,
                                            self.refusals, self._no_feasible))


Policy = Callable[[str, np.ndarray, np.ndarray], int]   # (service, observation, feasible mask) -> action


def summarize_outcomes(outcomes: list[RequestOutcome], services: list[str]) -> dict[str, float]:
    """Grade of service (accepted share) per service and overall; mean and p95 latency of accepted."""
    out: dict[str, float] = {}

    def stats(rows: list[RequestOutcome], prefix: str) -> None:
        n = len(rows)
        lat = np.array([r.latency_ms for r in rows if r.outcome == ACCEPTED])
        out[f"{prefix}gos"] = float(len(lat) / n) if n else float("nan")
        out[f"{prefix}latency_mean_ms"] = float(lat.mean()) if len(lat) else float("nan")
        out[f"{prefix}latency_p95_ms"] = float(np.percentile(lat, 95)) if len(lat) else float("nan")
        out[f"{prefix}requests"] = float(n)

    stats(outcomes, "")
    for s in services:
        stats([r for r in outcomes if r.service == s], f"{s}_")
    for label in (REJECTED, INFEASIBLE, CONFLICT, UNREACHABLE):
        out[f"{label}_share"] = float(np.mean([r.outcome == label for r in outcomes])) if outcomes else float("nan")
    return out


class _Lookahead:
    """A request iterator whose next item can be inspected without taking it."""

    def __init__(self, iterator) -> None:
        self._it = iterator
        self._next: Optional[Request] = next(self._it, None)

    def pop_before(self, t: float) -> list[Request]:
        """Take every request that arrives before ``t``."""
        out = []
        while self._next is not None and self._next.time_s < t:
            out.append(self._next)
            self._next = next(self._it, None)
        return out


class RoutingParallelEnv(ParallelEnv):
    """Per-service PettingZoo view: each service is an agent routing its own requests.

    Time advances in slots of ``slot_seconds``. In a slot every agent sees the oldest waiting
    request of its service (or an all-zero observation and info ``has_request=False`` when none
    waits); all agents decide on the same snapshot, and their commits are applied in a random
    order, so one agent's commit can make another's stale plan infeasible: that commit is refused
    and its request is offered again next slot, up to ``max_replans`` times. Infos carry
    ``has_request`` and ``action_mask`` (paths feasible on the snapshot, then reject).
    """

    metadata = {"name": "routing_v0", "render_modes": []}

    def __init__(self, cfg: Optional[RoutingConfig] = None, shift: Optional[str] = None) -> None:
        self.cfg = cfg or RoutingConfig()
        self.world = RoutingWorld(self.cfg, shift)
        self.possible_agents = list(self.world.services)
        self.agents: list[str] = []
        dim = self.world.obs_dim(service_onehot=False)
        self._obs_space = gymnasium.spaces.Box(low=-1.0, high=4.0, shape=(dim,), dtype=np.float32)
        self._act_space = gymnasium.spaces.Discrete(self.cfg.k_paths + 1)
        self.max_steps = int(math.ceil(self.cfg.episode_seconds / self.cfg.slot_seconds))

    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete:
        return self._act_space

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None):
        seeds = np.random.SeedSequence(seed).spawn(len(self.possible_agents) + 1)
        self._rng = np.random.default_rng(seeds[0])
        self.resources = self.world.new_resources()
        self._streams = {a: _Lookahead(self.world.stream([a], 0.0, math.inf, np.random.default_rng(s),
                                                         first_id=i, id_step=len(self.possible_agents)))
                         for i, (a, s) in enumerate(zip(self.possible_agents, seeds[1:]))}
        self._queues: dict[str, list[Request]] = {a: [] for a in self.possible_agents}
        self._refusals: dict[str, int] = {a: 0 for a in self.possible_agents}
        self._releases: list[tuple[float, int]] = []
        self.outcomes: list[RequestOutcome] = []
        self.clock = 0.0
        self.steps = 0
        self.agents = list(self.possible_agents)
        self._admit_arrivals()
        obs = self._observe()
        return obs, {a: self._decision_info(a) for a in self.agents}

    def _decision_info(self, agent: str) -> dict:
        """Whether the agent has a request now, and which actions are feasible (reject always is)."""
        mask = np.ones(self.cfg.k_paths + 1, dtype=np.int8)
        if agent in self._masks:
            mask[:-1] = self._masks[agent]
        return {"has_request": bool(self._queues[agent]), "action_mask": mask}

    def _admit_arrivals(self) -> None:
        """Queue the requests arriving in the current slot; unreachable ones are logged, not queued."""
        for a in self.possible_agents:
            for r in self._streams[a].pop_before(self.clock + self.cfg.slot_seconds):
                if self.world.paths_for(r):
                    self._queues[a].append(r)
                else:
                    self.outcomes.append(RequestOutcome(r.request_id, a, r.time_s, UNREACHABLE, no_feasible_path=True))

    def _observe(self) -> dict[str, np.ndarray]:
        self._snapshot = self.resources.snapshot()
        self._masks: dict[str, np.ndarray] = {}
        out = {}
        for a in self.agents:
            if self._queues[a]:
                r = self._queues[a][0]
                obs, mask = encode_observation(self.world, r, self.world.paths_for(r), self._snapshot, False)
                out[a] = np.clip(obs, -1.0, 4.0)
                self._masks[a] = mask
            else:
                out[a] = np.zeros(self._obs_space.shape, dtype=np.float32)
        return out

    def step(self, actions: dict[str, int]):
        rewards = {a: 0.0 for a in self.agents}
        infos: dict[str, dict] = {a: {"outcome": None} for a in self.agents}
        for a in [self.agents[i] for i in self._rng.permutation(len(self.agents))]:
            if not self._queues[a]:
                continue
            r = self._queues[a][0]
            paths = self.world.paths_for(r)
            mask = self._masks[a]
            plan = plan_action(self.world, r, paths, mask, int(actions[a]))
            outcome, latency = plan.outcome, float("nan")
            rewards[a] = plan.reward
            if plan.delta is not None:
                result = self.resources.commit(plan.delta, self._snapshot.version)
                if result.accepted:
                    heapq.heappush(self._releases, (self.clock + r.holding_s, r.request_id))
                    outcome, latency = ACCEPTED, plan.path.delay_ms
                    rewards[a] = accepted_reward(self.cfg, latency, self.world.profiles[a].budget_ms)
                else:
                    self._refusals[a] += 1
                    if self._refusals[a] > self.cfg.max_replans:
                        outcome, rewards[a] = CONFLICT, -self.cfg.reject_penalty
            infos[a]["outcome"] = outcome
            if outcome is not None:
                self.outcomes.append(RequestOutcome(r.request_id, a, r.time_s, outcome, latency,
                                                    self._refusals[a], not mask.any()))
                self._queues[a].pop(0)
                self._refusals[a] = 0
        self.clock += self.cfg.slot_seconds
        self.steps += 1
        while self._releases and self._releases[0][0] <= self.clock:
            self.resources.release(heapq.heappop(self._releases)[1])
        self._admit_arrivals()
        obs = self._observe()
        done = self.steps >= self.max_steps
        terminations = {a: False for a in self.agents}
        truncations = {a: done for a in self.agents}
        for a in self.agents:
            infos[a].update(self._decision_info(a))
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass


def make_routing_parallel_env(cfg: Optional[RoutingConfig] = None, seed: int = 0) -> RoutingParallelEnv:
    """Factory for the runtime: the per-service PettingZoo view (``seed`` is used at reset)."""
    return RoutingParallelEnv(cfg or RoutingConfig())


SCENARIOS = {
    "routing": ScenarioSpec(config=RoutingConfig, make=make_routing_parallel_env, kind="parallel",
                            help="AMARL routing: services route requests on a shared O-RAN-like network"),
}

pettingzoo.register("parallel", "marlq/routing-v0", entry_point=RoutingParallelEnv)
