"""COMA with its centralized critic on the server, and its baselines IAC and central-V.

Foerster et al., AAAI 2018 (arXiv 1705.08926); docs/coma.md. Actor workers each run whole episodes
of the multi-agent environment with the shared actor parameters they last pulled (every agent acts
on its own observation and id only), push the episode as one ``trajectory`` message and wait for
fresh parameters. The server's ``TrajectoryService`` keeps the critic, its target network and the
shared actor; once enough trajectories are in (``server.aggregation``: ``hogwild`` one, ``buffered``
``server.buffer_k``, ``sync`` one from every worker) it runs one learning step (agents/coma_learner.py)
and replies with the new actor parameters. The core records each trajectory's staleness; its
staleness weight scales that episode's actor loss, and ``off_policy_correction`` adds the
decoupled pi_prox / pi_behav importance weight.

Read top to bottom: config -> environment description -> worker -> service -> algorithm.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, TypeVar

import numpy as np
import torch
from torch import nn

from agents.actor_critic import PullingWorker
from agents.coma_learner import (ComaLearner, Dims, DuelingQ, actor_inputs, critic_in_dim, critic_out_dim,
                                 stack_episodes)
from agents.coma_estimators import epsilon_floored_policy
from agents.heads import FlatParameters, build_head, count_params, head_report, worker_heads
from agents.rollout import EpisodeBook, Step, evaluate, rollout
from agents.numpy_heads import numpy_acting_head
from agents.value_targets import linear_schedule
from circuits.vqc import mark_acting_only
from marl_q.aggregation import Aggregator, holds_rounds
from marl_q.errors import ConfigError
from marl_q.evaluation import eval_progress
from marl_q.messages import SERVER, Message
from marl_q.metrics import episode_summary
from marl_q.protocol import (ActingPolicy, Algorithm, Context, MessageSpec, Outcome, Service, Work, worker_name,
                             worker_names)
from marl_q.registry import AGGREGATIONS, ALGORITHMS
from marl_q.registry import make_env as make_scenario_env
from marl_q.seeding import coma_eval_seed, seeded_init, worker_seed
from marl_q.services import PARAMS

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

TRAJECTORY = "trajectory"
T = TypeVar("T")


# ----------------------------------------------------------------------------- config
@dataclass
class ComaConfig:
    """Defaults after the paper and PyMARL (TD(lambda) 0.8, gamma 0.99, eps 0.5 -> 0.02, clip 10)."""

    gamma: float = 0.99
    td_lambda: float = 0.8
    n_step: int = 0  # > 0: n-step critic targets (EPyMARL uses 10) instead of TD(lambda)
    # what COMA's critic targets bootstrap from: "sampled" Q'(s', u') at the joint action taken next (the
    # paper, PyMARL), or "expected" E_{u'~pi}[Q'(s', u')] (Expected SARSA): the agent's own next action
    # summed out exactly, the other agents' drawn ``bootstrap_samples`` times from the current actor. The
    # V critics (iac, central_v) bootstrap from a value already, so this only changes coma.
    bootstrap: Literal["sampled", "expected"] = "sampled"
    bootstrap_samples: int = 16
    critic_dueling: bool = False  # coma: Q = v + centred per-action differences (agents/coma_learner.DuelingQ)
    actor_lr: float = 5e-4
    critic_lr: float = 5e-4
    grad_clip: float = 10.0
    critic_steps_per_update: int = 1
    target_update_every: int = 20  # critic steps between copies into the target network
    critic_warmup_updates: int = 0  # learning updates at the start that train the critic only (actor frozen)
    epsilon_start: float = 0.5
    epsilon_end: float = 0.02
    epsilon_anneal_steps: int = 100_000  # env steps received by the server
    entropy_coef: float = 0.0
    # standardise the actor's advantages over each learning batch ((A - mean) / std): the policy step
    # then no longer scales with the return (Q on spread is ~ -80 while the differences between actions
    # are ~1), so lr and entropy_coef mean the same thing on every task and for every critic
    advantage_norm: bool = False
    # what COMA's counterfactual baseline is subtracted from: "q", the critic's Q(s, u) (the paper), or
    # "return", the TD(lambda) return G_t the critic is trained on. The baseline sum_u' pi(u') Q(s,(u^-a,u'))
    # does not depend on agent a's own action, so either is a valid policy gradient; "return" keeps the
    # rewards actually collected in the advantage, so an inaccurate Q biases it less (more variance)
    coma_advantage: Literal["q", "return"] = "q"
    team_reward: Literal["sum", "mean"] = "sum"  # how the agents' rewards make the team reward
    # actors whose head has a numpy pass (mlp, an exact circuit: circuits.twins) act in numpy: three rows through a
    # small MLP cost more in torch dispatch than in arithmetic; false: act through torch
    fast_path: bool = True
    off_policy_correction: bool = False  # weight by pi_prox / pi_behav (decoupled objective, AReaL)
    importance_clip: float = 2.0  # truncation of that weight
    eval_episodes: int = 100  # greedy episodes at the end, for summary.json's eval_return

    def validate(self) -> None:
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.td_lambda <= 1.0:
            raise ValueError(f"gamma and td_lambda must lie in [0, 1], got {self.gamma}, {self.td_lambda}")
        if not 0.0 <= self.epsilon_end <= 1.0 or not 0.0 <= self.epsilon_start <= 1.0:
            raise ValueError("epsilon_start and epsilon_end must lie in [0, 1]")
        for key in ("critic_steps_per_update", "target_update_every", "bootstrap_samples"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1, got {getattr(self, key)}")
        for key in ("n_step", "epsilon_anneal_steps", "eval_episodes", "critic_warmup_updates"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("actor_lr", "critic_lr", "grad_clip", "importance_clip"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}: must be positive, got {getattr(self, key)}")

    def epsilon(self, env_steps: int) -> float:
        """Linear anneal of the exploration floor over ``epsilon_anneal_steps`` env steps (the Q-learners'
        epsilon rule, ``agents.value_targets.linear_schedule``)."""
        return linear_schedule(env_steps, self.epsilon_start, self.epsilon_end, self.epsilon_anneal_steps)


# ----------------------------------------------------------------------------- environment
@dataclass
class EnvDescription:
    """What the networks are sized from, read off one environment instance."""

    agents: list[str]
    dims: Dims


def make_env(cfg: ExperimentConfig, seed: int) -> Any:
    """The scenario's PettingZoo ParallelEnv; any other kind is a config error naming the scenario."""
    return make_scenario_env(cfg, seed, "parallel")


def described(cfg: ExperimentConfig, make: Callable[[Any, int], Any], describe: Callable[[Any, Any], T]) -> T:
    """``describe(cfg, env)`` of the env ``make(cfg, run.seed)`` opens, closed afterwards (also on error):
    what a server sizes its networks from."""
    env = make(cfg, cfg.run.seed)
    try:
        return describe(cfg, env)
    finally:
        env.close()


def describe_env(cfg: ExperimentConfig, env: Any) -> EnvDescription:
    """Check that one shared actor can serve every agent (same discrete action space, same observation
    size) and that a global state exists; raise a ConfigError naming the mismatch otherwise."""
    agents = list(env.possible_agents)
    name = cfg.algorithm.name
    spaces_by_agent = {a: env.action_space(a) for a in agents}
    for a, space in spaces_by_agent.items():
        if not hasattr(space, "n"):
            raise ConfigError(f"algorithm {name}: agent {a!r} has a non-discrete action space {space}")
    sizes = {a: int(s.n) for a, s in spaces_by_agent.items()}
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{a}: {n}" for a, n in sizes.items())
        raise ConfigError(
            f"algorithm {name}: a shared actor needs every agent to have the same action space, but the "
            f"scenario {cfg.scenario.name!r} has different ones ({listing}); pad them (e.g. "
            f"scenario.common_spaces: true for speaker_listener)")
    obs_sizes = {a: int(np.prod(env.observation_space(a).shape)) for a in agents}
    if len(set(obs_sizes.values())) > 1:
        listing = ", ".join(f"{a}: {n}" for a, n in obs_sizes.items())
        raise ConfigError(f"algorithm {name}: a shared actor needs equal observation sizes ({listing}); "
                          f"pad them (e.g. scenario.common_spaces: true)")
    if not callable(getattr(env, "state", None)):
        raise ConfigError(f"algorithm {name}: scenario {cfg.scenario.name!r} offers no global state() for the critic")
    env.reset(seed=cfg.run.seed)
    state_dim = int(np.asarray(env.state()).size)
    dims = Dims(len(agents), obs_sizes[agents[0]], state_dim, sizes[agents[0]])
    return EnvDescription(agents, dims)


def build_actor(cfg: ExperimentConfig, dims: Dims) -> nn.Module:
    """The shared actor: (obs ++ one-hot agent id) -> action logits, from the ``actor`` head, its
    parameters drawn from ``run.seed`` (the same on every worker and the server)."""
    with seeded_init(cfg.run.seed):
        return build_head(cfg.actor, dims.obs_dim + dims.n_agents, dims.n_actions)


def team_reward(rewards: dict[str, float], agents: list[str], how: str) -> float:
    """The cooperative reward all agents are trained on: the sum or the mean of theirs."""
    values = [float(rewards.get(a, 0.0)) for a in agents]
    return float(np.sum(values) if how == "sum" else np.mean(values))


def stack_obs(obs: dict[str, Any], agents: list[str], obs_dim: int) -> np.ndarray:
    """(n_agents, obs_dim) float32 rows in ``agents`` order; an agent absent from ``obs`` gets zeros."""
    out = np.zeros((len(agents), obs_dim), dtype=np.float32)
    for i, a in enumerate(agents):
        if a in obs:
            out[i] = np.asarray(obs[a], dtype=np.float32).reshape(-1)
    return out


def _stack_avail(infos: dict[str, Any], agents: list[str], n_actions: int) -> np.ndarray:
    out = np.ones((len(agents), n_actions), dtype=np.float32)
    for i, a in enumerate(agents):
        mask = (infos.get(a) or {}).get("action_mask")
        if mask is not None:
            out[i] = np.asarray(mask, dtype=np.float32)
    return out


def floored_policy_np(np_actor: Any, obs: np.ndarray, avail: np.ndarray, epsilon: float) -> np.ndarray:
    """``epsilon_floored_policy(actor(actor_inputs(obs)))`` through the actor's numpy twin, in float64."""
    logits, _ = np_actor.forward(np.concatenate([obs.astype(np.float64), np.eye(len(obs))], axis=1))
    masked = np.where(avail > 0, logits, -np.inf)
    soft = np.exp(masked - masked.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    return (1.0 - epsilon) * soft + epsilon * avail / avail.sum(axis=1, keepdims=True)


class Episode:
    """One episode of a parallel env as a one-copy vector for ``agents.rollout``, reset now with ``seed``:
    ``observe`` gives the agents' stacked observations, availabilities and the global state; every
    step is valid, its reward the team's (``team_reward``), and the episode ends when an agent
    terminates, every agent is truncated or none is left (``data``: 1.0 if it terminated, else 0.0).
    With ``next_seed``, episode after episode: the step that ends episode ``k`` (from 0) resets the env
    with ``next_seed(k + 1)`` (what an evaluation of several episodes steps)."""

    num_envs = 1

    def __init__(self, env: Any, desc: EnvDescription, how: str, seed: Optional[int],
                 next_seed: Optional[Callable[[int], int]] = None) -> None:
        self.env, self.desc, self.how, self.next_seed = env, desc, how, next_seed
        self.obs, self.infos = env.reset(seed=seed)
        self.ended = 0

    def observe(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        agents, dims = self.desc.agents, self.desc.dims
        return (stack_obs(self.obs, agents, dims.obs_dim), _stack_avail(self.infos, agents, dims.n_actions),
                np.asarray(self.env.state(), dtype=np.float32).reshape(-1))

    def step(self, actions: np.ndarray) -> Step:
        agents, live = self.desc.agents, set(self.env.agents)
        self.obs, rewards, terminated, truncated, self.infos = self.env.step(
            {a: int(actions[i]) for i, a in enumerate(agents) if a in live})
        ended = any(terminated.get(a, False) for a in agents)
        done = ended or not self.env.agents or all(truncated.get(a, False) for a in agents)
        if done and self.next_seed is not None:
            self.ended += 1
            self.obs, self.infos = self.env.reset(seed=self.next_seed(self.ended))
        return Step(np.ones(1, dtype=bool), np.array([team_reward(rewards, agents, self.how)]), np.array([done]),
                    1.0 if ended else 0.0)


def acting(actor: nn.Module, desc: EnvDescription, epsilon: float, rng: np.random.Generator, greedy: bool = False,
           np_actor: Optional[Any] = None) -> Callable[[tuple[np.ndarray, np.ndarray, np.ndarray]],
                                                       tuple[np.ndarray, np.ndarray]]:
    """The ``act`` hook of the shared actor (through ``np_actor``, its numpy twin, when given) on an
    ``Episode``'s observation: (actions, the epsilon-floored policy); ``greedy``: its argmax, no draw."""
    agents, dims = desc.agents, desc.dims

    def act(seen: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        obs, avail, _ = seen
        if np_actor is not None:
            pi = floored_policy_np(np_actor, obs, avail, 0.0 if greedy else epsilon)
        else:
            with torch.no_grad():
                logits = actor(actor_inputs(torch.from_numpy(obs)))
                pi = epsilon_floored_policy(logits, 0.0 if greedy else epsilon, torch.from_numpy(avail)).numpy()
        if greedy:
            actions = np.argmax(np.where(avail > 0, pi, -1.0), axis=1)
        else:  # inverse-CDF sampling from the seeded numpy generator
            cum = np.cumsum(pi, axis=1)
            draws = rng.random((len(agents), 1)) * cum[:, -1:]
            actions = np.minimum((draws > cum).sum(axis=1), dims.n_actions - 1)
        return actions, pi

    return act


def play_episode(env: Any, actor: nn.Module, desc: EnvDescription, epsilon: float, rng: np.random.Generator,
                 how: str, greedy: bool = False, seed: Optional[int] = None,
                 np_actor: Optional[Any] = None) -> dict[str, np.ndarray]:
    """One episode with the shared actor (``acting``), run by ``agents.rollout`` until it ends; arrays
    as the trajectory message carries them.

    obs/state/actions/avail have T+1 rows: the last row is the observation after the final transition
    with an action sampled there (never executed), so the critic can bootstrap a truncated episode.
    """
    agents = desc.agents
    obs_l, state_l, act_l, avail_l, rew_l, term_l, logp_l = [], [], [], [], [], [], []
    act = acting(actor, desc, epsilon, rng, greedy, np_actor)

    def keep(seen: tuple[np.ndarray, np.ndarray, np.ndarray], actions: np.ndarray) -> None:
        obs, avail, state = seen
        obs_l.append(obs)
        state_l.append(state)
        act_l.append(actions.astype(np.int64))
        avail_l.append(avail)

    def store(t: int, seen: tuple[np.ndarray, np.ndarray, np.ndarray], chosen: tuple[np.ndarray, np.ndarray],
              step: Step) -> None:
        actions, pi = chosen
        keep(seen, actions)
        logp_l.append(np.log(np.maximum(pi[np.arange(len(agents)), actions], 1e-10)).astype(np.float32))
        rew_l.append(float(step.reward[0]))
        term_l.append(step.data)

    vec = Episode(env, desc, how, seed)
    rollout(vec, EpisodeBook(1), None, act, store, to_env=lambda chosen: chosen[0], until=1)
    last = vec.observe()  # after the final transition: its row, with an action drawn there
    keep(last, act(last)[0])
    return {
        "obs": np.stack(obs_l),
        "state": np.stack(state_l),
        "actions": np.stack(act_l),
        "avail": np.stack(avail_l),
        "rewards": np.asarray(rew_l, dtype=np.float32),
        "terminated": np.asarray(term_l, dtype=np.float32),
        "behaviour_logp": np.stack(logp_l),
    }


# ----------------------------------------------------------------------------- worker
class ComaWorker(PullingWorker):
    """An actor process: plays one episode per step with the last pulled actor, pushes it, waits."""

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        self.cfg = cfg
        self.hp: ComaConfig = cfg.algorithm.params
        self.name = worker_name(index)
        self.seed = worker_seed(cfg.run.seed, index)
        self.rng = np.random.default_rng(self.seed)
        self.env = make_env(cfg, self.seed)
        self.desc = describe_env(cfg, self.env)
        self.actor = build_actor(cfg, self.desc.dims)
        # a circuit actor: its own shot/SPSA stream, and its acting forwards counted for the ledger (the
        # critic and the actor's learning step run on the server, agents/coma_learner.py: not counted)
        self.resources = worker_heads({"actor": self.actor}, cfg.run.seed, index)
        self.flat = FlatParameters(self.actor)
        self._init_numpy_actor()
        self.version = -1
        self.epsilon = self.hp.epsilon_start
        self.waiting = True
        self.seq = 0
        self.episodes_played = 0

    def _init_numpy_actor(self) -> None:
        self._np_actor = numpy_acting_head(self.actor) if getattr(self.hp, "fast_path", True) else None
        if self._np_actor is None:  # a circuit acting through torch: workers never differentiate it
            mark_acting_only(self.actor)

    def pulled(self, msg: Message) -> None:
        self.epsilon = float(msg.info.get("epsilon", self.epsilon))

    def step(self) -> Work:
        seed = self.seed if self.episodes_played == 0 else None  # later episodes continue the env's RNG
        episode = play_episode(self.env, self.actor, self.desc, self.epsilon, self.rng, self.hp.team_reward, seed=seed,
                               np_actor=self._np_actor)
        self.episodes_played += 1
        self.seq += 1
        self.waiting = True
        steps = int(len(episode["rewards"]))
        msg = Message(self.name, SERVER, TRAJECTORY, episode, base_version=self.version, seq=self.seq,
                      info={"agents": list(self.desc.agents)})
        row = {"return": float(episode["rewards"].sum()), "length": steps, "version": self.version}
        return Work([msg], env_steps=steps, episodes=[row], resources=head_report(self.resources))

    def close(self) -> None:
        self.env.close()


# ----------------------------------------------------------------------------- service
def trajectory_spec(dims: Dims) -> MessageSpec:
    """Payload layout of one pushed episode; the length dim is free (checked for consistency here)."""
    a, o, s, u = dims.n_agents, dims.obs_dim, dims.state_dim, dims.n_actions
    return MessageSpec({
        "obs": ((None, a, o), "float32"),
        "state": ((None, s), "float32"),
        "actions": ((None, a), "int64"),
        "avail": ((None, a, u), "float32"),
        "rewards": ((None,), "float32"),
        "terminated": ((None,), "float32"),
        "behaviour_logp": ((None, a), "float32"),
    })


def trajectory_problem(payload: dict[str, np.ndarray], info: dict[str, Any], agents: list[str],
                       dims: Dims) -> Optional[str]:
    """Why a trajectory (already shape-checked by the core) cannot be learned from, or None."""
    sent = info.get("agents")
    if sent is None or list(sent) != list(agents):
        return f"agents: the set {sent!r} differs from the scenario's {agents!r}"
    steps = len(payload["rewards"])
    if steps < 1:
        return "length: an episode needs at least one transition"
    for key in ("terminated", "behaviour_logp"):
        if len(payload[key]) != steps:
            return f"length: {key} has {len(payload[key])} steps, rewards {steps}"
    for key in ("obs", "state", "actions", "avail"):
        if len(payload[key]) != steps + 1:
            return f"length: {key} has {len(payload[key])} rows, expected rewards + 1 = {steps + 1}"
    actions = payload["actions"]
    if actions.min() < 0 or actions.max() >= dims.n_actions:
        return f"actions: outside 0..{dims.n_actions - 1}"
    taken_avail = np.take_along_axis(payload["avail"], actions[..., None], axis=-1)
    if np.any(taken_avail <= 0):
        return "actions: an unavailable action (action_mask 0) was taken"
    term = payload["terminated"]
    if np.any((term != 0) & (term != 1)) or np.any(term[:-1] != 0):
        return "terminated: must be 0/1 and only the last transition may terminate"
    if np.any(payload["behaviour_logp"] > 1e-6):
        return "behaviour_logp: log-probabilities must be <= 0"
    return None


class TrajectoryService(Service):
    """Server side of COMA/IAC/central-V: buffers pushed episodes, learns, publishes the actor."""

    def __init__(self, cfg: ExperimentConfig, desc: EnvDescription, actor: nn.Module, critic: nn.Module) -> None:
        self.cfg, self.desc, self.hp = cfg, desc, cfg.algorithm.params
        self.learner = ComaLearner(cfg.algorithm.name, actor, critic, desc.dims, self.hp)
        self.specs = {TRAJECTORY: trajectory_spec(desc.dims)}
        self.workers = worker_names(cfg.backend.workers)
        self.buffer: list[tuple[str, dict[str, np.ndarray], float, int]] = []
        self.env_steps = 0
        self.accepted = 0
        self.rejections: Counter[str] = Counter()
        self.staleness_sum = 0
        self.last_stats: dict[str, float] = {}
        self._snapshot: Optional[np.ndarray] = None

    @cached_property
    def aggregator(self) -> Aggregator:
        """server.aggregation, asked when a round of episodes is complete and who hears back (the episodes
        stay here). Built on first use, so a service pickled before it existed takes it up on resume."""
        return AGGREGATIONS.get(self.cfg.server.aggregation).obj(self.workers, self.cfg.server.buffer_k)

    def actor_vector(self) -> np.ndarray:
        """The shared actor's parameters as one float32 vector (what workers load)."""
        if self._snapshot is None:
            trainable = [p.detach().reshape(-1) for p in self.learner.actor.parameters() if p.requires_grad]
            self._snapshot = torch.cat(trainable).numpy().astype(np.float32)  # FlatParameters' order
        return self._snapshot

    def _params(self, worker: str, version: int) -> Message:
        return Message(SERVER, worker, PARAMS, {PARAMS: self.actor_vector()}, base_version=version,
                       info={"epsilon": self.hp.epsilon(self.env_steps)})

    def hello(self, worker: str, version: int) -> list[Message]:
        return [self._params(worker, version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        problem = trajectory_problem(msg.payload, msg.info, self.desc.agents, self.desc.dims)
        if problem is not None:
            self.rejections[problem.split(":")[0]] += 1
            return Outcome(False, [self._params(msg.src, ctx.version)], accepted=False, reason=problem)
        self.accepted += 1
        self.staleness_sum += ctx.staleness
        self.env_steps += len(msg.payload["rewards"])
        if self.aggregator.replaces_in_round:  # a worker pushing twice in a round replaces its episode
            self.buffer = [b for b in self.buffer if b[0] != msg.src]
        self.buffer.append((msg.src, msg.payload, ctx.weight, ctx.staleness))
        if not self.aggregator.round_complete([w for w, *_ in self.buffer]):
            return Outcome(False, [self._params(w, ctx.version) for w in self.aggregator.reply_to(msg.src, False)])
        trained = self._learn()
        return Outcome(True, [self._params(w, ctx.next_version) for w in self.aggregator.reply_to(msg.src, True)],
                       train=trained)

    def _learn(self) -> list[dict[str, Any]]:
        """One learning step per group of equal-length episodes in the buffer; their diagnostics (train.csv)."""
        by_length: dict[int, list[tuple[dict[str, np.ndarray], float]]] = {}
        for _, payload, weight, _ in self.buffer:
            by_length.setdefault(len(payload["rewards"]), []).append((payload, weight))
        self.buffer = []
        epsilon = self.hp.epsilon(self.env_steps)
        trained = []
        for group in by_length.values():
            batch = stack_episodes([p for p, _ in group], [w for _, w in group])
            self.last_stats = self.learner.learn(batch, epsilon=epsilon)
            trained.append(self.learner.last_diagnostics)
        self._snapshot = None
        return trained

    def updates(self) -> int:
        return self.learner.updates

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"updates": np.array(self.learner.updates), "env_steps": np.array(self.env_steps)}
        for prefix, module in (("actor", self.learner.actor), ("critic", self.learner.critic),
                               ("target_critic", self.learner.target_critic)):
            for key, value in module.state_dict().items():
                out[f"{prefix}.{key}"] = value.detach().numpy().copy()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for prefix, module in (("actor", self.learner.actor), ("critic", self.learner.critic),
                               ("target_critic", self.learner.target_critic)):
            own = {k[len(prefix) + 1:]: torch.from_numpy(np.array(v)) for k, v in state.items()
                   if k.startswith(prefix + ".")}
            module.load_state_dict(own)
        self.learner.updates = int(state["updates"])
        self.env_steps = int(state["env_steps"])
        self._snapshot = None

    def summary(self) -> dict[str, Any]:
        return {
            "trajectories_accepted": self.accepted,
            "trajectories_rejected": int(sum(self.rejections.values())),
            "rejections_by_field": dict(self.rejections),
            "mean_staleness": self.staleness_sum / self.accepted if self.accepted else None,
            "learning_updates": self.learner.updates,
            **{f"last_{k}": v for k, v in self.last_stats.items()},
        }


# ----------------------------------------------------------------------------- algorithm
class CentralizedCriticAlgorithm(Algorithm):
    """coma | iac | central_v: the algorithm name picks the critic (agents/coma_learner.py)."""

    metric_fields = ["return", "length", "version"]

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """At load time: the scenario can serve a shared actor and the aggregation is one we handle."""
        if not holds_rounds(AGGREGATIONS.get(cfg.server.aggregation).obj):
            choices = [e.name for e in AGGREGATIONS if holds_rounds(e.obj)]
            raise ConfigError(f"server.aggregation: {cfg.server.aggregation!r} is not supported by the trajectory "
                              f"service (choices: {', '.join(choices)})")
        dims = described(cfg, make_env, describe_env).dims
        kind = cfg.algorithm.name
        dueling = cfg.algorithm.critic_dueling
        for section, in_dim, out_dim in (("actor", dims.obs_dim + dims.n_agents, dims.n_actions),
                                         ("critic", critic_in_dim(kind, dims), critic_out_dim(kind, dims, dueling))):
            try:
                build_head(getattr(cfg, section), in_dim, out_dim)
            except ValueError as exc:  # a head that cannot take this input/output size
                raise ConfigError(f"{section}: {exc}") from None

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        self.desc = described(cfg, make_env, describe_env)
        self.service: Optional[TrajectoryService] = None

    def make_service(self) -> TrajectoryService:
        dims = self.desc.dims
        kind = self.cfg.algorithm.name
        dueling = kind == "coma" and self.cfg.algorithm.critic_dueling
        with seeded_init(self.cfg.run.seed):  # the actor's draws as build_actor's, the critic's after them
            actor = build_head(self.cfg.actor, dims.obs_dim + dims.n_agents, dims.n_actions)
            critic = build_head(self.cfg.critic, critic_in_dim(kind, dims), critic_out_dim(kind, dims, dueling))
        if dueling:
            critic = DuelingQ(critic)
        self.service = TrajectoryService(self.cfg, self.desc, actor, critic)
        return self.service

    def make_worker(self, index: int) -> ComaWorker:
        return ComaWorker(self.cfg, index)

    def acting_policy(self, state: dict[str, np.ndarray]) -> ActingPolicy:
        """The server's actor at the checkpoint with the checkpoint's epsilon floor, for every agent of the
        scenario (an agent missing from the observations is seen as zeros); models: actor and critic."""
        service = self.make_service()
        service.load_state_dict(state)
        desc, actor = self.desc, service.learner.actor
        agents = list(desc.agents)
        epsilon = self.cfg.algorithm.params.epsilon(service.env_steps)
        available = torch.ones(len(agents), desc.dims.n_actions)

        def probabilities(obs: dict[str, Any]) -> dict[str, np.ndarray]:
            x = torch.from_numpy(stack_obs(obs, agents, desc.dims.obs_dim))
            with torch.no_grad():
                pi = epsilon_floored_policy(actor(actor_inputs(x)), epsilon, available).numpy().astype(np.float64)
            return dict(zip(agents, pi))

        def logits(obs: dict[str, Any]) -> dict[str, np.ndarray]:
            with np.errstate(divide="ignore"):
                return {a: np.log(p) for a, p in probabilities(obs).items()}

        return ActingPolicy(logits, probabilities, agents=agents,
                            models={"actor": actor, "critic": service.learner.critic},
                            info={"env_steps": service.env_steps, "epsilon": epsilon, "desc": desc})

    def evaluate(self, episodes: int) -> Optional[float]:
        """Mean team return of ``episodes`` greedy episodes of the server's current actor (the end of
        the run's ``eval_return``), with a progress bar."""
        if self.service is None or episodes == 0:
            return None
        return float(np.mean(self.evaluate_returns(episodes, coma_eval_seed(self.cfg.run.seed))))

    def evaluate_returns(self, episodes: int, seed: int) -> list[float]:
        """Team returns of ``episodes`` greedy episodes of the server's current actor in an env seeded
        from ``seed`` (the end-of-run evaluation passes coma_eval_seed; run.eval_every its own)."""
        env = make_env(self.cfg, seed)
        try:
            vec = Episode(env, self.desc, self.cfg.algorithm.team_reward, seed, next_seed=lambda k: seed + k)
            act = acting(self.service.learner.actor, self.desc, 0.0, np.random.default_rng(seed), greedy=True)
            with eval_progress(episodes, self.cfg.run.progress, desc="eval (greedy)") as bar:
                return evaluate(vec, episodes, act, to_env=lambda chosen: chosen[0], bar=bar)
        finally:
            env.close()

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out = episode_summary(metrics, self.cfg.run.solve_return, self.cfg.run.solve_window)
        out["eval_return"] = self.evaluate(self.cfg.algorithm.eval_episodes)
        if self.service is not None:
            out["actor_params"] = count_params(self.service.learner.actor)
            out["critic_params"] = count_params(self.service.learner.critic)
        return out


ALGORITHMS.add("coma", CentralizedCriticAlgorithm, config=ComaConfig,
               help="COMA: centralized Q critic on the server, counterfactual baseline, shared actor")
ALGORITHMS.add("iac", CentralizedCriticAlgorithm, config=ComaConfig,
               help="independent actor-critic: each agent's V from its own observation (COMA's baseline)")
ALGORITHMS.add("central_v", CentralizedCriticAlgorithm, config=ComaConfig,
               help="central-V: one V(s) critic on the server, advantage G - V(s) (COMA's baseline)")
