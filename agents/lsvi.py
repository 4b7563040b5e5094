"""The LSVI family as marl-q algorithms: regret and communication on a finite linear MDP.

``async_coop_lsvi`` (Min et al., ICML 2023), ``coop_lsvi`` (Dubey & Pentland 2021), ``lsvi_ucb_pooled``
and ``lsvi_ucb_independent`` (Jin et al., COLT 2020). The learning logic is in lsvi_agents.py and the
math in lsvi_planner.py; this module only moves it through the server, so the ledger counts every
upload (a communication round) and every byte.

Traffic: a worker uploads ``upload`` = {gram (H, d, d): local sum phi phi^T, transitions (n, 4) int32:
[h, s, a, s'], rewards (n,)}; the server folds it into its statistics and replies ``statistics`` =
{gram (H, d, d) with lam I, reward_sums c (H, d), next_state_sums B (H, d, S)} to the uploader
(async), to every worker (pooled), or to every worker with a request to upload (a coop sync; the
uploads answering that request get the statistics back and start nothing).
A worker's step() plays exactly one episode; with ``backend.schedule`` uniform | round_robin | zipf
the sim backend picks the agent of each episode, which is the paper's asynchronous participation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from agents.lsvi_agents import (AsyncCoopAgent, CoopSyncAgent, Download, IndependentAgent, LsviAgent,
                                LsviServerRecord, PooledAgent, Upload)
from agents.lsvi_planner import lsvi_beta
from marl_q.errors import ConfigError
from marl_q.messages import SERVER, Message
from marl_q.protocol import Algorithm, Context, MessageSpec, Outcome, Service, Work, Worker, worker_name
from marl_q.registry import ALGORITHMS, SCENARIOS
from marl_q.seeding import lsvi_worker_entropy

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

UPLOAD, STATISTICS = "upload", "statistics"


# ----------------------------------------------------------------------------- config
@dataclass
class LsviConfig:
    """Shared by the family: ridge lam, bonus beta = beta_scale * d H sqrt(log(2 d H K / delta))."""

    beta_scale: float = 0.01  # 1.0 is the theory's beta, which over-explores badly at this scale
    lam: float = 1.0
    delta: float = 0.05


@dataclass
class AsyncCoopLsviConfig(LsviConfig):
    """Async-Coop-LSVI-UCB: alpha of the determinant trigger (null = 1/M^2, the paper's choice)."""

    alpha: Optional[float] = None
    use_local_data_for_planning: bool = False


@dataclass
class CoopLsviConfig(LsviConfig):
    """Coop-LSVI: a global sync when (k - k_last) log(det Lambda_now / det Lambda_last) > sync_threshold."""

    sync_threshold: float = 1.0


# ----------------------------------------------------------------------------- worker
class LsviWorker(Worker):
    """One agent m: plays an episode per step, uploads when its algorithm says, adopts downloads."""

    def __init__(self, index: int, agent: LsviAgent, seed: int) -> None:
        self.name = worker_name(index)
        self.index = index
        self.agent = agent
        self.rng = np.random.default_rng(lsvi_worker_entropy(seed, index))

    def start(self) -> list[Message]:
        return []

    def deliver(self, msg: Message) -> None:
        if msg.kind != STATISTICS:
            return
        if msg.info.get("sync_request") and isinstance(self.agent, CoopSyncAgent):
            self.agent.request_sync()
        self.agent.receive(Download(msg.payload["gram"], msg.payload["reward_sums"],
                                    msg.payload["next_state_sums"]))

    def ready(self) -> bool:
        return True

    def step(self) -> Work:
        result = self.agent.play_episode(self.rng)
        messages = []
        if self.agent.wants_upload():
            upload = self.agent.take_upload()
            payload = {"gram": upload.gram, "transitions": upload.transitions, "rewards": upload.rewards}
            info = {"answers_sync": True} if getattr(self.agent, "answers_request", False) else {}
            messages.append(Message(self.name, SERVER, UPLOAD, payload, info=info))
        row = {"agent": self.index, "regret": result.regret}
        return Work(messages=messages, env_steps=len(result.rewards), episodes=[row], cost=1.0)


# ----------------------------------------------------------------------------- service
class LsviService(Service):
    """The server's statistics; replies with them to the uploader, or to everyone when ``broadcast``."""

    def __init__(self, record: LsviServerRecord, horizon: int, d: int, n_states: int,
                 broadcast: bool, sync_request: bool) -> None:
        self.record = record
        self.broadcast = broadcast
        self.sync_request = sync_request
        self.uploads = 0
        self.specs = {UPLOAD: MessageSpec(payload={"gram": ((horizon, d, d), "float64"),
                                                   "transitions": ((None, 4), "int32"),
                                                   "rewards": ((None,), "float64")},
                                          versioned=False)}
        self._bounds = (horizon, n_states)

    def hello(self, worker: str, version: int) -> list[Message]:
        return []

    def _check(self, msg: Message) -> str:
        """Why an upload's contents are unusable ('' if they are fine); the core checked shapes and dtypes."""
        transitions, rewards = msg.payload["transitions"], msg.payload["rewards"]
        horizon, n_states = self._bounds
        if len(transitions) != len(rewards):
            return f"upload: {len(transitions)} transitions but {len(rewards)} rewards"
        n_actions = self.record.features.shape[1]
        for column, (name, limit) in enumerate((("h", horizon), ("s", n_states), ("a", n_actions),
                                                ("s'", n_states))):
            values = transitions[:, column]
            if len(values) and (values.min() < 0 or values.max() >= limit):
                return f"upload: transitions column {name} outside [0, {limit})"
        return ""

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        reason = self._check(msg)
        if reason:
            return Outcome(applied=False, accepted=False, reason=reason)
        self.record.absorb(Upload(msg.payload["gram"], msg.payload["transitions"].astype(np.int64),
                                  msg.payload["rewards"]))
        self.uploads += 1
        download = self.record.download()
        payload = {"gram": download.gram, "reward_sums": download.reward_sums,
                   "next_state_sums": download.next_state_sums}
        starts_sync = self.broadcast and not msg.info.get("answers_sync")
        recipients = ctx.workers if starts_sync else (msg.src,)
        replies = []
        for name in recipients:
            info = {"sync_request": True} if self.sync_request and name != msg.src else {}
            replies.append(Message(SERVER, name, STATISTICS, payload, base_version=ctx.next_version, info=info))
        return Outcome(applied=True, replies=replies)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"gram": self.record.gram, "reward_sums": self.record.reward_sums,
                "next_state_sums": self.record.next_state_sums}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.record.gram = np.array(state["gram"])
        self.record.reward_sums = np.array(state["reward_sums"])
        self.record.next_state_sums = np.array(state["next_state_sums"])

    def summary(self) -> dict[str, Any]:
        return {"comm_rounds": self.uploads, "transitions_received": self.record.transitions_received}

    def updates(self) -> int:
        return self.uploads


# ----------------------------------------------------------------------------- algorithms
def build_mdp(cfg: ExperimentConfig) -> Any:
    """The scenario's finite linear MDP; a clear error if the scenario is not one."""
    spec = SCENARIOS.get(cfg.scenario.name).obj
    try:
        mdp = spec.make(cfg.scenario.params, seed=cfg.run.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not all(hasattr(mdp, attr) for attr in ("phi", "optimal_values", "evaluate", "sample_next_state")):
        raise ConfigError(f"algorithm {cfg.algorithm.name}: needs a finite linear MDP scenario "
                          f"(e.g. scenario.name: linear_mdp), got {cfg.scenario.name!r}")
    return mdp


class LsviAlgorithm(Algorithm):
    """What the four share: the MDP, beta, the service, the workers and the summary."""

    metric_fields = ["agent", "regret", "cum_regret", "comm_rounds", "bytes"]
    broadcast = False
    sync_request = False

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)  # check_config ran when the config was loaded (marl_q.config.validate_cross)
        self.mdp = build_mdp(cfg)
        self.workers = cfg.backend.workers
        self.total_episodes = cfg.run.total_episodes or max(1, (cfg.run.total_env_steps or 1) // self.mdp.horizon)
        self.beta = lsvi_beta(self.mdp.d, self.mdp.horizon, self.total_episodes, cfg.algorithm.beta_scale,
                              cfg.algorithm.delta)
        self._cum_regret = 0.0

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        algo = cfg.algorithm
        if algo.beta_scale < 0:
            raise ConfigError(f"algorithm.beta_scale: must be >= 0, got {algo.beta_scale}")
        if not algo.lam > 0:
            raise ConfigError(f"algorithm.lam: must be > 0, got {algo.lam}")
        if not 0 < algo.delta < 1:
            raise ConfigError(f"algorithm.delta: must lie in (0, 1), got {algo.delta}")
        for key in ("n_states", "n_actions", "d", "horizon"):
            value = getattr(cfg.scenario.params, key, None)
            if value is not None and value < 1:
                raise ConfigError(f"scenario.{key}: must be a positive integer, got {value}")

    def make_agent(self) -> LsviAgent:
        raise NotImplementedError

    def make_service(self) -> LsviService:
        record = LsviServerRecord(self.mdp.phi, self.mdp.horizon, self.cfg.algorithm.lam)
        return LsviService(record, self.mdp.horizon, self.mdp.d, self.mdp.n_states,
                           self.broadcast, self.sync_request)

    def make_worker(self, index: int) -> LsviWorker:
        return LsviWorker(index, self.make_agent(), self.cfg.run.seed)

    def annotate(self, row: dict[str, Any], ledger: Any) -> None:
        """Run-level columns of an episode row, filled in the runtime process (see docs/lsvi.md)."""
        self._cum_regret += float(row["regret"])
        row["cum_regret"] = self._cum_regret
        row["comm_rounds"] = ledger.by_kind.get(UPLOAD, [0, 0])[0]
        row["bytes"] = ledger.bytes_up + ledger.bytes_down

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        regrets = [float(r["regret"]) for r in metrics]
        mdp = self.mdp
        return {
            "regret": float(np.sum(regrets)),
            "episodes": len(regrets),
            "agents": self.workers,
            "beta": self.beta,
            # the theory's communication scale d H M^2 log K, to read the measured rounds against
            "comm_rounds_theory": mdp.d * mdp.horizon * self.workers ** 2 * math.log(max(len(regrets), 2)),
        }


@ALGORITHMS.register("async_coop_lsvi", config=AsyncCoopLsviConfig,
                     help="Async-Coop-LSVI-UCB: upload when det(Lambda) grew by 1+alpha (Min et al. 2023)")
class AsyncCoopLsvi(LsviAlgorithm):
    """Each agent uploads on the determinant trigger and downloads only then."""

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        super().check_config(cfg)
        alpha = cfg.algorithm.alpha
        if alpha is not None and not alpha > 0:
            raise ConfigError(f"algorithm.alpha: must be > 0 (or null for 1/M^2), got {alpha}")

    @property
    def alpha(self) -> float:
        alpha = self.cfg.algorithm.alpha
        return 1.0 / self.workers ** 2 if alpha is None else float(alpha)

    def make_agent(self) -> LsviAgent:
        return AsyncCoopAgent(self.mdp, self.cfg.algorithm.lam, self.beta, self.alpha,
                              self.cfg.algorithm.use_local_data_for_planning)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().summarize(metrics), "alpha": self.alpha}


@ALGORITHMS.register("coop_lsvi", config=CoopLsviConfig,
                     help="Coop-LSVI: synchronous global syncs on a log-det threshold (Dubey & Pentland 2021)")
class CoopLsvi(LsviAlgorithm):
    """A sync sends the server statistics to every agent and asks each for its local data."""

    broadcast = True
    sync_request = True

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        super().check_config(cfg)
        if not cfg.algorithm.sync_threshold > 0:
            raise ConfigError(f"algorithm.sync_threshold: must be > 0, got {cfg.algorithm.sync_threshold}")

    def make_agent(self) -> LsviAgent:
        return CoopSyncAgent(self.mdp, self.cfg.algorithm.lam, self.beta, self.cfg.algorithm.sync_threshold)


@ALGORITHMS.register("lsvi_ucb_pooled", config=LsviConfig,
                     help="LSVI-UCB on everyone's data: a round every episode (the regret floor)")
class PooledLsvi(LsviAlgorithm):
    """Every episode is uploaded and the statistics go to every agent."""

    broadcast = True

    def make_agent(self) -> LsviAgent:
        return PooledAgent(self.mdp, self.cfg.algorithm.lam, self.beta)


@ALGORITHMS.register("lsvi_ucb_independent", config=LsviConfig,
                     help="LSVI-UCB per agent, no communication (the regret ceiling)")
class IndependentLsvi(LsviAlgorithm):
    """Each agent learns from its own episodes only."""

    def make_agent(self) -> LsviAgent:
        return IndependentAgent(self.mdp, self.cfg.algorithm.lam, self.beta)
