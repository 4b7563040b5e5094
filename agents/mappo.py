"""The multi-agent actor-critic family on any PettingZoo parallel env: IPPO, MAPPO, IA2C, MAA2C.

They are the actor-critic core of agents/actor_critic.py (the same loss, ``actor_critic_update``,
the same server-side ``ParameterService`` and so the same ``server.aggregation`` and staleness
rules) with a multi-agent rollout: every agent acts on its own observation through a decentralised
actor, and a critic estimates each agent's value from

- its own observation, V(o_i): ``ippo`` (de Witt et al. 2020, arXiv 2011.09533) and ``ia2c``;
- the global state and its id, V(s, i): ``mappo`` (Yu et al. 2022, arXiv 2103.01955) and
  ``maa2c`` (Papoudakis et al. 2021, arXiv 2006.07869).

``*ppo`` run clipped epochs on the worker and push a parameter delta; ``*a2c`` push one gradient
per rollout. Parameter sharing is on by default (one actor and one critic for all agents, a
one-hot agent id appended to their inputs); ``share_params: false`` gives every agent its own
networks (``PerAgent``), still one flat parameter vector on the server.

From MAPPO's list of implementation details (Yu et al. 2022, section 4) this takes: value
normalisation (agents/value_norm.py), the agent-specific global state (state + agent id) for
the centralised critic, few epochs over large batches without minibatch splitting by default
(10 epochs, 1 minibatch; their MPE setting), PPO's ratio clip 0.2 and value clip, and death
masking (an agent that has finished is left out of the loss while its team plays on). Not taken:
the Huber value loss (the squared error of the shared loss is kept). Recurrent (GRU) heads are an
option (``actor.recurrent: gru``; agents/recurrent_ac.py, docs/recurrent.md).

Each worker steps ``envs_per_worker`` copies of the environment and batches every agent of every
copy through one forward pass. Episodes restart on the step after they end (Gymnasium's next-step
autoreset, as the single-agent rollout does): the restart step is masked out of the loss, and a
time-limit truncation bootstraps from the final observation. A metrics row per finished episode:
``return`` is the team's return (every agent's reward summed over the episode), as in COMA's files;
with several teams (``scenario.teams``, marl_q/teams.py) the report team's, and every row carries its
per-agent returns for returns.csv.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from agents.actor_critic import (ActorCritic, ActorCriticConfig, ActorCriticWorker, PPOConfig, actor_critic_update,
                                 float32_twin)
from agents.distributions import DiagGaussian, LogStd, distribution_for, head_out_dim
from agents.heads import FlatParameters, build_head
from agents.numpy_heads import NumpyMLP
from agents.recurrent_ac import TeamMemory, recurrent_update, team_memory
from agents.rollout import (AgentEpisodeBook, EpisodeBook, ParallelCopies, Step, TeamRows, TeamStep, evaluate, rollout,
                            team_copies)
from agents.turn_based import TurnTaking, board_group, turn_based
from agents.value_norm import ValueNorm
from marl_q.errors import ConfigError
from marl_q.evaluation import EvalReturns, eval_progress
from marl_q.protocol import ActingPolicy
from marl_q.registry import ALGORITHMS
from marl_q.registry import make_env as make_scenario_env
from marl_q.seeding import derive, seeded_init
from marl_q.services import PARAMS
from marl_q.teams import Teams, team_column, teams_for
from scenarios.aec import TURN_FIELDS, TurnsConfig

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig


# ----------------------------------------------------------------------------- config
@dataclass
class MultiAgentPPOConfig(PPOConfig):
    """IPPO/MAPPO defaults after Yu et al. 2022's MPE settings (lr 7e-4, 10 epochs, 1 minibatch,
    clip 0.2, entropy 0.01, gamma 0.99, GAE 0.95, grad norm 10, value normalisation)."""

    n_steps: int = 25  # per environment copy, per rollout
    envs_per_worker: int = 16
    epochs: int = 10
    minibatches: int = 1
    lr: float = 7e-4
    ent_coef: float = 0.01
    value_clip: Optional[float] = 0.2
    max_grad_norm: Optional[float] = 10.0
    share_params: bool = True
    agent_id: bool = True  # append a one-hot agent id to the actor's and critic's inputs (share_params)
    value_norm: bool = True
    value_norm_beta: float = 0.99999
    init_log_std: float = 0.0  # continuous actions: the Gaussian's initial log standard deviation
    chunk: Optional[int] = None  # recurrent heads: BPTT length, dividing n_steps; null: n_steps (docs/recurrent.md)

    def validate(self) -> None:
        super().validate()
        _validate_multi_agent(self)


@dataclass
class MultiAgentA2CConfig(ActorCriticConfig):
    """IA2C/MAA2C: one gradient per rollout of ``n_steps`` x ``envs_per_worker`` (EPyMARL-like: Adam
    5e-4, entropy 0.01, 5-step returns), with the same value normalisation and masks as MAPPO."""

    n_steps: int = 5
    envs_per_worker: int = 16
    optimizer: Literal["rmsprop", "adam", "sgd"] = "adam"
    lr: float = 5e-4
    ent_coef: float = 0.01
    max_grad_norm: Optional[float] = 10.0
    fast_path: bool = False  # multi-agent batches go through torch
    share_params: bool = True
    agent_id: bool = True
    value_norm: bool = True
    value_norm_beta: float = 0.99999
    init_log_std: float = 0.0
    chunk: Optional[int] = None  # recurrent heads: BPTT length, dividing n_steps; null: n_steps (docs/recurrent.md)

    def validate(self) -> None:
        super().validate()
        _validate_multi_agent(self)


def _validate_multi_agent(cfg: MultiAgentPPOConfig | MultiAgentA2CConfig) -> None:
    if cfg.envs_per_worker < 1:
        raise ValueError(f"envs_per_worker: must be at least 1, got {cfg.envs_per_worker}")
    if not 0.0 < cfg.value_norm_beta < 1.0:
        raise ValueError(f"value_norm_beta: must lie in (0, 1), got {cfg.value_norm_beta}")
    if cfg.chunk is not None and (cfg.chunk < 1 or cfg.n_steps % cfg.chunk):
        raise ValueError(f"chunk: must be a positive divisor of n_steps ({cfg.n_steps}), got {cfg.chunk}")


# ----------------------------------------------------------------------------- the environment
@dataclass
class TeamDescription:
    """What the networks are sized from, read off one environment instance."""

    agents: list[str]
    obs_dim: int
    state_dim: int
    action_space: Any
    masked: bool  # the env hands out action masks (common_spaces), or own_avail does
    central: bool = False  # the critic reads the global state (mappo, maa2c), not the agent's observation
    # share_params: false with spaces that differ (else None): each agent's observation size, its head's
    # output size, and (N, A) its own actions (1) among the A of action_space (the largest)
    own_obs: Optional[list[int]] = None
    own_out: Optional[list[int]] = None
    own_avail: Optional[np.ndarray] = None


def centralised(cfg: ExperimentConfig) -> bool:
    """Whether the algorithm's critic is centralised: a property of its family class
    (``TeamActorCritic.central_critic``), not of its name."""
    return bool(getattr(ALGORITHMS.get(cfg.algorithm.name).obj, "central_critic", False))


def make_env(cfg: ExperimentConfig, seed: int) -> Any:
    """The scenario's PettingZoo ParallelEnv, or for the decentralised critics a turn-based game
    (agents/turn_based.py); any other kind is a config error naming the scenario."""
    return make_scenario_env(cfg, seed, "aec" if turn_based(cfg) and not centralised(cfg) else "parallel")


def describe_team(cfg: ExperimentConfig, env: Any, agents: Optional[list[str]] = None) -> TeamDescription:
    """Equal observation and action spaces across agents (one actor and critic serve all), a global
    state; a ConfigError naming the agents and sizes otherwise. ``agents``: the env's agents the networks
    serve (one team's, in env order; default all of them)."""
    name, agents = cfg.algorithm.name, list(env.possible_agents if agents is None else agents)
    obs = {a: int(np.prod(env.observation_space(a).shape)) for a in agents}
    acts = {a: env.action_space(a) for a in agents}
    first = acts[agents[0]]
    if not cfg.algorithm.share_params and (len(set(obs.values())) > 1 or any(
            not _same_space(space, first) for space in acts.values())):
        return _describe_own_spaces(cfg, env, obs, acts)
    if len(set(obs.values())) > 1:
        listing = ", ".join(f"{a}: {n}" for a, n in obs.items())
        raise ConfigError(f"algorithm {name}: the agents' observation sizes differ ({listing}); pad them with "
                          "scenario.common_spaces: true (or algorithm.share_params: false: networks of their own)")
    for a, space in acts.items():
        try:
            distribution_for(space)
        except ValueError as exc:
            raise ConfigError(f"algorithm {name}: agent {a!r}: {exc}") from None
        if not _same_space(space, first):
            listing = ", ".join(f"{b}: {s}" for b, s in acts.items())
            raise ConfigError(f"algorithm {name}: the agents' action spaces differ ({listing}); pad discrete ones "
                              "with scenario.common_spaces: true (or algorithm.share_params: false: networks of "
                              "their own)")
    state_dim, central = _global_state(cfg, env)
    masked = callable(getattr(env, "action_mask", None)) and hasattr(first, "n")
    return TeamDescription(agents, obs[agents[0]], state_dim, first, masked, central)


def _same_space(space: Any, other: Any) -> bool:
    return type(space) is type(other) and getattr(space, "shape", None) == getattr(other, "shape", None) and \
        getattr(space, "n", None) == getattr(other, "n", None)


def _global_state(cfg: ExperimentConfig, env: Any) -> tuple[int, bool]:
    """The global state's size (0: none) and whether the critic reads it; a ConfigError when it needs one."""
    state_dim = int(np.asarray(env.state()).size) if callable(getattr(env, "state", None)) else 0
    central = centralised(cfg)
    if central and state_dim == 0:
        raise ConfigError(f"algorithm {cfg.algorithm.name}: scenario {cfg.scenario.name!r} offers no global state() "
                          "for the centralised critic")
    return state_dim, central


def _describe_own_spaces(cfg: ExperimentConfig, env: Any, obs: dict[str, int], acts: dict[str, Any]) -> TeamDescription:
    """share_params: false with spaces that differ: every agent's networks are sized from its own spaces.
    The rollout stores observations zero-padded to the largest (each head reads its own first columns)
    and discrete actions as one Categorical over the largest count, an agent's actions beyond its own
    masked (as common_spaces' padding is, but without a padded network). Box actions must agree."""
    name, agents = cfg.algorithm.name, list(acts)
    for a, space in acts.items():
        try:
            distribution_for(space)
        except ValueError as exc:
            raise ConfigError(f"algorithm {name}: agent {a!r}: {exc}") from None
    first = acts[agents[0]]
    discrete = all(isinstance(s, spaces.Discrete) for s in acts.values())
    if not discrete and not all(_same_space(s, first) for s in acts.values()):
        listing = ", ".join(f"{b}: {s}" for b, s in acts.items())
        raise ConfigError(f"algorithm {name}: with share_params: false the agents' action spaces must all be "
                          f"Discrete or all the same Box ({listing})")
    if any(getattr(s, "start", 0) != 0 for s in acts.values()):
        raise ConfigError(f"algorithm {name}: a Discrete action space with a start other than 0 is not supported")
    state_dim, central = _global_state(cfg, env)
    if discrete:
        counts = [int(acts[a].n) for a in agents]
        space = spaces.Discrete(max(counts))
        own_avail = (np.arange(space.n)[None, :] < np.array(counts)[:, None]).astype(np.float32)
        masked = True
    else:
        counts, space, own_avail = None, first, None
        masked = False
    own_out = counts if counts is not None else [head_out_dim(distribution_for(first))] * len(agents)
    return TeamDescription(agents, max(obs.values()), state_dim, space, masked, central,
                           own_obs=[obs[a] for a in agents], own_out=own_out, own_avail=own_avail)


# ----------------------------------------------------------------------------- networks
class PerAgent(nn.Module):
    """One head per agent behind one ``features -> outputs`` interface: the last ``n`` input columns
    are the one-hot agent id; row i goes through head argmax(id_i) (the id columns stripped)."""

    def __init__(self, heads: list[nn.Module], in_dims: Optional[list[int]] = None,
                 out_dim: Optional[int] = None) -> None:
        super().__init__()
        self.heads = nn.ModuleList(heads)
        self.in_dims, self.out_dim = in_dims, out_dim  # own spaces: head i reads its first in_dims[i] columns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.heads)
        feats, ids = x[:, :-n], x[:, -n:].argmax(dim=1)
        if self.in_dims is not None:  # heads of their own sizes; outputs zero-padded to out_dim (None: equal)
            outs = [head(feats[ids == i][:, :self.in_dims[i]]) for i, head in enumerate(self.heads)]
            out = feats.new_zeros((x.shape[0], self.out_dim or outs[0].shape[1]))
            for i, o in enumerate(outs):
                out[ids == i, :o.shape[1]] = o
            return out
        outs = [head(feats[ids == i]) for i, head in enumerate(self.heads)]
        out = outs[0].new_empty((x.shape[0], outs[0].shape[1]))
        for i, o in enumerate(outs):
            out[ids == i] = o
        return out


def input_dims(cfg: ExperimentConfig, desc: TeamDescription) -> tuple[int, int]:
    """The actor's and the critic's input sizes (id columns included)."""
    ids = len(desc.agents) if uses_ids(cfg) else 0
    critic_base = desc.state_dim if desc.central else desc.obs_dim
    return desc.obs_dim + ids, critic_base + ids + opponent_columns(cfg)


def opponent_columns(cfg: ExperimentConfig) -> int:
    """A turn-based game's critic's opponent one-hot columns (``scenario.turns.critic_opponent``), else 0."""
    turns = getattr(cfg.scenario.params, "turns", None)
    return TurnsConfig.from_dict(turns).critic_columns() if turns else 0


def uses_ids(cfg: ExperimentConfig) -> bool:
    return bool(cfg.algorithm.agent_id or not cfg.algorithm.share_params)


def build_team_models(cfg: ExperimentConfig, desc: TeamDescription) -> tuple[nn.Module, nn.Module, Any]:
    """The decentralised actor, the critic and the action distribution, from one seed on every
    worker and the server (so they all start from the same parameters)."""
    dist = distribution_for(desc.action_space)
    actor_in, critic_in = input_dims(cfg, desc)
    n = len(desc.agents)

    def actor_head(in_dim: int) -> nn.Module:
        head = build_head(cfg.actor, in_dim, head_out_dim(dist))
        return LogStd(head, dist.dim, cfg.algorithm.init_log_std) if isinstance(dist, DiagGaussian) else head

    def actor_head_sized(in_dim: int, out_dim: int) -> nn.Module:
        if isinstance(dist, DiagGaussian):
            return actor_head(in_dim)
        return build_head(cfg.actor, in_dim, out_dim)

    with seeded_init(cfg.run.seed):
        if cfg.algorithm.share_params:
            actor, critic = actor_head(actor_in), build_head(cfg.critic, critic_in, 1)
        elif desc.own_obs is not None:  # each agent's own spaces (describe_team)
            actor = PerAgent([actor_head_sized(d, k) for d, k in zip(desc.own_obs, desc.own_out)], desc.own_obs,
                             None if isinstance(dist, DiagGaussian) else head_out_dim(dist))
            critic_dims = [desc.state_dim] * n if desc.central else desc.own_obs
            critic = PerAgent([build_head(cfg.critic, d, 1) for d in critic_dims], critic_dims, 1)
        else:
            actor = PerAgent([actor_head(actor_in - n) for _ in range(n)])
            critic = PerAgent([build_head(cfg.critic, critic_in - n, 1) for _ in range(n)])
    return actor, critic, dist


def check_recurrent(cfg: ExperimentConfig, desc: TeamDescription) -> None:
    """What recurrent heads do not cover yet, each a ConfigError naming the key (docs/recurrent.md)."""
    roles = [r for r in ("actor", "critic") if getattr(getattr(cfg, r).params, "recurrent", None) is not None]
    if not roles:
        return
    role = roles[0]
    if not cfg.algorithm.share_params:
        raise ConfigError(f"{role}.recurrent: needs algorithm.share_params: true (per-agent recurrent heads are not built)")
    if turn_based(cfg):
        raise ConfigError(f"{role}.recurrent: scenario {cfg.scenario.name!r} is turn-based; recurrent heads play "
                          "parallel envs only")
    if "actor" in roles and isinstance(distribution_for(desc.action_space), DiagGaussian):
        raise ConfigError("actor.recurrent: continuous (Box) actions are not supported by the recurrent actor")


# ----------------------------------------------------------------------------- worker
@dataclass
class RolloutRows:
    """One rollout's preallocated arrays (``TeamWorker.begin_rollout``): the batch, the (T + 1, E, N, ...)
    actor rows, critic rows and availabilities, and the next step's index."""

    T: int
    rows: int
    batch: dict[str, np.ndarray]
    obs: np.ndarray
    critic: Optional[np.ndarray]
    avail: Optional[np.ndarray]
    clock: int = 0


class TeamWorker(ActorCriticWorker):
    """Rolls out ``n_steps`` in ``envs_per_worker`` copies of a parallel env, all agents at once
    (``agents.rollout.ParallelCopies``); the rest is the actor-critic worker's."""

    memory: Optional[TeamMemory] = None  # recurrent heads' states (agents/recurrent_ac.py); None: feed-forward
    # the actor's float32 numpy twin the rollout acts through (``float32_twin``: an mlp actor, discrete
    # actions, fast_path on); None: through torch (and for workers pickled before it existed)
    act_twin: Optional[NumpyMLP] = None

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        super().__init__(cfg, index)
        self.value_norm = ValueNorm(self.ac.value_norm_beta) if self.ac.value_norm else None
        fast = getattr(self.ac, "fast_path", True) and not self.dist.continuous
        self.act_twin = float32_twin(self.actor) if fast else None

    def build_env(self) -> None:
        """``envs_per_worker`` copies, each seeded from its own stream; what the networks are sized from."""
        seed = self.cfg.run.seed
        self.envs = [make_env(self.cfg, derive(seed, "env_copy", self.index, k)) for k in range(self.ac.envs_per_worker)]
        self.desc = describe_team(self.cfg, self.envs[0])
        self.central = self.desc.central

    def make_models(self) -> tuple[nn.Module, nn.Module, Any]:
        return build_team_models(self.cfg, self.desc)

    @staticmethod
    def _one_step_reuse(ac: ActorCriticConfig) -> bool:  # multi-agent batches go through torch
        return False

    def reset_env(self) -> None:
        """The copies (pending their first reset; ``agents.rollout.team_copies``: stepped together as
        arrays where the env's class can) and the episode book."""
        self.vec = team_copies(self.envs, self.desc.agents, self.dist.continuous)
        self.book = AgentEpisodeBook(len(self.envs), len(self.desc.agents))  # rows carry per-agent returns
        self.memory = team_memory(self.actor, self.critic, len(self.envs), len(self.desc.agents))

    def adopt_rollout_state(self, state: dict) -> None:
        self.vec = ParallelCopies.__new__(ParallelCopies)
        self.vec.envs, self.vec.agents, self.vec.continuous = self.envs, self.desc.agents, self.dist.continuous
        self.vec.num_envs = len(self.envs)
        self.vec.obs, self.vec.infos, self.vec.pending_reset = state["obs"], state["infos"], state["pending_reset"]
        self.book = EpisodeBook.resumed(state["ep_return"], state["ep_length"])
        for key in ("obs", "infos", "pending_reset", "ep_return", "ep_length"):
            self.__dict__.pop(key, None)

    def _row_arrays(self, T: int) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
        """Preallocated (T, E, N, ...) actor inputs, critic inputs (a centralised critic's; None when it
        reads the actor's) and availabilities (masked envs), the agent-id columns already in place."""
        d, E, N = self.desc, len(self.envs), len(self.desc.agents)
        actor_in, critic_in = input_dims(self.cfg, d)
        obs = np.zeros((T, E, N, actor_in), dtype=np.float32)
        critic = np.zeros((T, E, N, critic_in), dtype=np.float32) if self.central else None
        avail = np.ones((T, E, N, d.action_space.n), dtype=np.float32) if d.masked else None
        if uses_ids(self.cfg):
            obs[..., d.obs_dim:] = np.eye(N, dtype=np.float32)
            if critic is not None:
                critic[..., d.state_dim:] = np.eye(N, dtype=np.float32)
        return obs, critic, avail

    def _fill(self, vec: TeamRows, obs: np.ndarray, critic: Optional[np.ndarray], avail: Optional[np.ndarray]) -> None:
        """One step's rows (E, N, ...) from the copies' current observations (zeros for an agent not in play)."""
        d = self.desc
        state = np.empty((len(self.envs), d.state_dim), dtype=np.float32) if critic is not None else None
        vec.rows(obs[..., :d.obs_dim], state, avail)
        if avail is not None and d.own_avail is not None:  # each agent's own actions only
            avail *= d.own_avail
        if critic is not None:
            critic[..., :d.state_dim] = state[:, None, :]

    def rollout(self) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
        """n_steps of every copy (agents.rollout) into preallocated arrays; a restart step and an agent
        out of play are masked out."""
        part = self.begin_rollout(self.ac.n_steps)

        def act(vec: TeamRows) -> np.ndarray:
            return self.act_rows(part, vec)

        def store(t: int, vec: TeamRows, actions: np.ndarray, step: Step) -> None:
            self.store_rows(part, t, actions, step.data)

        episodes, steps = rollout(self.vec, self.book, part.T, act, store, row=lambda e: {"version": self.version},
                                  to_env=self.dist.to_env)
        return self.end_rollout(part, self.vec), episodes, steps

    # -- one rollout's rows, step by step (``rollout`` above; a worker of one learner per team drives
    # -- each team's learner through them over its own agents' rows: agents/team_learners.py)
    def begin_rollout(self, T: int) -> "RolloutRows":
        """The preallocated arrays of a rollout of ``T`` steps (the recurrent heads' states begin one)."""
        rows = len(self.envs) * len(self.desc.agents)
        batch: dict[str, np.ndarray] = {
            "actions": np.zeros((T, rows) + self.dist.action_shape(), dtype=self.dist.action_dtype()),
            "rewards": np.zeros((T, rows)), "terminated": np.zeros((T, rows), dtype=bool),
            "dones": np.zeros((T, rows), dtype=bool), "valid": np.zeros((T, rows), dtype=bool)}
        obs, critic, avail = self._row_arrays(T + 1)  # the last: the bootstrap rows after the last step
        if self.memory is not None:
            self.memory.begin(T, self.ac.chunk or T)
        return RolloutRows(T, rows, batch, obs, critic, avail)

    def act_rows(self, part: "RolloutRows", vec: TeamRows) -> np.ndarray:
        """The actions of the rollout's next step: its rows filled from ``vec``, one forward, a sample."""
        t = part.clock
        part.clock += 1
        obs, critic, avail, rows, memory = part.obs, part.critic, part.avail, part.rows, self.memory
        self._fill(vec, obs[t], None if critic is None else critic[t], None if avail is None else avail[t])
        if memory is None and self.act_twin is not None:  # numpy's GEMMs and tanh: no torch dispatch per layer
            out = self.act_twin.forward(obs[t].reshape(rows, -1))[0]
        else:
            with torch.inference_mode():  # acting keeps no graph
                x = torch.from_numpy(obs[t].reshape(rows, -1))
                if memory is None:
                    out = self.actor(x).numpy()
                else:  # the recurrent heads step (the critic too: its states at the chunk starts)
                    inputs = {"actor": x, "critic": x if critic is None else torch.from_numpy(critic[t].reshape(rows, -1))}
                    out = memory.act(t, {"actor": self.actor, "critic": self.critic}, inputs, vec.pending_reset).numpy()
        return self.dist.sample(out, self.rng, None if avail is None else avail[t].reshape(rows, -1))

    def store_rows(self, part: "RolloutRows", t: int, actions: np.ndarray, data: TeamStep) -> None:
        """Step ``t``'s actions and its ``TeamStep`` (E, N) arrays into the batch."""
        batch = part.batch
        batch["actions"][t] = actions
        batch["valid"][t] = data.live.reshape(-1)
        batch["rewards"][t] = data.rewards.reshape(-1)
        batch["terminated"][t] = data.terminated.reshape(-1)
        batch["dones"][t] = data.dones.reshape(-1)

    def end_rollout(self, part: "RolloutRows", vec: TeamRows) -> dict[str, np.ndarray]:
        """The bootstrap rows after the last step, from ``vec``; the batch the update reads."""
        T, rows, batch, obs, critic, avail = part.T, part.rows, part.batch, part.obs, part.critic, part.avail
        self._fill(vec, obs[T], None if critic is None else critic[T], None if avail is None else avail[T])
        if self.memory is not None:
            self.memory.finish(batch)
        batch["obs"] = obs.reshape(T + 1, rows, -1)
        if critic is not None:
            batch["critic_obs"] = critic.reshape(T + 1, rows, -1)
        if avail is not None:
            batch["avail"] = avail[:T].reshape(T, rows, -1)
        return batch

    def play_greedy(self, episodes: int, seed: int, progress: bool = False,
                    closed: Optional[list[dict[str, Any]]] = None) -> list[float]:
        """Team returns of ``episodes`` episodes with every agent taking its policy's mode
        (agents.rollout.evaluate); the env copies are reset with seeds drawn from ``seed`` (the
        training rollout's copies and book are left as they were). ``closed`` gets each episode's row
        with its per-agent returns."""
        seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=len(self.envs))
        vec = team_copies(self.envs, self.desc.agents, self.dist.continuous, reset_seeds=seeds)
        mode = self.greedy()
        with eval_progress(episodes, progress) as bar:
            return evaluate(vec, episodes, mode, to_env=self.dist.to_env, bar=bar,
                            book=AgentEpisodeBook(len(self.envs), len(self.desc.agents)), closed=closed)

    def greedy(self) -> Callable[[TeamRows], np.ndarray]:
        """Every agent's policy mode on a vector's current rows, step after step (a recurrent actor from a
        fresh state): ``play_greedy``'s hook."""
        obs, _, avail = self._row_arrays(1)
        rows = obs.shape[1] * obs.shape[2]
        memory = None if self.memory is None else self.memory.fresh(self.actor, self.critic)

        def mode(copies: TeamRows) -> np.ndarray:
            self._fill(copies, obs[0], None, None if avail is None else avail[0])
            with torch.inference_mode():
                x = torch.from_numpy(obs[0].reshape(rows, -1))
                out = (self.actor(x) if memory is None else
                       memory.act(None, {"actor": self.actor}, {"actor": x}, copies.pending_reset)).numpy()
            return self.dist.mode(out, None if avail is None else avail[0].reshape(rows, -1))

        return mode

    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, Optional[float]]:
        if self.memory is not None:  # chunked BPTT (agents/recurrent_ac.py)
            return recurrent_update(self.ac, self.actor, self.critic, self.flat, self.optimizer, self.rng, batch,
                                    self.ac.chunk or self.ac.n_steps, dist=self.dist, value_norm=self.value_norm)
        return actor_critic_update(self.ac, self.actor, self.critic, self.flat, self.optimizer, self.rng, batch,
                                   dist=self.dist, value_norm=self.value_norm)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class TurnWorker(TurnTaking, TeamWorker):
    """A team worker on a turn-based game: the learner in one seat against opponents (agents/turn_based.py)."""

    def agent_ids(self) -> Optional[np.ndarray]:
        """The one-hot seat ids appended to the learner's rows (None without agent ids)."""
        return np.eye(len(self.desc.agents), dtype=np.float32) if uses_ids(self.cfg) else None


# ----------------------------------------------------------------------------- algorithm
class TeamActorCritic(ActorCritic):
    """The actor-critic algorithm with a team rollout; the server side is ActorCritic's. Each
    critic estimates an agent's value from its own observation (ippo, ia2c)."""

    central_critic = False
    recurrent_policies = True  # actor.recurrent / critic.recurrent (agents/recurrent_ac.py)
    reports_teams = True  # per-team and per-agent returns (marl_q/teams.py; not on a turn-based game)
    team_learners = "agents.team_learners:TeamLearners"  # one learner per team (``learners:``, marl_q.registry)

    def __init__(self, cfg: ExperimentConfig, agents: Optional[list[str]] = None) -> None:
        """``agents``: the env's agents this learner's networks serve (one team's; default all of them)."""
        super().__init__(cfg)
        self.agents = agents
        self.teams: Optional[Teams] = None  # a turn-based game's rows are its learner's seat's
        if turn_based(cfg):  # each episode's seat, opponent and outcome (agents/turn_based.py)
            self.metric_fields = self.metric_fields + list(TURN_FIELDS)
        else:  # per-team and per-agent returns (marl_q/teams.py)
            env = make_env(cfg, cfg.run.seed)
            try:
                self.teams = teams_for(cfg, list(env.possible_agents))
            finally:
                env.close()

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        super().check_config(cfg)
        env = make_env(cfg, cfg.run.seed)
        try:
            if opponent_columns(cfg) and (not cfg.algorithm.share_params or cfg.critic.recurrent):
                raise ConfigError(f"scenario.turns.critic_opponent: algorithm {cfg.algorithm.name} needs "
                                  "algorithm.share_params: true and a feed-forward critic for it")
            if turn_based(cfg):
                try:
                    board_group(env, TurnsConfig.from_dict(cfg.scenario.params.turns).symmetries)
                except ValueError as exc:
                    raise ConfigError(f"scenario.{exc} (scenario.env {getattr(cfg.scenario.params, 'env', '')})") from None
            else:
                teams_for(cfg, list(env.possible_agents))
            cls.check_agents(cfg, env)
        finally:
            env.close()

    @classmethod
    def check_agents(cls, cfg: ExperimentConfig, env: Any, agents: Optional[list[str]] = None) -> TeamDescription:
        """What the networks of ``agents`` (default: every agent of ``env``) need of the config; their description."""
        desc = describe_team(cfg, env, agents)
        if desc.own_obs is not None and turn_based(cfg):
            raise ConfigError(f"algorithm {cfg.algorithm.name}: scenario {cfg.scenario.name!r} is turn-based; "
                              "agents with spaces of their own play parallel envs only (scenario.common_spaces: true)")
        check_recurrent(cfg, desc)
        return desc

    def build_models(self) -> tuple[nn.Module, nn.Module]:
        env = make_env(self.cfg, self.cfg.run.seed)
        try:
            actor, critic, _ = build_team_models(self.cfg, describe_team(self.cfg, env, self.agents))
        finally:
            env.close()
        return actor, critic

    def acting_policy(self, state: dict[str, np.ndarray]) -> ActingPolicy:
        """The decentralised actor at the checkpoint's parameters, each of its agents (``self.agents``, or the
        env's) acting on its own observation with its id appended, as in a rollout; a recurrent actor has
        none (it needs its state per agent)."""
        if getattr(self.cfg.actor.params, "recurrent", None) is not None:
            from marl_q.errors import UserError
            raise UserError(f"algorithm {self.cfg.algorithm.name!r}: a recurrent actor (actor.recurrent) has no "
                            "stateless acting policy to load from a checkpoint (docs/recurrent.md)")
        cfg = self.cfg
        env = make_env(cfg, cfg.run.seed)
        try:
            desc = describe_team(cfg, env, self.agents)
        finally:
            env.close()
        actor, critic, _ = build_team_models(cfg, desc)
        FlatParameters(actor, critic).load(state[PARAMS])
        actor_in, _ = input_dims(cfg, desc)
        index = {a: i for i, a in enumerate(desc.agents)}
        ids = uses_ids(cfg)

        @torch.no_grad()
        def logits(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            """The agents' rows as a rollout makes them (the observation zero-padded, then the agent's id)."""
            names = sorted(obs)
            if not names:
                return {}
            x = np.zeros((len(names), actor_in), dtype=np.float32)
            for r, name in enumerate(names):
                own = np.asarray(obs[name], dtype=np.float32).reshape(-1)
                x[r, :own.size] = own
                if ids:
                    x[r, desc.obs_dim + index[name]] = 1.0
            out = actor(torch.from_numpy(x)).numpy()
            if desc.own_avail is not None:  # an agent's actions beyond its own are never taken
                out = np.where(np.stack([desc.own_avail[index[n]] for n in names]) > 0, out, -np.inf)
            return dict(zip(names, out))

        return ActingPolicy(logits, agents=list(desc.agents), models={"actor": actor, "critic": critic})

    def make_worker(self, index: int) -> TeamWorker:
        return (TurnWorker if turn_based(self.cfg) else TeamWorker)(self.cfg, index)

    def evaluate_returns(self, episodes: int, seed: int) -> list[float]:
        """``episodes`` greedy team episodes of the server's current actor (marl_q.evaluation), played
        by a worker of its own whose environments are seeded from ``seed``."""
        if getattr(self, "_evaluator", None) is None:  # its models are seeded on their own (seeded_init)
            self._evaluator = self.make_worker(0)
        worker = self._evaluator
        worker.flat.load(self.service.param.numpy())
        return team_eval_returns(self.teams, worker.play_greedy, episodes, seed, self.cfg.run.progress)


def team_eval_returns(teams: Optional[Teams], play: Callable[..., list[float]], episodes: int, seed: int,
                      progress: bool) -> list[float]:
    """A greedy evaluation's returns through ``play`` (a worker's ``play_greedy``): with several teams the
    report team's, with each team's mean return as an ``eval_return:<team>`` column (marl_q/teams.py)."""
    if teams is None or not teams.several:  # the one team's return: every agent's reward summed
        return play(episodes, seed, progress)
    closed: list[dict[str, Any]] = []
    play(episodes, seed, progress, closed=closed)
    per = [teams.team_returns(row["agent_returns"]) for row in closed]
    return EvalReturns([p[teams.report] for p in per],  # eval_return is the report team's
                       {f"eval_{team_column(t)}": float(np.mean([p[t] for p in per])) for t in teams.names})


class CentralCriticTeamActorCritic(TeamActorCritic):
    """The team actor-critic whose critic reads the global state and the agent's id, V(s, i) (mappo, maa2c)."""

    central_critic = True


for _name, _family, _config, _help in (
        ("ippo", TeamActorCritic, MultiAgentPPOConfig,
         "IPPO: decentralised PPO actors, each critic V(o_i) on its own observation"),
        ("mappo", CentralCriticTeamActorCritic, MultiAgentPPOConfig,
         "MAPPO: decentralised PPO actors, a centralised critic V(s, i)"),
        ("ia2c", TeamActorCritic, MultiAgentA2CConfig, "IA2C: decentralised A2C actors with critics V(o_i)"),
        ("maa2c", CentralCriticTeamActorCritic, MultiAgentA2CConfig,
         "MAA2C: decentralised A2C actors with a centralised critic V(s, i)")):
    ALGORITHMS.add(_name, _family, config=_config, help=_help)
