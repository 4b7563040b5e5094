"""AMARL routing (docs/routing.md): the commit service, PPO per service (`amarl`) or for all (`single_ppo`).

The server hosts the shared resource environment as a ``CommitService``. A worker routes its own
request stream: it reads the last snapshot the server sent, decides with its policy, and sends one
message per decision: ``commit`` (its due releases plus the chosen path's resource delta) or
``release`` (only the releases, after a reject). The reply is ``accept``/``refuse`` (or
``snapshot``) with fresh residuals. A refused request is re-planned on them up to
``scenario.max_replans`` times. Each message carries the network time of the worker's request; a
worker more than ``algorithm.max_clock_skew_s`` ahead of the slowest waits for its reply (bounded
skew, so the agents meet each other's load at the same time of day). Workers learn locally with the actor-critic core's PPO update and
upload their parameters (``policy``) so the server can checkpoint and evaluate them.

Heuristic baselines: shortest-path first-fit, random feasible path, uniformly random action.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import gymnasium
import numpy as np
import torch

from agents.actor_critic import PPOConfig, PullingWorker, actor_critic_update, build_models, make_optimizer, sample_actions
from agents.heads import FlatParameters, count_params, head_report, worker_heads
from agents.rollout import EpisodeBook, Step, book_step, evaluate, rollout
from marl_q.errors import ConfigError, UserError
from marl_q.evaluation import EvalProgress, eval_progress
from marl_q.messages import SERVER, TRAIN, Message
from marl_q.protocol import ActingPolicy, Algorithm, Context, MessageSpec, Outcome, Service, Work, worker_name
from marl_q.registry import ALGORITHMS
from marl_q.seeding import routing_demand_entropy, routing_eval_seed, worker_seed
from scenarios.routing import (ACCEPTED, SHIFTS, AgentStream, Plan, Policy, RequestOutcome, RoutingConfig, RoutingWorld,
                               summarize_outcomes)
from scenarios.routing_resources import ResourceDelta, ResourceError, Snapshot

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

COMMIT, RELEASE, POLICY = "commit", "release", "policy"
FRESH_START = "fresh_start"   # info flag on a worker's first message: release what earlier incarnations held
ACCEPT, REFUSE, SNAPSHOT = "accept", "refuse", "snapshot"


# ----------------------------------------------------------------------------- heuristics
def shortest_path_first_fit(service: str, obs: np.ndarray, feasible: np.ndarray) -> int:
    """The shortest-delay candidate path that is feasible (paths are sorted by delay), else reject."""
    idx = np.flatnonzero(feasible)
    return int(idx[0]) if len(idx) else len(feasible)


class RandomFeasible:
    """A uniformly random feasible path, else reject."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, service: str, obs: np.ndarray, feasible: np.ndarray) -> int:
        idx = np.flatnonzero(feasible)
        return int(self.rng.choice(idx)) if len(idx) else len(feasible)


class UniformRandom:
    """A uniformly random action among the k path slots and reject (what an untrained policy does)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, service: str, obs: np.ndarray, feasible: np.ndarray) -> int:
        return int(self.rng.integers(len(feasible) + 1))


HEURISTICS: dict[str, Callable[[int], Policy]] = {
    "shortest_path_first_fit": lambda seed: shortest_path_first_fit,
    "random_feasible": RandomFeasible,
    "uniform_random": UniformRandom,
}


# ----------------------------------------------------------------------------- config
@dataclass
class RoutingPPOConfig(PPOConfig):
    """PPO for routing: one decision per step; the episode is a metrics window, not a reset."""

    n_steps: int = 256
    gamma: float = 0.5
    gae_lambda: float = 0.9
    lr: float = 1e-3
    # measured with these (the single-agent PPO defaults until issue 26)
    epochs: int = 4
    minibatches: int = 4
    ent_coef: float = 0.01
    value_clip: Optional[float] = 0.2
    episode_requests: int = 200          # finished requests per metrics row
    policy_push_every: int = 1           # rollouts between parameter uploads (the server evaluates the last)
    eval_days: float = 1.0               # evaluation length in (compressed) days, per demand
    eval_shifts: list[str] = field(default_factory=lambda: list(SHIFTS))
    eval_baselines: bool = True          # also evaluate the heuristics on the same demand
    # Pacing: a worker whose request stream is more than this many network seconds ahead of the
    # slowest worker's gets its reply held back until the others catch up, so that every agent
    # meets the others' load at (nearly) the same time of day. null = no pacing.
    max_clock_skew_s: Optional[float] = 30.0

    def validate(self) -> None:
        super().validate()
        bad = [s for s in self.eval_shifts if s not in SHIFTS]
        if bad:
            raise ValueError(f"eval_shifts: {bad} not among {list(SHIFTS)}")
        if self.max_clock_skew_s is not None and not self.max_clock_skew_s >= 0:
            raise ValueError(f"max_clock_skew_s must be >= 0 or null, got {self.max_clock_skew_s}")
        if self.episode_requests < 1 or self.policy_push_every < 1 or not self.eval_days >= 0:
            raise ValueError("episode_requests and policy_push_every must be >= 1, eval_days >= 0")


# ----------------------------------------------------------------------------- shared pieces
def routing_spaces(world: RoutingWorld, service_onehot: bool) -> tuple[gymnasium.spaces.Box, gymnasium.spaces.Discrete]:
    """Observation and action spaces of a routing learner."""
    obs = gymnasium.spaces.Box(-1.0, 4.0, shape=(world.obs_dim(service_onehot),), dtype=np.float32)
    return obs, gymnasium.spaces.Discrete(world.cfg.k_paths + 1)


def greedy_policy(policy: ActingPolicy) -> Policy:
    """Deterministic policy: the argmax action of the actor that owns the request's service."""

    def act(service: str, obs: np.ndarray, feasible: np.ndarray) -> int:
        return policy.act({service: obs})[service]

    return act


class RoutingReplay:
    """The exact global-clock replay of every request of [start_s, end_s) on the live resources, as a
    one-copy vector for ``agents.rollout``: ``observe`` gives the open request's (service, observation,
    feasibility mask) against the current resources, ``step(action)`` routes it (a reject, or a commit
    resolved at once) and, once the request is finished (accepted, given up, or out of re-plans), moves
    to the next one, handing back the holdings that ended before it. The one episode ends with the
    stream, every holding released; the reward of a step is the plan's. ``outcomes``: the requests'."""

    num_envs = 1

    def __init__(self, world: RoutingWorld, service_onehot: bool, start_s: float, end_s: float, seed: int) -> None:
        self.resources = world.new_resources()
        self.stream = AgentStream(world, world.services, np.random.default_rng(seed), service_onehot, start_s=start_s,
                                  horizon_s=end_s - start_s)
        self.done = not self._advance()  # no request at all in the window: nothing to step

    @property
    def outcomes(self) -> list[RequestOutcome]:
        return self.stream.outcomes

    def _advance(self) -> bool:
        """Open the next request (False: the stream is over, every holding handed back)."""
        if self.stream.advance() is None:
            for rid in self.stream.release_all():
                self.resources.release(rid)
            self.resources.check_invariants()
            assert not self.resources.holdings, "evaluation left holdings behind"
            return False
        for rid in self.stream.take_releases():
            self.resources.release(rid)
        return True

    def observe(self) -> tuple[str, np.ndarray, np.ndarray]:
        self.snap = self.resources.snapshot()
        obs, self.feasible = self.stream.observe(self.snap)
        return self.stream.current.service, obs, self.feasible

    def step(self, action: int) -> Step:
        plan = self.stream.act(action, self.feasible)
        if plan.delta is None:
            reward, finished = plan.reward, True
        else:
            reward, finished = self.stream.resolve(plan, self.resources.commit(plan.delta, self.snap.version).accepted)
        ended = finished and not self._advance()
        return Step(np.ones(1, dtype=bool), np.array([reward]), np.array([ended]))


def evaluate_routing(world: RoutingWorld, policy: Policy, service_onehot: bool, start_s: float, end_s: float,
                     seed: int) -> list[RequestOutcome]:
    """Route every request of [start_s, end_s) in global time order on the live state (``RoutingReplay``,
    stepped by the shared evaluation loop ``agents.rollout.evaluate`` until its one episode ends)."""
    replay = RoutingReplay(world, service_onehot, start_s, end_s, seed)
    if not replay.done:
        evaluate(replay, 1, lambda seen: policy(*seen))
    return replay.outcomes


def evaluate_on_shifts(scenario: RoutingConfig, policy_for: Callable[[], Policy], service_onehot: bool,
                       shifts: list[str], days: float, seed: int, prefix: str,
                       bar: Optional[EvalProgress] = None) -> dict[str, float]:
    """GoS and latency of a policy on each demand (nominal and shifted), one exact replay each
    (``bar``: a progress bar ticked once per replay)."""
    out: dict[str, float] = {}
    for shift in shifts:
        world = RoutingWorld(scenario, shift)
        outcomes = evaluate_routing(world, policy_for(), service_onehot, 0.0, days * scenario.day_seconds, seed)
        for key, value in summarize_outcomes(outcomes, world.services).items():
            out[f"{prefix}{shift}_{key}"] = value
        if bar is not None:
            bar.update()
    return out


# ----------------------------------------------------------------------------- service
class CommitService(Service):
    """The shared resource environment on the server: optimistic commits, releases, policy uploads."""

    def __init__(self, cfg: ExperimentConfig, owners: dict[str, list[str]], service_onehot: bool,
                 n_params: int) -> None:
        self.cfg = cfg
        self.world = RoutingWorld(cfg.scenario.params)
        self.resources = self.world.new_resources()
        self.owners = owners                    # worker -> services it routes
        self.service_onehot = service_onehot
        self.n_params = n_params
        ids = ((None,), "int64")
        self.specs = {
            COMMIT: MessageSpec({"release_ids": ids, "request": ((3,), "int64"), "links": ids, "nodes": ids,
                                 "clock": ((1,), "float64")}),
            RELEASE: MessageSpec({"release_ids": ids, "clock": ((1,), "float64")}, versioned=False),
            POLICY: MessageSpec({"params": ((n_params,), "float32")}, versioned=False),
        }
        self.holder: dict[int, str] = {}        # request id -> worker that holds it
        self.policies: dict[str, np.ndarray] = {}
        self.per_worker = {w: {"commits": 0, "accepted": 0, "refused": 0, "conflicts": 0, "held_back": 0}
                           for w in owners}
        self._updates = 0
        self.max_skew = cfg.algorithm.params.max_clock_skew_s
        self.clock = {w: 0.0 for w in owners}   # network time of each worker's latest request
        self.withheld: dict[str, str] = {}      # worker -> kind of the reply it is waiting for

    def _reply(self, kind: str, worker: str, version: int) -> Message:
        return Message(SERVER, worker, kind, {"link_residual": self.resources.link_residual.copy(),
                                              "node_residual": self.resources.node_residual.copy()},
                       base_version=version)

    def hello(self, worker: str, version: int) -> list[Message]:
        return [self._reply(SNAPSHOT, worker, version)]

    def on_reject(self, msg: Message, version: int) -> list[Message]:
        return [self._reply(REFUSE if msg.kind == COMMIT else SNAPSHOT, msg.src, version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        if msg.kind == POLICY:
            self.policies[msg.src] = msg.payload["params"].copy()
            return Outcome(False, [])
        assert self.resources.version == ctx.version, "resource versions must track server versions"
        release_ids = [int(r) for r in msg.payload["release_ids"]]
        if msg.info.get(FRESH_START):
            # a (re)started worker knows nothing of what an earlier incarnation held: give it back now
            orphans = sorted(r for r, w in self.holder.items() if w == msg.src and r not in release_ids)
            release_ids = orphans + release_ids
        foreign = [r for r in release_ids if self.holder.get(r) != msg.src]
        delta = None
        if msg.kind == COMMIT:
            rid, link_kbps, node_kbps = (int(v) for v in msg.payload["request"])
            delta = ResourceDelta.along_path(rid, msg.payload["links"], msg.payload["nodes"], link_kbps, node_kbps)
        refusal_kind = REFUSE if delta is not None else SNAPSHOT
        if foreign:
            return Outcome(False, [self._reply(refusal_kind, msg.src, ctx.version)], accepted=False,
                           reason=f"release of request {foreign[0]}, which {msg.src} does not hold")
        try:
            result = self.resources.transact(release_ids, delta, msg.base_version)
        except ResourceError as exc:
            return Outcome(False, [self._reply(refusal_kind, msg.src, ctx.version)], accepted=False, reason=str(exc))
        for r in release_ids:
            del self.holder[r]
        applied = self.resources.version != ctx.version
        self._updates += int(applied)
        version = ctx.next_version if applied else ctx.version
        reason = ""
        if result is None:
            kind = SNAPSHOT
        else:
            stats = self.per_worker[msg.src]
            stats["commits"] += 1
            if result.accepted:
                self.holder[delta.request_id] = msg.src
                stats["accepted"] += 1
                kind = ACCEPT
            else:
                stats["refused"] += 1
                stats["conflicts"] += int(result.stale)
                kind, reason = REFUSE, f"refused: {result.reason}"
        return Outcome(applied, self._paced_replies(msg.src, kind, float(msg.payload["clock"][0]), version),
                       reason=reason)

    def _ahead(self, worker: str) -> bool:
        return self.max_skew is not None and self.clock[worker] > min(self.clock.values()) + self.max_skew

    def _paced_replies(self, src: str, kind: str, clock: float, version: int) -> list[Message]:
        """The reply to ``src`` unless its stream is too far ahead, plus replies held back so far
        from workers the others have now caught up with (with fresh residuals)."""
        self.clock[src] = max(self.clock[src], clock)
        out = []
        if self._ahead(src):
            self.withheld[src] = kind
            self.per_worker[src]["held_back"] += 1
        else:
            out.append(self._reply(kind, src, version))
        for worker, held_kind in list(self.withheld.items()):
            if worker != src and not self._ahead(worker):
                out.append(self._reply(held_kind, worker, version))
                del self.withheld[worker]
        return out

    def updates(self) -> int:
        return self._updates

    # -- persistence ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        held = sorted(self.resources.holdings)
        deltas = [self.resources.holdings[r] for r in held]
        state = {
            "link_residual": self.resources.link_residual.copy(),
            "node_residual": self.resources.node_residual.copy(),
            "version": np.array(self.resources.version), "updates": np.array(self._updates),
            "held_ids": np.array(held, dtype=np.int64),
            "held_worker": np.array([list(self.owners).index(self.holder[r]) for r in held], dtype=np.int64),
            "held_link_counts": np.array([len(d.link_ids) for d in deltas], dtype=np.int64),
            "held_links": np.concatenate([d.link_ids for d in deltas] or [np.zeros(0, np.int64)]),
            "held_link_amounts": np.concatenate([d.link_amounts for d in deltas] or [np.zeros(0, np.int64)]),
            "held_node_counts": np.array([len(d.node_ids) for d in deltas], dtype=np.int64),
            "held_nodes": np.concatenate([d.node_ids for d in deltas] or [np.zeros(0, np.int64)]),
            "held_node_amounts": np.concatenate([d.node_amounts for d in deltas] or [np.zeros(0, np.int64)]),
        }
        for worker, params in self.policies.items():
            state[f"policy.{worker}"] = params.copy()
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        res = self.world.new_resources()
        link_ends = np.cumsum(state["held_link_counts"])
        node_ends = np.cumsum(state["held_node_counts"])
        workers = list(self.owners)
        self.holder = {}
        for i, rid in enumerate(state["held_ids"].tolist()):
            ls, le = (link_ends[i - 1] if i else 0), link_ends[i]
            ns, ne = (node_ends[i - 1] if i else 0), node_ends[i]
            d = ResourceDelta(rid, state["held_links"][ls:le], state["held_link_amounts"][ls:le],
                              state["held_nodes"][ns:ne], state["held_node_amounts"][ns:ne])
            if not res.commit(d, res.version).accepted:
                raise ResourceError(f"checkpoint holds request {rid}, which does not fit the network")
            self.holder[rid] = workers[int(state["held_worker"][i])]
        if not (np.array_equal(res.link_residual, state["link_residual"])
                and np.array_equal(res.node_residual, state["node_residual"])):
            raise ResourceError("checkpoint residuals do not match its holdings")
        res.version = int(state["version"])
        self.resources = res
        self._updates = int(state["updates"])
        self.policies = {k[len("policy."):]: np.asarray(v, dtype=np.float32) for k, v in state.items()
                         if k.startswith("policy.")}

    # -- summary: conflicts and the evaluation of the uploaded policies ------------------------
    def acting_policy(self) -> ActingPolicy:
        """Per service (the agents), the actor of the worker that routes it, from uploaded parameters;
        models: service name -> that actor."""
        missing = [w for w in self.owners if w not in self.policies]
        if missing:
            raise UserError(f"workers {missing} never uploaded a policy (run shorter than n_steps?)")
        obs_space, act_space = routing_spaces(self.world, self.service_onehot)
        actors = {}
        for worker, services in self.owners.items():
            actor, critic = build_models(self.cfg, obs_space, act_space)
            FlatParameters(actor, critic).load(self.policies[worker])
            for s in services:
                actors[s] = actor

        @torch.no_grad()
        def logits(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {s: actors[s](torch.from_numpy(o[None]))[0].numpy() for s, o in obs.items()}

        return ActingPolicy(logits, agents=list(actors), models=actors)

    def summary(self) -> dict[str, Any]:
        c = self.resources.counters
        out: dict[str, Any] = {
            "commits": c.commits, "commits_accepted": c.accepted, "commits_refused": c.refused,
            "commit_conflicts": c.conflicts, "stale_commits": c.stale_commits, "releases": c.releases,
            "commit_conflict_rate": c.conflicts / c.commits if c.commits else 0.0,
            "commit_refusal_rate": c.refused / c.commits if c.commits else 0.0,
            "per_worker": {w: dict(v, services=self.owners[w]) for w, v in self.per_worker.items()},
        }
        algo = self.cfg.algorithm.params
        missing = [w for w in self.owners if w not in self.policies]
        if algo.eval_days > 0 and missing:
            out["eval_skipped"] = f"workers {missing} never uploaded a policy (run shorter than n_steps?)"
        elif algo.eval_days > 0:
            scenario = self.cfg.scenario.params
            seed = routing_eval_seed(self.cfg.run.seed)
            policy = self.acting_policy()
            replays = len(algo.eval_shifts) * (1 + (len(HEURISTICS) if algo.eval_baselines else 0))
            with eval_progress(replays, self.cfg.run.progress, desc="eval (demand replays)") as bar:
                out.update(evaluate_on_shifts(scenario, lambda: greedy_policy(policy), self.service_onehot,
                                              algo.eval_shifts, algo.eval_days, seed, "eval_", bar))
                if algo.eval_baselines:
                    for name, make in HEURISTICS.items():
                        out.update(evaluate_on_shifts(scenario, lambda: make(seed), False, algo.eval_shifts,
                                                      algo.eval_days, seed, f"baseline_{name}_", bar))
        return out


# ----------------------------------------------------------------------------- worker
class RoutingDecisions:
    """A training worker's request stream as a one-copy vector for ``agents.rollout.rollout``, made for
    each of its steps (its state is the worker's). ``observe`` opens the next request when none is open
    (the worker's due releases patched into its snapshot) and gives its observation against the
    worker's snapshot; ``step(action)`` plans it and queues the message it sends (``messages``): a
    release after a reject, whose reward is known now, or a commit, whose reward and end the commit
    service's reply brings (``Step.deferred``; the worker books it in ``pulled``)."""

    num_envs = 1

    def __init__(self, worker: "RoutingPPOWorker") -> None:
        self.worker = worker
        self.messages: list[Message] = []

    def observe(self) -> np.ndarray:
        w = self.worker
        if not w.request_open:
            w._next_request()
        obs, self.feasible = w.stream.observe(w.snapshot)
        return obs

    def step(self, action: int) -> Step:
        w = self.worker
        plan = w.stream.act(action, self.feasible)
        release_ids = np.array(w.releases, dtype=np.int64)
        w.releases = []
        clock = np.array([w.stream.current.time_s], dtype=np.float64)
        w.seq += 1
        if plan.delta is None:
            self.messages.append(Message(w.name, SERVER, RELEASE, {"release_ids": release_ids, "clock": clock},
                                         base_version=w.version, seq=w.seq))
            return w._resolved(plan.reward, True)
        w.pending = plan
        d = plan.delta
        self.messages.append(Message(w.name, SERVER, COMMIT, {
            "release_ids": release_ids,
            "request": np.array([d.request_id, d.link_amounts[0] if len(d.link_amounts) else 0,
                                 d.node_amounts[0] if len(d.node_amounts) else 0], dtype=np.int64),
            "links": d.link_ids.astype(np.int64), "nodes": d.node_ids.astype(np.int64), "clock": clock},
            base_version=w.snapshot.version, seq=w.seq))
        return Step(np.ones(1, dtype=bool), np.zeros(1), np.zeros(1, dtype=bool), deferred=True)


class RoutingPPOWorker(PullingWorker):
    """Routes one request stream, one decision per step, and learns with the actor-critic core's
    PPO update (``agents.actor_critic.actor_critic_update``). It says hello and waits for the commit
    service's reply to each decision (``PullingWorker``: every reply kind ends the wait)."""

    pulls = (ACCEPT, REFUSE, SNAPSHOT)

    def __init__(self, cfg: ExperimentConfig, index: int, services: list[str], service_onehot: bool) -> None:
        self.cfg = cfg
        self.ac: RoutingPPOConfig = cfg.algorithm.params
        self.name = worker_name(index)
        seed = worker_seed(cfg.run.seed, index)
        self.rng = np.random.default_rng(seed)  # the models are seeded_init's (build_models), torch's stream untouched
        self.world = RoutingWorld(cfg.scenario.params)
        self.stream = AgentStream(self.world, services, np.random.default_rng(routing_demand_entropy(seed)), service_onehot,
                                  first_id=index, id_step=cfg.backend.workers)
        obs_space, act_space = routing_spaces(self.world, service_onehot)
        self.actor, self.critic = build_models(cfg, obs_space, act_space)
        # circuit heads: their own shot/SPSA streams, and their executions counted for the ledger
        self.resources = worker_heads({"actor": self.actor, "critic": self.critic}, cfg.run.seed, index)
        self.flat = FlatParameters(self.actor, self.critic)
        self.optimizer = make_optimizer(self.ac.optimizer, self.flat.flat, self.ac)
        self.snapshot: Optional[Snapshot] = None
        self.waiting = True
        self.pending: Optional[Plan] = None
        self.request_open = False
        self.held: dict[int, ResourceDelta] = {}
        self.releases: list[int] = []
        self.obs_buf: list[np.ndarray] = []
        self.act_buf: list[int] = []
        self.rew_buf: list[float] = []
        self.rollouts = 0
        self.seq = 0
        self.fresh = True
        self.compute_s = 0.0   # real seconds spent in step() and deliver(): this agent's own compute
        self.version = 0
        self.book = EpisodeBook(1)  # the episode under way: its return and decisions (agents.rollout)
        self.first_outcome = 0  # its first request outcome (stream.outcomes)
        self._rows: list[dict[str, Any]] = []  # episodes that ended in a reply, for the next step's Work
        self._trained: list[dict[str, Any]] = []  # diagnostics of the updates not yet uploaded

    def pulled(self, msg: Message) -> None:
        """The reply's residuals become the snapshot the next decision reads; a pending plan is resolved."""
        t0 = time.perf_counter()
        self.snapshot = Snapshot(msg.base_version, np.array(msg.payload["link_residual"]),
                                 np.array(msg.payload["node_residual"]))
        if self.pending is not None:
            plan, self.pending = self.pending, None
            accepted = msg.kind == ACCEPT
            reward, finished = self.stream.resolve(plan, accepted)
            if accepted:
                self.held[plan.delta.request_id] = plan.delta
            self._rows += book_step(self.book, self._resolved(reward, finished), self._episode_row)
        self.compute_s += time.perf_counter() - t0

    def _next_request(self) -> None:
        request = self.stream.advance()
        assert request is not None, "training streams are unbounded"
        self.request_open = True
        for rid in self.stream.take_releases():
            d = self.held.pop(rid)
            # the worker knows exactly what it gives back: patch its view before deciding
            np.add.at(self.snapshot.link_residual, d.link_ids, d.link_amounts)
            np.add.at(self.snapshot.node_residual, d.node_ids, d.node_amounts)
            self.releases.append(rid)

    def step(self) -> Work:
        """One decision through the shared rollout loop (``agents.rollout.rollout`` over
        ``RoutingDecisions``): a PPO update first when n_steps rewards are in, then sample, plan and send.
        A commit's reward comes with the reply (``pulled``), so its step is deferred and booked there."""
        t0 = time.perf_counter()
        decisions = RoutingDecisions(self)

        def act(obs: np.ndarray) -> int:
            if len(self.rew_buf) >= self.ac.n_steps:
                self._update(obs)
                if self.rollouts % self.ac.policy_push_every == 0:
                    decisions.messages.append(self.policy_message())
            return int(sample_actions(self.actor, obs[None], self.rng)[0])

        def store(t: int, obs: np.ndarray, action: int, step: Step) -> None:
            self.obs_buf.append(obs)
            self.act_buf.append(action)

        rows, taken = rollout(decisions, self.book, 1, act, store=store, row=self._episode_row)
        messages = decisions.messages
        if self.fresh:
            messages[-1].info[FRESH_START] = True
            self.fresh = False
        self.waiting = True
        rows, self._rows = self._rows + rows, []
        self.compute_s += time.perf_counter() - t0
        for row in rows:
            row["compute_s"] = self.compute_s
        return Work(messages, env_steps=taken, episodes=rows, resources=head_report(self.resources))

    def policy_message(self) -> Message:
        """Upload of the current actor and critic parameters, with the diagnostics of the local updates
        since the last upload (train.csv; outside the counted payload, marl_q.messages.TRAIN)."""
        trained, self._trained = self._trained, []
        return Message(self.name, SERVER, POLICY, {"params": self.flat.numpy().astype(np.float32)},
                       base_version=self.version, info={TRAIN: trained} if trained else {})

    def _resolved(self, reward: float, finished: bool) -> Step:
        """A decision's step once its reward is known: kept for the update; the episode ends when its
        request is finished and ``episode_requests`` requests have an outcome since the episode began."""
        self.rew_buf.append(reward)
        ended = False
        if finished:
            self.request_open = False
            ended = len(self.stream.outcomes) - self.first_outcome >= self.ac.episode_requests
        return Step(np.ones(1, dtype=bool), np.array([reward], dtype=np.float64), np.array([ended]))

    def _episode_row(self, i: int) -> dict[str, Any]:
        """The routing fields of the episode that ended (``rollout``'s ``row`` hook): its requests'
        grade of service, latency and refusals, from the outcomes since it began."""
        done = self.stream.outcomes[self.first_outcome:]
        lat = [o.latency_ms for o in done if o.outcome == ACCEPTED]
        self.first_outcome = len(self.stream.outcomes)
        return {"requests": len(done), "gos": len(lat) / len(done), "latency_ms": float(np.mean(lat)) if lat else float("nan"),
                "refusals": int(sum(o.refusals for o in done)), "net_time_s": done[-1].time_s,
                "service": "+".join(self.stream.services), "version": self.version}

    def _update(self, next_obs: np.ndarray) -> None:
        """One PPO update on the last n_steps decisions (a continuing task: bootstrap from next_obs)."""
        T = len(self.rew_buf)
        obs = np.stack(self.obs_buf + [next_obs])[:, None, :]
        zeros = np.zeros((T, 1), dtype=bool)
        batch = {"obs": obs, "actions": np.array(self.act_buf, dtype=np.int64)[:, None],
                 "rewards": np.array(self.rew_buf, dtype=np.float64)[:, None], "terminated": zeros,
                 "dones": zeros, "valid": np.ones((T, 1), dtype=bool)}
        diag = actor_critic_update(self.ac, self.actor, self.critic, self.flat, self.optimizer, self.rng, batch)
        self._trained.append(diag)
        self.obs_buf, self.act_buf, self.rew_buf = [], [], []
        self.rollouts += 1

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- algorithms
class RoutingPPO(Algorithm):
    """Shared wiring of the two routing learners; subclasses say who routes which services."""

    metric_fields = ["return", "length", "requests", "gos", "latency_ms", "refusals", "net_time_s",
                     "service", "version"]
    wall_fields = ("compute_s",)  # real seconds: metrics_wall.csv, so metrics.csv stays deterministic
    service_onehot = False

    @classmethod
    def owned_services(cls, services: list[str], workers: int) -> list[list[str]]:
        raise NotImplementedError

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        if cfg.scenario.name != "routing":
            raise ConfigError(f"algorithm.name {cfg.algorithm.name!r} needs scenario.name: routing, "
                              f"got {cfg.scenario.name!r}")
        cls.owned_services(list(cfg.scenario.params.services), cfg.backend.workers)
        try:  # build the world once per demand now, so a bad trace file fails at load time, named
            for shift in dict.fromkeys([cfg.scenario.params.shift, *cfg.algorithm.params.eval_shifts]):
                RoutingWorld(cfg.scenario.params, shift)
        except ValueError as exc:
            raise ConfigError(f"scenario: {exc}") from None
        if cfg.server.max_staleness is not None:
            raise ConfigError("server.max_staleness must be null for routing: a stale snapshot alone is no "
                              "conflict; the commit service checks feasibility against the current state")

    def owners(self) -> dict[str, list[str]]:
        services = list(self.cfg.scenario.params.services)
        return {worker_name(i): s for i, s in enumerate(self.owned_services(services, self.cfg.backend.workers))}

    def make_service(self) -> CommitService:
        world = RoutingWorld(self.cfg.scenario.params)
        actor, critic = build_models(self.cfg, *routing_spaces(world, self.service_onehot))
        self.param_counts = {"actor_params": count_params(actor), "critic_params": count_params(critic)}
        return CommitService(self.cfg, self.owners(), self.service_onehot, count_params(actor) + count_params(critic))

    def acting_policy(self, state: dict[str, np.ndarray]) -> ActingPolicy:
        """The uploaded actors of a checkpointed commit service, one per service."""
        service = self.make_service()
        service.load_state_dict(state)
        return service.acting_policy()

    def make_worker(self, index: int) -> RoutingPPOWorker:
        services = self.owners()[worker_name(index)]
        return RoutingPPOWorker(self.cfg, index, services, self.service_onehot)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = dict(getattr(self, "param_counts", {}))
        for service in {m["service"] for m in metrics}:
            rows = [m for m in metrics if m["service"] == service][-5:]
            out[f"train_final_gos_{service}"] = float(np.mean([m["gos"] for m in rows]))
        return out


@ALGORITHMS.register("amarl", config=RoutingPPOConfig,
                     help="routing: one PPO learner per service, coordinating only through commits")
class IndependentRoutingPPO(RoutingPPO):
    """AMARL: worker i routes service i with its own PPO learner."""

    service_onehot = False

    @classmethod
    def owned_services(cls, services: list[str], workers: int) -> list[list[str]]:
        if workers != len(services):
            raise ConfigError(f"backend.workers: amarl runs one worker per service, so {len(services)} "
                              f"for {services}; got {workers}")
        return [[s] for s in services]


@ALGORITHMS.register("single_ppo", config=RoutingPPOConfig,
                     help="routing baseline: one PPO agent routes every service (service one-hot input)")
class SingleRoutingPPO(RoutingPPO):
    """The single-agent baseline: one worker routes all services, the service one-hot in its input."""

    service_onehot = True

    @classmethod
    def owned_services(cls, services: list[str], workers: int) -> list[list[str]]:
        if workers != 1:
            raise ConfigError(f"backend.workers: single_ppo is one agent, so 1; got {workers}")
        return [list(services)]
