"""One learner per team: several team actor-critics (ippo, mappo, ia2c, maa2c) in one run and one env.

``learners:`` maps each team of ``scenario.teams`` (marl_q/teams.py) to its learner's keys (the config
section: marl_q.config.build_learners), e.g. MAPPO for the good agents against IPPO for the adversary:

    algorithm: {name: mappo, envs_per_worker: 16, n_steps: 25}   # what the learners share
    learners:
      good: {}                                    # mappo, as the algorithm section says
      adv: {name: ippo, lr: 3.0e-4, actor: {hidden: [32, 32]}}

Each team's learner is the team actor-critic its name registers (agents/mappo.py), built for that team's
agents only: its networks are sized from their spaces (a team's agents must share theirs; teams need not)
and its agent ids count the team's members. On the server each learner is a service of its own
(marl_q.services.ServiceGroup on marl_q.server.MultiServer): its own parameters, optimizer, version,
staleness counts and ledger rows (comm.csv's ``service`` column).

A worker (``TeamLearnersWorker``) steps one set of environment copies with every agent: in each step
every team's learner (a ``LearnerPart``) fills its own agents' rows, runs its actor and draws from its
own generator; the joint action goes to the env. The rollout's per-agent rewards, terminations and masks
go to the learner of each agent's team (a team's reward is its members' summed, as its per-team return
is), and each learner pushes its own update (gradient or delta) to its own service, and waits for that
service's parameters. Episodes are booked once, over every agent (returns.csv's per-team and per-agent
returns; ``return`` is ``run.report_team``'s).

Not covered (refused in one line at load time): turn-based games. Every backend (sim, local, ray) and
the injected faults run it as they run one learner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from agents.heads import head_report
from agents.mappo import TeamDescription, TeamWorker, describe_team, make_env, team_eval_returns
from agents.recurrent_ac import team_memory
from agents.rollout import AgentEpisodeBook, Step, TeamRows, TeamStep, evaluate, rollout, team_copies
from agents.turn_based import turn_based
from marl_q.errors import ConfigError
from marl_q.evaluation import eval_progress
from marl_q.messages import HELLO, SERVER, SERVICE, Message
from marl_q.metrics import episode_summary
from marl_q.protocol import ActingPolicy, Algorithm, Work, Worker, worker_name
from marl_q.registry import ALGORITHMS
from marl_q.seeding import derive
from marl_q.services import ServiceGroup, split_state
from marl_q.teams import Teams, teams_for

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

SHARED_KEYS = ("n_steps", "envs_per_worker")  # one rollout of one set of env copies feeds every learner


def version_column(team: str) -> str:
    """metrics.csv's column of the version of a team's parameters an episode was played with."""
    return f"version:{team}"


# ----------------------------------------------------------------------------- a worker's rows
class WholeRows:
    """Every agent's rows of one step of a team vector (E, N, ...), read once and shared by the teams'
    views: observations (zero-padded to the largest), the global state and the action masks (each only
    when some learner reads it)."""

    def __init__(self, copies: int, agents: int, obs_dim: int, state_dim: int, actions: int) -> None:
        self.obs = np.zeros((copies, agents, obs_dim), dtype=np.float32)
        self.state = np.zeros((copies, state_dim), dtype=np.float32) if state_dim else None
        self.avail = np.ones((copies, agents, actions), dtype=np.float32) if actions else None
        self.vec: Optional[TeamRows] = None

    def fill(self, vec: TeamRows) -> None:
        self.vec = vec
        vec.rows(self.obs, self.state, self.avail)


class TeamView(TeamRows):
    """One team's agents' rows of a ``WholeRows`` (columns ``members``), as a team vector's ``rows`` gives them."""

    def __init__(self, whole: WholeRows, members: np.ndarray) -> None:
        self.whole, self.members = whole, members

    @property
    def pending_reset(self) -> np.ndarray:
        return self.whole.vec.pending_reset

    def rows(self, obs_out: np.ndarray, state_out: Optional[np.ndarray] = None,
             avail_out: Optional[np.ndarray] = None) -> None:
        w, m = self.whole, self.members
        obs_out[...] = w.obs[:, m, :obs_out.shape[-1]]
        if state_out is not None:
            state_out[...] = w.state
        if avail_out is not None:
            avail_out[...] = w.avail[:, m, :avail_out.shape[-1]]


def team_step(data: TeamStep, members: np.ndarray) -> TeamStep:
    """A step's per-agent details for one team's agents (columns ``members``)."""
    return TeamStep(data.live[:, members], data.rewards[:, members], data.terminated[:, members],
                    data.dones[:, members])


# ----------------------------------------------------------------------------- worker
class LearnerPart(TeamWorker):
    """One team's learner on a worker: its own networks, optimizer, value normalisation, generator,
    version and push numbering, over the worker's env copies and its team's agents' rows (it steps no
    env: ``TeamLearnersWorker`` does)."""

    def __init__(self, cfg: ExperimentConfig, index: int, envs: list[Any], agents: list[str], seed: int) -> None:
        self.envs, self.team_agents = envs, list(agents)
        super().__init__(cfg, index)
        self.rng = np.random.default_rng(seed)  # its own draws: teams do not share a stream

    def build_env(self) -> None:
        self.desc = describe_team(self.cfg, self.envs[0], self.team_agents)
        self.central = self.desc.central

    def reset_env(self) -> None:
        self.memory = team_memory(self.actor, self.critic, len(self.envs), len(self.desc.agents))

    def close(self) -> None:
        """The worker closes the env copies."""


class TeamLearnersWorker(Worker):
    """Steps ``envs_per_worker`` copies of the env with every team's learner acting for its agents; one
    push per learner per rollout, each to its learner's service (see the module docstring)."""

    def __init__(self, cfg: ExperimentConfig, teams: Teams, learners: dict[str, ExperimentConfig], index: int) -> None:
        self.cfg, self.teams, self.index = cfg, teams, index
        self.name = worker_name(index)
        seed = cfg.run.seed
        first = next(iter(learners.values())).algorithm
        self.T = first.n_steps
        self.envs = [make_env(cfg, derive(seed, "env_copy", index, k)) for k in range(first.envs_per_worker)]
        self.agents = list(teams.agents)
        self.members = {team: np.asarray(teams.members[team], dtype=np.int64) for team in learners}
        self.parts = {team: LearnerPart(sub, index, self.envs, [self.agents[i] for i in self.members[team]],
                                        derive(seed, "learner", k, index))
                      for k, (team, sub) in enumerate(learners.items())}
        self.dist = next(iter(self.parts.values())).dist  # the joint action's dtype and env conversion
        self.reset_env()

    def reset_env(self) -> None:
        self.vec = team_copies(self.envs, self.agents, self.dist.continuous)
        self.book = AgentEpisodeBook(len(self.envs), len(self.agents))  # every agent's return: per-team returns

    def _whole(self) -> tuple[WholeRows, dict[str, TeamView]]:
        descs: list[TeamDescription] = [p.desc for p in self.parts.values()]
        whole = WholeRows(len(self.envs), len(self.agents), max(d.obs_dim for d in descs),
                          max((d.state_dim for d in descs if d.central), default=0),
                          max((int(d.action_space.n) for d in descs if d.masked), default=0))
        return whole, {team: TeamView(whole, m) for team, m in self.members.items()}

    def _joint(self, choose: Callable[[str, TeamView], np.ndarray], views: dict[str, TeamView]) -> np.ndarray:
        """One action per (copy, agent) row, each team's from ``choose(team, its view)``."""
        E, N, shape = len(self.envs), len(self.agents), self.dist.action_shape()
        joint = np.zeros((E, N) + shape, dtype=self.dist.action_dtype())
        for team, view in views.items():
            joint[:, view.members] = choose(team, view).reshape((E, len(view.members)) + shape)
        return joint.reshape((E * N,) + shape)

    # -- the worker protocol --------------------------------------------------------------------
    def start(self) -> list[Message]:
        return [Message(self.name, SERVER, HELLO, info={SERVICE: team}) for team in self.parts]

    def deliver(self, msg: Message) -> None:
        part = self.parts.get(msg.info.get(SERVICE))
        if part is not None:
            part.deliver(msg)

    def ready(self) -> bool:
        return all(p.ready() for p in self.parts.values())

    def step(self) -> Work:
        E, N, shape = len(self.envs), len(self.agents), self.dist.action_shape()
        rows = {team: p.begin_rollout(self.T) for team, p in self.parts.items()}
        whole, views = self._whole()

        def act(vec: TeamRows) -> np.ndarray:
            whole.fill(vec)
            return self._joint(lambda team, view: self.parts[team].act_rows(rows[team], view), views)

        def store(t: int, vec: TeamRows, actions: np.ndarray, step: Step) -> None:
            joint = actions.reshape((E, N) + shape)
            for team, part in self.parts.items():
                m = self.members[team]
                part.store_rows(rows[team], t, joint[:, m].reshape((E * len(m),) + shape), team_step(step.data, m))

        episodes, steps = rollout(self.vec, self.book, self.T, act, store, row=lambda e: self._versions(),
                                  to_env=self.dist.to_env)
        whole.fill(self.vec)
        messages = []
        for team, part in self.parts.items():
            msg = part.update_message(part.end_rollout(rows[team], views[team]))
            msg.info[SERVICE] = team
            messages.append(msg)
        return Work(messages, env_steps=steps, episodes=episodes,
                    resources=merge_reports([head_report(p.resources) for p in self.parts.values()]))

    def _versions(self) -> dict[str, int]:
        return {version_column(team): part.version for team, part in self.parts.items()}

    def play_greedy(self, episodes: int, seed: int, progress: bool = False,
                    closed: Optional[list[dict[str, Any]]] = None) -> list[float]:
        """``TeamWorker.play_greedy`` with every team's learner taking its policy's mode for its agents."""
        seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=len(self.envs))
        vec = team_copies(self.envs, self.agents, self.dist.continuous, reset_seeds=seeds)
        modes = {team: part.greedy() for team, part in self.parts.items()}
        whole, views = self._whole()

        def mode(copies: TeamRows) -> np.ndarray:
            whole.fill(copies)
            return self._joint(lambda team, view: modes[team](view), views)

        with eval_progress(episodes, progress) as bar:
            return evaluate(vec, episodes, mode, to_env=self.dist.to_env, bar=bar,
                            book=AgentEpisodeBook(len(self.envs), len(self.agents)), closed=closed)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def merge_reports(reports: list[Optional[dict[str, Any]]]) -> Optional[dict[str, Any]]:
    """The learners' circuit-head reports of one step as one (counts added; None without a circuit head)."""
    reports = [r for r in reports if r is not None]
    if not reports:
        return None
    out: dict[str, Any] = {"counts": {}, "exact": {}}
    for r in reports:
        for role, counts in r["counts"].items():
            mine = out["counts"].setdefault(role, {})
            for key, n in counts.items():
                mine[key] = mine.get(key, 0) + int(n)
        for role, exact in r.get("exact", {}).items():
            out["exact"][role] = bool(out["exact"].get(role, True) and exact)
    return out


# ----------------------------------------------------------------------------- algorithm
class TeamLearners(Algorithm):
    """The run's algorithm when the config has ``learners``: one team actor-critic per team, each with its
    own service on the server (see the module docstring)."""

    reports_teams = True

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        env = make_env(cfg, cfg.run.seed)
        try:
            self.teams = teams_for(cfg, list(env.possible_agents))
        finally:
            env.close()
        agents = list(self.teams.agents)
        self.configs = {team: cfg.learners[team].config(cfg) for team in self.teams.names}  # the teams' order
        self.learners = {team: ALGORITHMS.get(sub.algorithm.name).obj(sub, agents=[agents[i] for i in self.teams.members[team]])
                         for team, sub in self.configs.items()}
        self.metric_fields = ["return", "length"] + [version_column(t) for t in self.teams.names]

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """Every team has a learner and every learner a team; the learners share one rollout; each one's
        own checks over its team's agents; no turn-based game."""
        if turn_based(cfg):
            raise ConfigError(f"learners: scenario {cfg.scenario.name!r} is turn-based; one learner per team plays "
                              "parallel envs only")
        env = make_env(cfg, cfg.run.seed)
        try:
            agents = list(env.possible_agents)
            teams = teams_for(cfg, agents)
            for team in cfg.learners:
                if team not in teams.members:
                    raise ConfigError(f"learners.{team}: names no team (the teams: {', '.join(teams.names)}; "
                                      "scenario.teams)")
            missing = [t for t in teams.names if t not in cfg.learners]
            if missing:
                raise ConfigError(f"learners: team(s) {', '.join(missing)} have no learner (the teams: "
                                  f"{', '.join(teams.names)}; each needs one)")
            for key in SHARED_KEYS:
                values = {t: getattr(cfg.learners[t].algorithm, key) for t in teams.names}
                if len(set(values.values())) > 1:
                    listing = ", ".join(f"{t}: {v}" for t, v in values.items())
                    raise ConfigError(f"learners: {key} differs ({listing}); one rollout feeds every learner, so "
                                      f"set algorithm.{key} once")
            for team in teams.names:
                sub = cfg.learners[team].config(cfg)
                ALGORITHMS.get(sub.algorithm.name).obj.check_agents(sub, env, [agents[i] for i in teams.members[team]])
        finally:
            env.close()

    def make_service(self) -> ServiceGroup:
        self.service = ServiceGroup({team: learner.make_service() for team, learner in self.learners.items()})
        return self.service

    def make_worker(self, index: int) -> TeamLearnersWorker:
        return TeamLearnersWorker(self.cfg, self.teams, self.configs, index)

    def evaluate_returns(self, episodes: int, seed: int) -> list[float]:
        """``TeamActorCritic.evaluate_returns`` with every learner's current parameters."""
        if getattr(self, "_evaluator", None) is None:  # its models are seeded on their own (seeded_init)
            self._evaluator = self.make_worker(0)
        worker = self._evaluator
        for team, part in worker.parts.items():
            part.flat.load(self.learners[team].service.param.numpy())
        return team_eval_returns(self.teams, worker.play_greedy, episodes, seed, self.cfg.run.progress)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out = episode_summary(metrics, self.cfg.run.solve_return, self.cfg.run.solve_window)
        out["learners"] = {team: {"algorithm": self.configs[team].algorithm.name,
                                  **getattr(learner, "param_counts", {})}
                           for team, learner in self.learners.items()}
        return out

    def acting_policy(self, state: dict[str, Any]) -> ActingPolicy:
        """Each team's learner's policy at the checkpoint's parameters, each acting for its team's agents."""
        agents = list(self.teams.agents)
        policies = {team: learner.acting_policy(split_state(state, team)) for team, learner in self.learners.items()}
        owner = {agents[i]: team for team in policies for i in self.teams.members[team]}

        def logits(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            out: dict[str, np.ndarray] = {}
            for team, policy in policies.items():
                mine = {a: o for a, o in obs.items() if owner.get(a) == team}
                if mine:
                    out.update(policy.logits(mine))
            return out

        models = {f"{team}.{role}": m for team, p in policies.items() for role, m in p.models.items()}
        return ActingPolicy(logits, agents=agents, models=models)
