"""Value-based learners on the asynchronous server: a replay service, DQN, IQL, VDN and QMIX.

docs/value_based.md. Actor workers act epsilon-greedily with the Q-network they last pulled, turn
``algorithm.chunk_steps`` env steps into n-step replay rows (agents/replay.py ``n_step_chunk``; a
window cut by the chunk's end waits for the next chunk) and push them as one ``transitions`` message
through the server core (admission, ledger, staleness: a chunk staler than ``server.max_staleness`` is
dropped, never inserted), then wait for the parameters. The server's ``ReplayService`` inserts the
rows into its buffer (uniform or prioritized), updates the target network every
``algorithm.target_update_every`` env steps (hard, or Polyak with ``tau`` < 1) and runs
``algorithm.replay.ratio`` gradient updates per env step received once ``replay.learning_starts``
steps are in (a fractional credit carries over), then replies with the online network's parameters.
With ``chunk_steps`` 256 and ratio 0.5 this is SB3's DQN loop (train_freq 256, gradient_steps 128).
The acting loop is ``agents.rollout``'s ``rollout`` with epsilon-greedy hooks (``collect_chunk``), and
``run.eval_every``'s greedy episodes are its ``evaluate`` through an evaluator worker's acting path.

- ``dqn``: one agent on a single-agent vector env (Gymnasium); Double DQN unless ``double: false``. On
  a turn-based (AEC) game (``TurnQWorker``, agents/turn_based.py) it plays one seat per episode against
  ``scenario.turns``' opponents, with one Q-network for every seat (its seat id appended): a
  transition runs from one of its turns to its next (``TurnEnv``), so the target bootstraps from its
  own next turn over the legal moves there, the opponents' replies being part of the environment.
- ``iql`` / ``vdn`` / ``qmix``: the agents of a PettingZoo ParallelEnv share one Q-network (agent id
  one-hot appended unless ``agent_id: false``), trained on the team reward; IQL gives each agent its own
  TD target, VDN sums the agents' Qs, QMIX mixes them with a hypernetwork of the global state.
The Q-network is the ``critic`` section's head (``critic.head: mlp`` ...); ``dueling: true`` wraps it
in COMA's ``DuelingQ``. The ``actor`` section is not used.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
import torch
from torch import nn

from agents.actor_critic import PullingWorker
from agents.coma import described, stack_obs, team_reward
from agents.coma_learner import DuelingQ
from agents.heads import FlatParameters, build_head, count_params, head_report, worker_heads
from agents.losses import diagnostics
from agents.numpy_heads import NumpyMLP, TorchMLP, numpy_acting_head
from agents.recurrent import is_recurrent
from agents.replay import (EpisodeBuffer, Field, PrioritizedReplayBuffer, ReplayBuffer, ReplayConfigError,
                           n_step_chunk, n_step_windows, sequence_windows, transition_fields)
from agents.rollout import EpisodeBook, GymVector, Step, evaluate, rollout
from agents.turn_based import TurnCopies, TurnPlay
from agents.value_norm import RunningMeanStd
from agents.value_targets import (QMixer, VDNMixer, bootstrap_values, epsilon_greedy, exponential_schedule,
                                  linear_schedule, masked_argmax, q_taken, td_loss, td_loss_grad,
                                  td_target)
from marl_q.errors import CheckpointError, ConfigError
from marl_q.evaluation import eval_progress
from marl_q.messages import SERVER, Message
from marl_q.metrics import episode_summary
from marl_q.optim import FlatAdam, LrSchedule, clip_flat_grad, flush_denormals, lr_factor
from marl_q.protocol import ActingPolicy, Algorithm, Context, MessageSpec, Outcome, Service, Work, worker_name
from marl_q.registry import ALGORITHMS, SCENARIOS, cannot_take_turns
from marl_q.seeding import derive, seeded_init
from marl_q.services import PARAMS
from scenarios.aec import TURN_FIELDS, TurnGame, TurnsConfig

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

TRANSITIONS = "transitions"  # the message kind (a chunk of replay rows) workers push
ENV_STEPS = "env_steps"  # Message.info key: env steps behind a chunk (params: the server's count)
SINGLE = ("dqn",)


# ----------------------------------------------------------------------------- config
@dataclass
class ReplayConfig:
    """The server's replay buffer and how often the learner samples it."""

    capacity: int = 100_000
    batch_size: int = 32
    ratio: float = 0.25  # gradient updates per env step received (the replay ratio)
    learning_starts: int = 1000  # env steps received before the first gradient update
    n_step: int = 1
    prioritized: bool = False  # proportional PER (Schaul et al. 2016)
    alpha: float = 0.6  # priority exponent (prioritized only)
    beta_start: float = 0.4  # importance-weight exponent, annealed linearly to beta_end over the budget
    beta_end: float = 1.0
    priority_eps: float = 1e-6
    # sim: a buffer holding more bytes than this is left out of the snapshot (said once on stderr); the
    # checkpoint still holds it, and a resume is then inexact (fresh workers), as for Box2D envs
    snapshot_max_bytes: Optional[int] = 2**30
    # a recurrent Q-network (critic.recurrent: gru) replays sequences of this many steps (R2D2; one row of
    # the buffer each, so capacity and batch_size count sequences); an episode no longer than it is one
    # sequence (EPyMARL's whole-episode replay); null: feed-forward replay of transitions
    sequence: Optional[int] = None
    burn_in: int = 0  # R2D2: steps at a sequence's start unrolled without gradient, outside the loss
    overlap: Optional[int] = None  # steps adjacent sequences of an episode share; null: burn_in (R2D2: 40 of 80)

    @property
    def sequence_overlap(self) -> int:
        return self.burn_in if self.overlap is None else self.overlap

    def validate(self) -> None:
        try:
            ReplayBuffer([Field("x")], self.capacity).check_batch_size(self.batch_size)
            if self.prioritized:
                PrioritizedReplayBuffer([Field("x")], 1, self.alpha, self.priority_eps)
            n_step_windows(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)), 0.5, self.n_step)
        except ReplayConfigError as exc:
            raise ReplayConfigError(f"algorithm.{exc}") from None
        for key in ("beta_start", "beta_end"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ReplayConfigError(f"algorithm.replay.{key} must lie in [0, 1], got {getattr(self, key)!r}")
        if self.ratio < 0:
            raise ReplayConfigError(f"algorithm.replay.ratio must be >= 0, got {self.ratio!r}")
        if self.learning_starts < 0:
            raise ReplayConfigError(f"algorithm.replay.learning_starts must be >= 0, got {self.learning_starts!r}")
        if self.sequence is None:
            for key in ("burn_in", "overlap"):
                if getattr(self, key) not in (None, 0):
                    raise ReplayConfigError(f"algorithm.replay.{key}: needs replay.sequence (sequence replay of a "
                                            "recurrent Q-network, critic.recurrent: gru)")
            return
        if isinstance(self.sequence, int) and self.sequence >= 1 and not 0 <= self.burn_in < self.sequence:
            raise ReplayConfigError(f"algorithm.replay.burn_in={self.burn_in} must lie in [0, replay.sequence="
                                    f"{self.sequence}): the TD loss needs steps after the burn-in")
        try:
            sequence_windows(1, self.sequence, self.sequence_overlap)
        except ReplayConfigError as exc:
            raise ReplayConfigError(f"algorithm.{exc}") from None


@dataclass
class QConfig:
    """DQN/IQL/VDN/QMIX. Defaults: EPyMARL's QMIX where it has one (gamma 0.99, lr 5e-4, eps 1 -> 0.05 over
    50k steps, target every 200 episodes ~ 5000 steps of spread, grad clip 10), Double DQN, Huber."""

    gamma: float = 0.99
    lr: float = 5e-4
    # linear: every Adam rate (lr, lr_input_scale, lr_output_scale) annealed to 0 over the run's budget
    # (marl_q.optim.lr_factor, the actor-critic learners' rule)
    lr_schedule: LrSchedule = "constant"
    adam_eps: float = 1e-8
    # circuit heads (vqc): Adam's learning rates of the trainable input scalings and the output scalings
    # (null: lr); Skolik et al. train the output scaling 100x faster than the rest
    lr_input_scale: Optional[float] = None
    lr_output_scale: Optional[float] = None
    double: bool = True  # Double DQN targets (van Hasselt et al. 2016); false: DQN's max
    dueling: bool = False  # Q = V + A - mean A (agents/coma_learner.DuelingQ)
    loss: Literal["huber", "mse"] = "huber"
    huber_delta: float = 1.0
    grad_clip: Optional[float] = 10.0  # max global grad norm; null: no clipping
    target_update_every: int = 5000  # env steps received between target updates
    tau: float = 1.0  # 1: hard copy; < 1: Polyak averaging target <- tau online + (1 - tau) target
    epsilon_schedule: Literal["linear", "exponential"] = "linear"
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_anneal_steps: int = 50_000  # env steps (the server's count plus the worker's since)
    chunk_steps: int = 25  # env steps (per env copy) a worker takes between pushes
    # dqn on a turn-based (AEC) game: the game copies a worker plays (a Gymnasium env's copies are its
    # scenario.num_envs)
    envs_per_worker: int = 1
    agent_id: bool = True  # multi-agent: append a one-hot agent index to each agent's observation
    team_reward: Literal["sum", "mean"] = "sum"  # multi-agent: how the agents' rewards make the team's
    # EPyMARL's standardise_rewards: each replayed batch's rewards update a running mean and variance
    # (agents.value_norm.RunningMeanStd, part of the checkpoint) and enter the TD target as (r - mean) / std
    standardise_rewards: bool = False
    # true: a step that ends an episode at its time limit (truncated) is terminal for the TD target (no
    # bootstrap), as EPyMARL's episode runner stores it for Gymnasium and PettingZoo tasks; false (the
    # default): the target bootstraps from the last observation, the time limit not being part of the task
    terminal_at_time_limit: bool = False
    mixer_embed_dim: int = 32  # qmix
    hypernet_layers: int = 2  # qmix: 1 (the paper) or 2 (PyMARL/EPyMARL)
    hypernet_embed: int = 64
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def validate(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma: must lie in [0, 1], got {self.gamma}")
        for key in ("lr", "adam_eps", "huber_delta"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}: must be positive, got {getattr(self, key)}")
        for key in ("lr_input_scale", "lr_output_scale"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                raise ValueError(f"{key}: must be positive, got {getattr(self, key)}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip: must be positive or null, got {self.grad_clip}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        for key in ("target_update_every", "chunk_steps", "envs_per_worker"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1, got {getattr(self, key)}")
        self.epsilon(0)  # the schedule's own checks (ValueError naming the key)

    def epsilon(self, env_steps: int) -> float:
        schedule = linear_schedule if self.epsilon_schedule == "linear" else exponential_schedule
        return schedule(env_steps, self.epsilon_start, self.epsilon_end, self.epsilon_anneal_steps)


# ----------------------------------------------------------------------------- environment
@dataclass
class QDims:
    """What the networks and the replay rows are sized from (one env instance)."""

    obs_dim: int
    n_actions: int
    n_agents: Optional[int] = None  # None: single agent
    state_dim: Optional[int] = None  # qmix's mixer input
    agents: tuple[str, ...] = ()
    # dqn on a turn-based game: its seats are ``agents``, action masks are stored, and ``obs_dim`` is the
    # learner's row: the observation, then ``seats`` one-hot seat-id columns (agent_id; else 0)
    turns: bool = False
    seats: int = 0
    # multi-agent: the Q-network's input carries a one-hot agent index (``algorithm.agent_id``)
    agent_id: bool = True
    # dqn with a recurrent Q-network: the single-agent env acts as a team of one (``SoloTeam``), so that it
    # replays sequences on the team learners' path (n_agents 1, no agent index)
    solo: bool = False

    @property
    def in_dim(self) -> int:
        return self.obs_dim + (self.n_agents or 0 if self.agent_id else 0)


def _discrete(cfg: ExperimentConfig, where: str, space: Any) -> int:
    if not hasattr(space, "n"):
        raise ConfigError(f"algorithm.name: {cfg.algorithm.name} is a value-based learner and needs discrete "
                          f"actions, but {where} has {space}")
    return int(space.n)


def make_q_env(cfg: ExperimentConfig, seed: int) -> Any:
    """The scenario's env: a Gymnasium vector env or a turn-based game (``scenarios.aec.TurnGame``) for
    dqn, a PettingZoo ParallelEnv for iql/vdn/qmix."""
    spec = SCENARIOS.get(cfg.scenario.name, key="scenario.name").obj
    kind = "gym_vector" if cfg.algorithm.name in SINGLE else "parallel"
    actual = spec.kind_for(cfg.scenario.params)  # gymnasium: single-agent, or multi-agent (Tuple spaces)
    if actual == "aec":  # the learner in one seat of a turn-based game (TurnQWorker): dqn only
        if cfg.algorithm.name not in SINGLE:
            raise cannot_take_turns(cfg)
        return spec.make(cfg.scenario.params, seed=seed)
    if cfg.algorithm.envs_per_worker != 1:
        raise ConfigError(f"algorithm.envs_per_worker: the copies of a turn-based game a dqn worker plays; scenario "
                          f"{cfg.scenario.name!r} is not one (a Gymnasium env's copies are scenario.num_envs)")
    if actual != kind:
        want = "a single-agent vector environment" if kind == "gym_vector" else "a multi-agent ParallelEnv"
        raise ConfigError(f"algorithm.name: {cfg.algorithm.name} needs {want}; scenario {cfg.scenario.name!r} "
                          f"is of kind {actual!r}")
    return spec.make(cfg.scenario.params, seed=seed)


def _equal_agents(cfg: ExperimentConfig, env: Any, who: str, hint: str) -> tuple[tuple, dict, dict]:
    """The env's agents, their action counts and observation sizes, which one Q-network needs equal
    (ConfigError: "``who`` needs the same action space and observation size ...``hint``")."""
    agents = tuple(env.possible_agents)
    sizes = {a: _discrete(cfg, f"agent {a!r}", env.action_space(a)) for a in agents}
    obs = {a: int(np.prod(env.observation_space(a).shape)) for a in agents}
    if len(set(sizes.values())) > 1 or len(set(obs.values())) > 1:
        raise ConfigError(f"algorithm.name: {who} needs the same action space and observation size (actions "
                          f"{sizes}, observations {obs}){hint}")
    return agents, sizes, obs


def describe(cfg: ExperimentConfig, env: Any) -> QDims:
    """Sizes from one env; a ConfigError for continuous or unequal action spaces and for qmix without a state."""
    name = cfg.algorithm.name
    if isinstance(env, TurnGame):  # one Q-network plays every seat
        agents, sizes, obs = _equal_agents(cfg, env, f"{name} plays every seat of a turn-based game with one "
                                                     "Q-network, so every seat", "")
        seats = len(agents) if cfg.algorithm.agent_id else 0
        return QDims(obs[agents[0]] + seats, sizes[agents[0]], agents=agents, turns=True, seats=seats)
    if name in SINGLE:
        n = _discrete(cfg, f"scenario {cfg.scenario.name!r}", env.single_action_space)
        obs_dim = int(np.prod(env.single_observation_space.shape))
        if getattr(cfg.critic.params, "recurrent", None) is not None:
            return QDims(obs_dim, n, 1, agents=("agent",), agent_id=False, solo=True)
        return QDims(obs_dim, n)
    agents, sizes, obs = _equal_agents(cfg, env, f"{name} shares one Q-network, so every agent",
                                       "; pad them with scenario.common_spaces: true")
    state_dim = None
    if name == "qmix":
        if not callable(getattr(env, "state", None)):
            raise ConfigError(f"algorithm.name: qmix mixes on the global state, but scenario {cfg.scenario.name!r} "
                              "offers no state(); use scenario.name: pettingzoo with scenario.state: concat, "
                              "or algorithm.name: vdn")
        env.reset(seed=cfg.run.seed)
        state_dim = int(np.asarray(env.state()).size)
    return QDims(obs[agents[0]], sizes[agents[0]], len(agents), state_dim, agents, agent_id=cfg.algorithm.agent_id)


def replay_fields(dims: QDims) -> list[Field]:
    """The replay rows: transition_fields with action masks for multi-agent and the state for qmix."""
    return transition_fields((dims.obs_dim,), n_agents=dims.n_agents,
                             n_actions=dims.n_actions if dims.n_agents or dims.turns else None,
                             state_dim=dims.state_dim)


def sequence_buffer(dims: QDims, replay: ReplayConfig, hidden: int, capacity: int = 1) -> EpisodeBuffer:
    """The layout of a recurrent learner's replay (``capacity`` sequences): per step obs, avail (and the
    state for qmix) at the sequence's ``replay.sequence`` + 1 observations (the last: the bootstrap
    observation of its last step), and action, reward, terminated at its steps (the last position
    zero); ``mask`` True on the observations the sequence has (a sequence of k steps: k + 1); ``h0``
    (n_agents, hidden), the acting network's state at the sequence's first step."""
    agent = (dims.n_agents,)
    fields = [Field("obs", agent + (dims.obs_dim,)), Field("action", agent, np.int64), Field("reward", ()),
              Field("terminated", (), np.bool_), Field("avail", agent + (dims.n_actions,), np.bool_)]
    if dims.state_dim is not None:
        fields.append(Field("state", (dims.state_dim,)))
    return EpisodeBuffer(fields, capacity, replay.sequence + 1, episode_fields=[Field("h0", agent + (hidden,))])


def replay_buffer(replay: ReplayConfig, dims: QDims, capacity: int, hidden: Optional[int] = None,
                  prioritized: Optional[bool] = None) -> ReplayBuffer:
    """The server's buffer of ``capacity`` rows: sequences (``sequence_buffer``) for a recurrent Q-network
    of state size ``hidden``, else transitions (``replay_fields``), prioritized when ``prioritized``
    (default ``replay.prioritized``). ``marlq bench replay_memory`` builds the same."""
    if hidden is not None:
        return sequence_buffer(dims, replay, hidden, capacity)
    if replay.prioritized if prioritized is None else prioritized:
        return PrioritizedReplayBuffer(replay_fields(dims), capacity, replay.alpha, replay.priority_eps)
    return ReplayBuffer(replay_fields(dims), capacity)


def build_q_network(cfg: ExperimentConfig, dims: QDims) -> nn.Module:
    """The shared Q-network from the ``critic`` section: in_dim -> n_actions (+1 for a dueling head). Its
    callers build it inside ``seeded_init(run.seed)``, so that workers and server start from the same
    parameters and torch's global stream is left alone (the server's mixers draw after it in one block)."""
    dueling = cfg.algorithm.dueling
    try:
        net = build_head(cfg.critic, dims.in_dim, dims.n_actions + (1 if dueling else 0))
    except ValueError as exc:
        raise ConfigError(f"critic: {exc}") from None
    return DuelingQ(net) if dueling else net


def with_agent_id(obs: np.ndarray | torch.Tensor, n_agents: Optional[int]) -> Any:
    """(..., n_agents, obs_dim) -> (..., n_agents, obs_dim + n_agents) with a one-hot agent index."""
    if not n_agents:
        return obs
    if isinstance(obs, torch.Tensor):
        eye = torch.eye(n_agents, dtype=obs.dtype).expand(*obs.shape[:-1], n_agents)
        return torch.cat([obs, eye], dim=-1)
    eye = np.broadcast_to(np.eye(n_agents, dtype=obs.dtype), (*obs.shape[:-1], n_agents))
    return np.concatenate([obs, eye], axis=-1)


def q_inputs(obs: torch.Tensor, dims: QDims, agent_id: bool) -> torch.Tensor:
    """The Q-network's inputs (B, [n_agents,] in) of observations (B, [n_agents,] obs_dim): with the
    one-hot agent index when ``agent_id``."""
    return with_agent_id(obs, dims.n_agents) if agent_id else obs


def q_forward(net: nn.Module, obs: torch.Tensor, dims: QDims, agent_id: bool) -> torch.Tensor:
    """Q-values (B, [n_agents,] A) of observations (B, [n_agents,] obs_dim)."""
    x = q_inputs(obs, dims, agent_id)
    flat = x.reshape(-1, x.shape[-1])
    return net(flat).reshape(*x.shape[:-1], -1)


# ----------------------------------------------------------------------------- acting
class TeamEnv:
    """One PettingZoo ParallelEnv as a one-copy vector for ``agents.rollout``, restarted (unseeded: its
    own RNG continues) in the step that ends an episode, so every step is valid and a chunk of
    ``max_cycles`` steps is one episode (``ParallelCopies`` instead spends a step on each reset).

    ``observe()``: obs (1, n_agents, obs_dim) float32 (zeros for an agent not in play), avail
    (1, n_agents, A) bool from ``infos[agent]["action_mask"]`` (all True without one), and the global
    state (1, state_dim) float32 for qmix, else None. A step's reward is the team's (``coma.team_reward``);
    the episode ends when an agent terminates (``terminated``), or every agent is truncated or none
    is left (``truncated``). ``data``: the transition's ``next_obs``, ``next_avail``, ``next_state``
    (qmix), ``reward`` (float32), ``terminated`` and ``truncated``, each with the copy axis."""

    num_envs = 1

    def __init__(self, env: Any, dims: QDims, seed: Optional[int], how: str) -> None:
        self.env, self.dims, self.how = env, dims, how
        self._reset(seed)

    def _arrays(self, obs_d: dict, infos: dict) -> tuple[np.ndarray, np.ndarray]:
        d = self.dims
        avail = np.ones((1, d.n_agents, d.n_actions), dtype=bool)
        for i, a in enumerate(d.agents):
            mask = (infos.get(a) or {}).get("action_mask")
            if mask is not None:
                avail[0, i] = np.asarray(mask) != 0
        return stack_obs(obs_d, list(d.agents), d.obs_dim)[None], avail

    def _global_state(self) -> Optional[np.ndarray]:
        if self.dims.state_dim is None:
            return None
        return np.asarray(self.env.state(), dtype=np.float32).reshape(1, -1)

    def _reset(self, seed: Optional[int]) -> None:
        obs_d, infos = self.env.reset(seed=seed)
        self.obs, self.avail = self._arrays(obs_d, infos)
        self.state = self._global_state()

    def observe(self) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        return self.obs, self.avail, self.state

    def step(self, actions: np.ndarray) -> Step:
        agents = list(self.dims.agents)
        live = set(self.env.agents)
        obs_d, rewards, term_d, trunc_d, infos = self.env.step(
            {a: int(actions[0, i]) for i, a in enumerate(agents) if a in live})
        reward = team_reward(rewards, agents, self.how)
        terminated = any(bool(term_d.get(a, False)) for a in agents)
        truncated = not terminated and (not self.env.agents or all(bool(trunc_d.get(a, False)) for a in agents))
        next_obs, next_avail = self._arrays(obs_d, infos)
        data = {"next_obs": next_obs, "next_avail": next_avail, "reward": np.array([reward], np.float32),
                "terminated": np.array([terminated]), "truncated": np.array([truncated])}
        if self.dims.state_dim is not None:
            data["next_state"] = self._global_state()
        if terminated or truncated:
            self._reset(None)
        else:
            self.obs, self.avail, self.state = next_obs, next_avail, data.get("next_state")
        return Step(np.ones(1, dtype=bool), np.array([reward]), np.array([terminated or truncated]), data)


class TurnEnv:
    """A turn-based game's copies (``agents.turn_based.TurnCopies``: a step is one move of the learner in
    every copy, then its opponents' moves up to its next turn) as the Q-learner's vector.

    ``observe()``: the learner's rows (E, obs_dim) float32 (``rows``: its observation and seat id), its
    legal moves (E, A) bool and None (no global state). A step's ``data``: the transition's
    ``next_obs`` (the learner's rows at its next turn, or at the game's end its last observation),
    ``next_avail`` (its legal moves there; at the end, the env's last mask), ``reward`` (float32: what
    its seat was credited from its move up to its next turn, the opponents' turns included, as the
    turn-based machinery credits it), ``terminated`` and ``truncated``, each with the copy axis. A step
    that only restarts a finished game is not valid (never sent). So a transition goes from one of the
    learner's turns to its next, and its target bootstraps from the learner's own next turn (the
    opponents are the environment): docs/value_based.md, "Turn-based games"."""

    def __init__(self, copies: TurnCopies, rows: Any) -> None:
        self.copies, self.rows = copies, rows
        self.num_envs = copies.num_envs

    def observe(self) -> tuple[np.ndarray, np.ndarray, None]:
        return self.rows(self.copies), self.copies.mask > 0, None

    def outcome(self, e: int) -> dict[str, Any]:
        return self.copies.outcome(e)

    def step(self, actions: np.ndarray) -> Step:
        c = self.copies
        step = c.step(actions)
        E = self.num_envs
        reward, term, trunc = np.zeros(E, np.float32), np.zeros(E, dtype=bool), np.zeros(E, dtype=bool)
        next_avail = c.mask > 0
        for e, stepped in enumerate(step.data):
            if stepped is None:
                continue
            reward[e], term[e], ended = stepped
            if ended:
                trunc[e] = not term[e]
                next_avail[e] = c.games[e].final_mask > 0
        data = {"next_obs": self.rows(c), "next_avail": next_avail, "reward": reward, "terminated": term,
                "truncated": trunc}
        return Step(step.valid, step.reward, step.ended, data)


class FrozenGreedy:
    """How a self-play pool's frozen Q-network chooses a move (``agents.turn_based.Pool``'s ``sample``):
    epsilon-greedy over the legal moves' Q-values at the learner's final epsilon."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def sample(self, out: np.ndarray, rng: np.random.Generator, avail: Optional[np.ndarray] = None) -> np.ndarray:
        return epsilon_greedy(out, None if avail is None else avail > 0, self.epsilon, rng)


class SoloTeam:
    """A single-agent ``GymVector`` as a team of one agent (``QDims.solo``: a recurrent dqn), read like a
    ``TeamEnv``: ``observe()`` gives obs (E, 1, obs_dim), avail (E, 1, A) all True and no state; a step
    takes actions (E, 1) and its ``data`` are the transition's ``next_obs`` (the step's observation: the
    final one where an episode ended, the vector's autoreset being next-step), ``next_avail``, ``reward``
    (float32), ``terminated`` and ``truncated``, each with the copy axis. A step that only restarts a copy
    is not valid, as in the ``GymVector``."""

    def __init__(self, vec: GymVector, n_actions: int) -> None:
        self.vec, self.num_envs = vec, vec.num_envs
        self.avail = np.ones((vec.num_envs, 1, n_actions), dtype=bool)

    def observe(self) -> tuple[np.ndarray, np.ndarray, None]:
        return self.vec.obs[:, None], self.avail, None

    def step(self, actions: np.ndarray) -> Step:
        step = self.vec.step(np.asarray(actions).reshape(self.num_envs).astype(np.int64))
        rew, term, done = step.data
        term = np.asarray(term, dtype=bool)
        data = {"next_obs": self.vec.obs[:, None], "next_avail": self.avail,
                "reward": np.asarray(rew, dtype=np.float32), "terminated": term,
                "truncated": np.asarray(done, dtype=bool) & ~term}
        return Step(step.valid, step.reward, step.ended, data)


def q_vector(dims: QDims, env: Any, seed: Optional[int], how: str) -> Any:
    """The vector the acting loop steps (agents.rollout): the single-agent vector env as a ``GymVector``
    (next-step autoreset; a ``SoloTeam`` of it for a recurrent dqn), the multi-agent env as a ``TeamEnv``;
    reset now with ``seed``."""
    if dims.n_agents is None or dims.solo:
        vec = GymVector(env, seed)
        return SoloTeam(vec, dims.n_actions) if dims.solo else vec
    return TeamEnv(env, dims, seed, how)


def seen(vec: Any, observed: Any) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """(obs (E, [n_agents,] obs_dim), avail or None, state or None) of what ``vec.observe()`` gave."""
    if not isinstance(vec, GymVector):  # TeamEnv, TurnEnv
        return observed
    return observed.reshape(vec.num_envs, -1), None, None


def transition(vec: Any, obs: np.ndarray, avail: Optional[np.ndarray], state: Optional[np.ndarray],
               action: np.ndarray, step: Step) -> dict[str, np.ndarray]:
    """One step of every copy as the replay fields (E, ...), with ``valid`` (False: a step that only
    restarted a Gymnasium copy or a turn-based game, never sent) and ``truncated`` (for the n-step windows)."""
    if not isinstance(vec, GymVector):  # TeamEnv, TurnEnv: their steps' data are the replay fields
        out = {"obs": obs, "action": action.astype(np.int64), **step.data, "avail": avail}
        if state is not None:
            out["state"] = state
    else:
        rew, term, done = step.data
        term = np.asarray(term, dtype=bool)
        out = {"obs": obs, "action": action.astype(np.int64), "next_obs": vec.observe().reshape(vec.num_envs, -1),
               "reward": np.asarray(rew, dtype=np.float32), "terminated": term,
               "truncated": np.asarray(done, dtype=bool) & ~term}  # both: terminated (n_step_windows)
    out["valid"] = step.valid
    return out


def collect_chunk(worker: "QWorker", steps: int) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
    """``steps`` epsilon-greedy steps of every env copy with the worker's Q-network, by ``agents.rollout``.

    Returns the chunk as arrays (T, E, ...) (``transition``'s fields), the finished episodes' metric
    rows and the valid env steps taken. Epsilon at each step follows the schedule at the server's env
    step count (from the last parameters) plus the steps this worker took since; before
    ``replay.learning_starts`` every action is uniform."""
    hp, vec = worker.hp, worker.vec
    rows: dict[str, list[np.ndarray]] = {}
    eps = 1.0

    def act(observed: Any) -> np.ndarray:
        nonlocal eps
        now = worker.server_steps + worker.steps_since
        eps = 1.0 if now < hp.replay.learning_starts else hp.epsilon(now)
        obs, avail, _ = seen(vec, observed)
        return epsilon_greedy(worker.q_values(obs, worker.book.lengths == 0), avail, eps, worker.rng)

    def store(t: int, observed: Any, action: np.ndarray, step: Step) -> None:
        row = transition(vec, *seen(vec, observed), action, step)
        if hp.terminal_at_time_limit:  # a time limit ends the return there (the episode's end is kept)
            row["terminated"] = np.asarray(row["terminated"], dtype=bool) | np.asarray(row["truncated"], dtype=bool)
        for key, value in row.items():
            rows.setdefault(key, []).append(value)
        if worker.memory is not None:  # the state this step was acted from (after its reset)
            rows.setdefault("h0", []).append(worker.memory.before.reshape(vec.num_envs, worker.dims.n_agents, -1))
        worker.steps_since += int(step.valid.sum())

    outcome = getattr(vec, "outcome", None)  # a turn-based game's seat, opponent and result (TurnEnv)
    episodes, taken = rollout(vec, worker.book, steps, act, store,
                              row=lambda i: {"version": worker.version, "epsilon": eps,
                                             **(outcome(i) if outcome is not None else {})},
                              to_env=(lambda a: a) if worker.dims.n_agents else (lambda a: a.astype(np.int64)))
    return {k: np.stack(v) for k, v in rows.items()}, episodes, taken


class NStepAssembler:
    """Turns consecutive chunks into replay rows whose n-step windows are complete: a window cut by a
    chunk's end (at most the last n-1 steps) is held back and sent with the next chunk."""

    def __init__(self, gamma: float, n: int) -> None:
        self.gamma, self.n = gamma, n
        self.pending: Optional[dict[str, np.ndarray]] = None

    def rows(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        chunk = dict(chunk)
        chunk["sent"] = np.zeros(chunk["valid"].shape, dtype=bool)
        if self.pending is not None:
            chunk = {k: np.concatenate([self.pending[k], v]) for k, v in chunk.items()}
        win = n_step_windows(chunk["reward"], chunk["terminated"], chunk["truncated"], self.gamma, self.n)
        send = win.complete & chunk["valid"] & ~chunk["sent"]
        body = {k: v for k, v in chunk.items() if k not in ("valid", "sent")}
        rows = n_step_chunk(body, self.gamma, self.n)
        chunk["sent"] = chunk["sent"] | send
        keep = self.n - 1
        self.pending = {k: v[len(v) - keep:] for k, v in chunk.items()} if keep else None
        mask = send.reshape(-1)
        return {k: v[mask] for k, v in rows.items()}


class QMemory:
    """A recurrent Q-network's hidden state while acting: one row per (env copy, agent), zeroed before the
    step whose observation starts an episode, kept across chunks and across parameter pulls (R2D2's
    actors keep theirs; the state stored with each sequence is the one the acting reached)."""

    def __init__(self, net: nn.Module, rows: int) -> None:
        self.h = net.initial_state(rows)
        self.before = self.h.numpy().copy()  # the state the last step was acted from

    @torch.no_grad()
    def step(self, net: nn.Module, x: np.ndarray, reset: np.ndarray) -> np.ndarray:
        """Q-values (rows, A) of inputs x (rows, in); ``reset`` (rows,) zeroes those rows' state first."""
        h = torch.where(torch.from_numpy(np.asarray(reset, dtype=bool))[:, None], torch.zeros(()), self.h)
        self.before = h.numpy().copy()
        out, self.h = net.step(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), h)
        return out.numpy()


class SequenceAssembler:
    """Turns consecutive chunks of a team vector (``TeamEnv``, or ``SoloTeam``: its copies' steps that only
    restart an episode are not valid and are skipped) into R2D2's replay sequences
    (``agents.replay.sequence_windows``), each copy on its own: a window is sent once its ``sequence``
    steps are taken, or at its episode's end, and a window still open at a chunk's end waits for the next
    chunk; each is padded to the buffer's layout (``sequence_buffer``) with the state its first step was
    acted from. A chunk's windows come copy by copy, each copy's in the order they close."""

    def __init__(self, layout: EpisodeBuffer, overlap: int) -> None:
        self.layout, self.sequence, self.overlap = layout, layout.max_len - 1, overlap
        # per env copy: its episode's steps from ``first`` on, the next window's first step, the end of the
        # last window sent (grown to the copies of the first chunk)
        self.steps: list[list[dict[str, np.ndarray]]] = []
        self.first: list[int] = []
        self.start: list[int] = []
        self.covered: list[int] = []

    def _window(self, e: int, a: int, b: int) -> dict[str, np.ndarray]:
        steps = self.steps[e][a - self.first[e]:b - self.first[e]]
        out = {"h0": steps[0]["h0"]}
        for f in self.layout.step_fields:
            if f.name in ("obs", "avail", "state"):  # b - a + 1 observations: the last is the bootstrap one
                out[f.name] = np.stack([s[f.name] for s in steps] + [steps[-1]["next_" + f.name]])
            else:
                out[f.name] = np.stack([s[f.name] for s in steps] + [np.zeros_like(steps[0][f.name])])
        return out

    def rows(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The sequences completed by ``chunk`` (``collect_chunk``'s arrays (T, E, ...), with ``h0``), padded."""
        windows: list[dict[str, np.ndarray]] = []
        T, E = chunk["valid"].shape[:2]
        for _ in range(len(self.first), E):
            self.steps.append([])
            self.first.append(0)
            self.start.append(0)
            self.covered.append(0)
        for e in range(E):
            for t in range(T):
                if not chunk["valid"][t, e]:
                    continue
                self.steps[e].append({k: v[t, e] for k, v in chunk.items()})
                n = self.first[e] + len(self.steps[e])
                if n - self.start[e] == self.sequence:
                    windows.append(self._window(e, self.start[e], n))
                    self.covered[e] = n
                    self.start[e] += self.sequence - self.overlap
                    self.steps[e] = self.steps[e][self.start[e] - self.first[e]:]
                    self.first[e] = self.start[e]
                if chunk["terminated"][t, e] or chunk["truncated"][t, e]:
                    if n > self.covered[e]:
                        windows.append(self._window(e, self.start[e], n))
                    self.steps[e], self.first[e], self.start[e], self.covered[e] = [], 0, 0, 0
        if not windows:
            return {name: arr[:0].copy() for name, arr in self.layout.data.items()}
        lengths = [len(w["obs"]) for w in windows]
        longest = max(lengths)
        padded = {k: np.stack([np.concatenate([w[k], np.zeros((longest - len(w[k]), *w[k].shape[1:]), w[k].dtype)])
                               if k != "h0" else w[k] for w in windows]) for k in windows[0]}
        return self.layout.pad(padded, lengths)


# a QWorker's numpy MLP weights (``NumpyMLP.linear_weights``), keyed by its flat parameter buffer, with
# that buffer's ``writes`` when they were taken: a pull or an evaluator's load writes it (``load``), so a
# stale entry is seen, not cleared by hand. Outside the worker, so snapshots do not carry it (a resumed
# worker has a new buffer, and rebuilds it)
_ACTING_WEIGHTS: "weakref.WeakKeyDictionary[FlatParameters, tuple[int, Any]]" = weakref.WeakKeyDictionary()


class QWorker(PullingWorker):
    """An actor: epsilon-greedy chunks with the last pulled Q-network, pushed as replay rows; waits."""

    memory: Optional[QMemory] = None  # a recurrent Q-network's state (a class default: snapshots from before it)

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        self.cfg, self.hp = cfg, cfg.algorithm.params
        self.name = worker_name(index)
        self.seed = derive(cfg.run.seed, "worker", index)
        self.rng = np.random.default_rng(self.seed)
        env = make_q_env(cfg, self.seed)
        self.dims = describe(cfg, env)
        with seeded_init(cfg.run.seed):
            self.net = build_q_network(cfg, self.dims)
        self.resources = worker_heads({"critic": self.net}, cfg.run.seed, index)
        self.flat = FlatParameters(self.net)
        self.env = env
        self.vec = self.make_vector(env)
        self.book = EpisodeBook(self.vec.num_envs)
        if is_recurrent(self.net):  # acts in torch, carrying a state; pushes sequences (docs/value_based.md)
            self._np_net = None
            self.memory = QMemory(self.net, self.vec.num_envs * self.dims.n_agents)
            layout = sequence_buffer(self.dims, self.hp.replay, self.net.hidden_size)
            self.assembler: Any = SequenceAssembler(layout, self.hp.replay.sequence_overlap)
            self.names = [f.name for f in layout.fields]
        else:
            self._np_net = numpy_acting_head(self.net.net if isinstance(self.net, DuelingQ) else self.net)
            self.assembler = NStepAssembler(self.hp.gamma, self.hp.replay.n_step)
            self.names = [f.name for f in replay_fields(self.dims)]
        self.version = -1
        self.server_steps = 0
        self.steps_since = 0
        self.waiting = True
        self.seq = 0

    def make_vector(self, env: Any) -> Any:
        """The vector the acting loop steps (``q_vector``), reset with the worker's seed."""
        return q_vector(self.dims, env, self.seed, self.hp.team_reward)

    def q_values(self, obs: np.ndarray, starts: Optional[np.ndarray] = None,
                 memory: Optional[QMemory] = None) -> np.ndarray:
        """Q-values (N, [n_agents,] A) for acting (through the numpy twin when the head has one). A
        recurrent network steps ``memory`` (default the worker's), zeroing the state of the copies whose
        observation ``starts`` (N,) an episode."""
        x = with_agent_id(obs, self.dims.n_agents) if self.dims.agent_id else obs
        flat = x.reshape(-1, x.shape[-1])
        if self.memory is not None:
            reset = np.repeat(np.asarray(starts, dtype=bool), self.dims.n_agents)
            out = (memory or self.memory).step(self.net, flat, reset)
        elif self._np_net is not None:
            kept: tuple[Any, ...] = ()
            if isinstance(self._np_net, NumpyMLP):  # its float64 weights converted once per pull, not per act
                writes, weights = _ACTING_WEIGHTS.get(self.flat, (None, None))
                if writes != self.flat.writes:
                    weights = self._np_net.linear_weights()
                    _ACTING_WEIGHTS[self.flat] = (self.flat.writes, weights)
                kept = (weights,)
            out, _ = self._np_net.forward(flat.astype(np.float64), *kept)
            if isinstance(self.net, DuelingQ):
                d = out[:, 1:]
                out = out[:, :1] + d - d.mean(axis=1, keepdims=True)
        else:
            with torch.no_grad():
                out = self.net(torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))).numpy()
        return out.reshape(*x.shape[:-1], -1)

    def pulled(self, msg: Message) -> None:
        """The server's env step count rides with the parameters (the epsilon schedule's clock)."""
        self.server_steps = int(msg.info.get(ENV_STEPS, self.server_steps))
        self.steps_since = 0

    def step(self) -> Work:
        chunk, episodes, taken = collect_chunk(self, self.hp.chunk_steps)
        rows = self.assembler.rows(chunk)
        payload = {name: np.ascontiguousarray(rows[name]) for name in self.names}
        self.seq += 1
        self.waiting = True
        msg = Message(self.name, SERVER, TRANSITIONS, payload, base_version=self.version, seq=self.seq,
                      info={ENV_STEPS: taken})
        return Work([msg], env_steps=taken, episodes=episodes, resources=head_report(self.resources))

    def play_greedy(self, episodes: int, seed: int, progress: bool = False) -> list[float]:
        """Returns of the first ``episodes`` episodes with every agent's masked argmax of its Q-values
        (agents.rollout.evaluate), in this worker's env reset with ``seed``: a worker kept for evaluation
        (its training vector no longer matches the env after this)."""
        vec = q_vector(self.dims, self.env, seed, self.hp.team_reward)
        book = EpisodeBook(vec.num_envs)
        memory = QMemory(self.net, vec.num_envs * self.dims.n_agents) if self.memory is not None else None

        def greedy(observed: Any) -> np.ndarray:
            obs, avail, _ = seen(vec, observed)
            return masked_argmax(self.q_values(obs, book.lengths == 0, memory), avail)

        with eval_progress(episodes, progress) as bar:
            return evaluate(vec, episodes, greedy, bar=bar, book=book)

    def close(self) -> None:
        self.env.close()


class TurnQWorker(TurnPlay, QWorker):
    """dqn on a turn-based game (``agents.turn_based``): an actor that plays one seat of each of its
    ``envs_per_worker`` game copies (alternating between episodes) against the opponents of
    ``scenario.turns`` (the self-play pool of its past Q-networks, random, scripted), epsilon-greedy over
    its legal moves, and pushes its transitions from one of its turns to its next (``TurnEnv``) as
    replay rows with the legal-move masks at both ends. Its greedy moves (the masked argmax of Q) play
    the turn-based evaluation (``TurnPlay.play_greedy``: win, draw and loss rates per opponent)."""

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        self.index = index
        self.chunks = 0  # chunks collected: the self-play pool takes a snapshot every turns.refresh of them
        super().__init__(cfg, index)

    @property
    def turn_agents(self) -> list[str]:
        return list(self.dims.agents)

    def agent_ids(self) -> Optional[np.ndarray]:
        return np.eye(len(self.dims.agents), dtype=np.float32) if self.dims.seats else None

    def make_vector(self, env: Any) -> TurnEnv:
        """``envs_per_worker`` copies (``env`` the first, the others seeded from their own streams) and the
        opponents (``TurnPlay.start_turns``)."""
        self.envs = [env] + [make_q_env(self.cfg, derive(self.seed, "env_copy", k))
                             for k in range(1, self.hp.envs_per_worker)]
        self.copies = self.start_turns(self.pool_models)
        return TurnEnv(self.copies, self.turn_rows)

    def pool_models(self) -> tuple[nn.Module, None, FrozenGreedy]:
        """A Q-network of its own for the self-play pool's frozen policies, and how they choose."""
        with seeded_init(self.cfg.run.seed):
            net = build_q_network(self.cfg, self.dims)
        return net, None, FrozenGreedy(self.hp.epsilon_end)

    def greedy(self, vec: TurnCopies) -> np.ndarray:
        """The masked argmax of Q per copy (rows: ``turn_rows``)."""
        return masked_argmax(self.q_values(self.turn_rows(vec)), vec.mask > 0)

    def load_policy(self, models: dict[str, Any]) -> None:
        """Act with a checkpoint's Q-network (``QLearning.acting_policy``'s models)."""
        self.flat.load(torch.cat([p.detach().reshape(-1) for p in models["q"].parameters() if p.requires_grad])
                       .numpy())

    def step(self) -> Work:
        self.chunks += 1
        if self.pool is not None and self.chunks % self.turns.refresh == 0:
            self.pool.add(self.flat.numpy())
        return super().step()

    def close(self) -> None:
        for env in self.envs:
            env.close()


# ----------------------------------------------------------------------------- learner
class QLearner:
    """The online and target Q-networks (and mixers), Adam, and one TD update on a replayed batch."""

    reward_stats: Optional[RunningMeanStd] = None  # a class default: snapshots from before the key need nothing

    def __init__(self, hp: QConfig, kind: str, net: nn.Module, dims: QDims) -> None:
        self.hp, self.kind, self.dims = hp, kind, dims
        self.online = net
        self.target = copy.deepcopy(net)
        self.mixer: Optional[nn.Module] = None
        if kind == "vdn":
            self.mixer = VDNMixer()
        elif kind == "qmix":
            self.mixer = QMixer(dims.n_agents, dims.state_dim, hp.mixer_embed_dim, hp.hypernet_layers,
                                hp.hypernet_embed)
        self.target_mixer = copy.deepcopy(self.mixer) if self.mixer is not None else None
        for p in self.target.parameters():
            p.requires_grad_(False)
        if self.target_mixer is not None:
            for p in self.target_mixer.parameters():
                p.requires_grad_(False)
        self._init_update(None)
        self.updates = 0
        self.target_updates = 0
        self.reward_stats = RunningMeanStd() if hp.standardise_rewards else None

    def _named(self) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters, named ``online.*`` / ``mixer.*``, in the flat buffer's order."""
        out = [(f"online.{n}", p) for n, p in self.online.named_parameters() if p.requires_grad]
        if self.mixer is not None:
            out += [(f"mixer.{n}", p) for n, p in self.mixer.named_parameters() if p.requires_grad]
        return out

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters in torch.optim's group order (``param_names``); looked up each time,
        since a sim snapshot's FlatParameters seats new ones on the way back."""
        named = dict(self._named())
        return [named[n] for n in self.param_names]

    def grad_views(self) -> list[torch.Tensor]:
        """Each parameter's gradient (``params``' order) as a view of the flat gradient."""
        grad = self.flat.flat.grad
        made = self.__dict__.get("_grad_views")  # (the flat gradient, its views): built once per gradient
        if made is None or made[0] is not grad:  # buffer (a resumed snapshot re-seats a new one)
            made = self._grad_views = (grad, [grad[o:o + n].view(shape) for (_, _, o, n), shape
                                              in zip(self.slots, self.shapes)])
        return made[1]

    def _init_update(self, adam_state: Optional[dict[str, Any]]) -> None:
        """Seat the trainable parameters (online network, then mixer) as views of one flat buffer, their
        gradients too (``FlatParameters``), and give each run of consecutive parameters that share a
        learning rate (a circuit head's input_scale / output_scale: ``lr_input_scale`` /
        ``lr_output_scale``; the rest: ``lr``) a ``FlatAdam`` over its slice: torch.optim.Adam's arithmetic,
        element for element (tests/agents/test_q_fast.py), in a few whole-buffer ops instead of
        torch.optim's per-parameter bookkeeping. A DQN whose Q-network is a plain MLP also gets its
        hand-written pass (``numpy_heads.TorchMLP``: autograd's ops, without the engine).

        ``self.params`` lists the parameters in torch.optim's group order (lr, lr_input_scale,
        lr_output_scale), the order the checkpoint's ``optim.<i>.*`` keys number them by. ``adam_state``:
        a torch.optim.Adam ``state_dict()`` over parameters of that order to continue from (a sim snapshot
        of an older marl-q, ``marl_q.state_format``); None: fresh moments."""
        hp = self.hp
        modules = [m for m in (self.online, self.mixer) if m is not None]
        self.flat = FlatParameters(*modules)
        lr_key: dict[str, str] = {}
        for name, p in self._named():
            leaf = name.rsplit(".", 1)[-1]
            key = f"lr_{leaf}" if leaf in ("input_scale", "output_scale") else "lr"
            lr_key[name] = key if getattr(hp, key) is not None else "lr"
        runs: list[list[Any]] = []  # [start, end, lr key] of consecutive parameters of one learning rate
        where: dict[str, tuple[int, int, int, int]] = {}  # name -> (run, offset in the run, offset, size)
        offset = 0
        for name, p in self._named():  # the flat buffer's order (FlatParameters seats them in it)
            if not runs or runs[-1][2] != lr_key[name]:
                runs.append([offset, offset, lr_key[name]])
            where[name] = (len(runs) - 1, offset - runs[-1][0], offset, p.numel())
            offset += p.numel()
            runs[-1][1] = offset
        self.segments = [(start, end) for start, end, _ in runs]
        self.adams = [FlatAdam(self.flat.flat.data[start:end], getattr(hp, key), eps=hp.adam_eps)
                      for start, end, key in runs]
        self.base_lrs = [adam.lr for adam in self.adams]  # the configured rates ``scale_lr`` scales
        self.param_names = [n for key in ("lr", "lr_input_scale", "lr_output_scale") for n in lr_key if lr_key[n] == key]
        self.slots = [where[n] for n in self.param_names]
        named = dict(self._named())
        self.shapes = [named[n].shape for n in self.param_names]
        # a plain MLP's update (dqn, iql, and vdn / qmix with their mixers' own passes) runs its forward and
        # backward without autograd (same bits, less time)
        self._mlp = TorchMLP(self.online) if TorchMLP.supports(self.online) else None
        if adam_state is not None:
            self.load_adam_state({f"{i}.{k}": np.asarray(v.detach().numpy() if torch.is_tensor(v) else v)
                                  for i, st in adam_state["state"].items() for k, v in st.items()})

    def adam_state(self) -> dict[str, np.ndarray]:
        """The moments as torch.optim.Adam's state_dict numbers them: ``<i>.step`` (float32), ``<i>.exp_avg``,
        ``<i>.exp_avg_sq`` per parameter i of ``self.params``; empty before the first step (as torch's)."""
        if not self.adams or not self.adams[0].steps:
            return {}
        out = {}
        for i, ((run, offset, _, n), shape) in enumerate(zip(self.slots, self.shapes)):
            adam = self.adams[run]
            out[f"{i}.step"] = np.array(float(adam.steps), dtype=np.float32)
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"{i}.{key}"] = getattr(adam, key)[offset:offset + n].reshape(shape).numpy().copy()
        return out

    def load_adam_state(self, state: dict[str, np.ndarray]) -> None:
        """Take back ``adam_state()``'s arrays (none: fresh moments at step 0)."""
        for adam in self.adams:
            adam.load_state_dict({"steps": torch.tensor(0), "exp_avg": torch.zeros(()), "exp_avg_sq": torch.zeros(())})
        for i, (run, offset, _, n) in enumerate(self.slots):
            adam = self.adams[run]
            if f"{i}.step" in state:
                adam.steps = int(float(state[f"{i}.step"]))
            for key in ("exp_avg", "exp_avg_sq"):
                if f"{i}.{key}" in state:
                    getattr(adam, key)[offset:offset + n].copy_(torch.from_numpy(np.array(state[f"{i}.{key}"])).reshape(-1))

    def scale_lr(self, factor: float) -> None:
        """Set every Adam's rate to its configured one times ``factor`` (a schedule's, ``lr_factor``)."""
        for adam, base in zip(self.adams, self.base_lrs):
            adam.lr = base * factor

    def _q(self, net: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        return q_forward(net, obs, self.dims, self._agent_id())

    def sequence_loss(self, batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The TD loss of a batch of replayed sequences (``sequence_buffer``'s rows, B of them, L + 1
        observations each) for a recurrent Q-network (R2D2, Kapturowski et al. 2019):

        - the online and the target network each unroll from the stored state ``h0``: the first
          b = ``replay.burn_in`` observations without gradient (they only warm the state), then the rest;
        - the loss covers steps t = b .. L-1: Q(o_t, u_t) (mixed for vdn/qmix) against
          y_t = r_t + gamma (1 - terminated_t) V(t + 1), V from the target unroll at t + 1 (Double DQN: at
          the online unroll's masked argmax), masked by the action masks at t + 1;
        - steps past a sequence's end (``mask`` False at t + 1) are padding and weigh 0.

        Returns the loss, the TD errors (B, L - b[, n_agents]) and the loss mask of the same shape."""
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        hp, n, b = self.hp, self.dims.n_agents, self.hp.replay.burn_in
        B, L1 = t["mask"].shape
        x = with_agent_id(t["obs"], n) if self.dims.agent_id else t["obs"]  # (B, L+1, n, in)
        x = x.transpose(0, 1).reshape(L1, B * n, -1)
        h0 = t["h0"].reshape(B * n, -1)

        def unroll(net: nn.Module) -> torch.Tensor:
            h = h0
            if b:
                with torch.no_grad():
                    _, h = net.unroll(x[:b], h0)
            q, _ = net.unroll(x[b:], h)
            return q.reshape(L1 - b, B, n, -1).transpose(0, 1)  # (B, L+1-b, n, A)

        q = unroll(self.online)
        with torch.no_grad():
            q_next = unroll(self.target)[:, 1:]
        steps = slice(b, L1 - 1)  # the transitions in the loss: t = b .. L-1; their bootstrap at t + 1
        live = t["mask"][:, b + 1:]
        term = t["terminated"][:, steps]
        next_avail = t["avail"][:, b + 1:] | ~live[..., None, None]  # padding: any action (weighs 0)
        chosen = q_taken(q[:, :-1], t["action"][:, steps])
        v_next = bootstrap_values(q_next, next_avail, q[:, 1:].detach() if hp.double else None, term)
        pred = chosen
        if self.mixer is not None:
            with torch.no_grad():
                v_next = self.target_mixer(v_next, t["state"][:, b + 1:] if "state" in t else None)
            pred = self.mixer(chosen, t["state"][:, steps] if "state" in t else None)
        reward = self.rewards(t["reward"][:, steps], live)
        target = td_target(reward, torch.full_like(reward, hp.gamma), term, v_next)
        mask = live.to(pred.dtype)
        if pred.ndim > mask.ndim:  # IQL: every agent's step
            mask = mask[..., None].expand_as(pred)
        loss, td = td_loss(pred, target, None, hp.loss, hp.huber_delta, mask=mask)
        return loss, td, mask

    def rewards(self, reward: torch.Tensor, live: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The batch's rewards as the TD target takes them: as stored, or with ``standardise_rewards``
        standardised by the running statistics after they took in this batch's rewards (those of
        ``live`` steps only: a sequence's padding is not a reward)."""
        if self.reward_stats is None:
            return reward
        raw = reward.numpy()
        self.reward_stats.update(raw if live is None else raw[live.numpy()])
        return torch.from_numpy(self.reward_stats.standardise(raw))

    def _agent_id(self) -> bool:
        return self.dims.agent_id and self.dims.n_agents is not None

    def _q_pass(self, mlp: TorchMLP, obs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``_q``'s Q-values through a ``TorchMLP`` (no autograd), and its cache for the backward."""
        x = q_inputs(obs, self.dims, self._agent_id())
        q, cache = mlp.forward(x.reshape(-1, x.shape[-1]))
        return q.reshape(*x.shape[:-1], -1), cache

    def _target_mlp(self) -> TorchMLP:
        """The target network's ``TorchMLP`` (its layers are the target's modules, so a target update or a
        resumed snapshot's re-seated parameters are what it reads); made on first use."""
        mlp = self.__dict__.get("_target_twin")
        if mlp is None:
            mlp = self._target_twin = TorchMLP(self.target)
        return mlp

    def update(self, batch: dict[str, np.ndarray], weights: Optional[np.ndarray] = None
               ) -> tuple[float, np.ndarray]:
        """One gradient step; the loss and each row's |TD error| (mean over agents for IQL; for sequences
        the mean over the row's steps in the loss)."""
        if "mask" in batch:
            loss, td, mask = self.sequence_loss(batch)
            self._descend(loss)
            td_abs = (td.abs() * mask).reshape(len(mask), -1).sum(1) / mask.reshape(len(mask), -1).sum(1).clamp(min=1)
            return float(loss.detach()), td_abs.numpy().astype(np.float64)
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        hand = self._mlp is not None  # the networks' forwards and backward without autograd's modules
        if hand:
            q, cache = self._q_pass(self._mlp, t["obs"])
            q_next = self._q_pass(self._target_mlp(), t["next_obs"])[0]
            q_online_next = self._q_pass(self._mlp, t["next_obs"])[0] if self.hp.double else None
        else:
            q = self._q(self.online, t["obs"])
            with torch.no_grad():
                q_next = self._q(self.target, t["next_obs"])
                q_online_next = self._q(self.online, t["next_obs"]) if self.hp.double else None
        chosen = q_taken(q, t["action"])
        with torch.no_grad():
            v_next = bootstrap_values(q_next, t.get("next_avail"), q_online_next, t["terminated"])
            if self.mixer is not None:
                v_next = (self.target_mixer.forward_cached(v_next, t.get("next_state"))[0] if hand
                          else self.target_mixer(v_next, t.get("next_state")))
        mixed = None
        if self.mixer is None:
            pred = chosen
        elif hand:
            pred, mixed = self.mixer.forward_cached(chosen, t.get("state"))
        else:
            pred = self.mixer(chosen, t.get("state"))
        target = td_target(self.rewards(t["reward"]), t["discount"], t["terminated"], v_next)
        w = torch.from_numpy(weights) if weights is not None else None
        loss, td = td_loss(pred, target, w, self.hp.loss, self.hp.huber_delta)
        if not hand:
            self._descend(loss)
        else:  # autograd's backward by hand: the loss's, the mixer's, gather's (scatter into zeros), the MLP's
            g = td_loss_grad(pred, target, w, self.hp.loss, self.hp.huber_delta)
            if mixed is not None:
                g = self.mixer.backward(mixed, g)
            action = t["action"].long().unsqueeze(-1)
            g_q = torch.zeros_like(q).scatter_add_(-1, action, g.unsqueeze(-1))
            self._mlp.backward(cache, g_q.reshape(-1, g_q.shape[-1]))
            self._step()
        td_abs = td.abs()
        if td_abs.ndim > 1:
            td_abs = td_abs.mean(-1)
        return float(loss.detach()), td_abs.numpy().astype(np.float64)

    def _descend(self, loss: torch.Tensor) -> None:
        self.flat.zero_grad()
        loss.backward()
        self._step()

    def _step(self) -> None:
        """Clip the flat gradient and step Adam."""
        grad = self.flat.flat.grad
        if self.hp.grad_clip is not None:
            clip_flat_grad(grad, self.grad_views(), self.hp.grad_clip)
        # Adam's first moment of a parameter whose gradient stays zero (a dead ReLU unit) decays through the
        # subnormals, which cost the CPU ~100 cycles each: read and written as zero in Adam's step alone
        # (the forward and backward keep them, so the losses keep their bits)
        with flush_denormals():
            for (start, end), adam in zip(self.segments, self.adams):
                adam.step(grad[start:end])
        self.updates += 1

    def update_target(self) -> None:
        """Hard copy (tau 1) or Polyak averaging of the online networks into the targets."""
        pairs = [(self.online, self.target)]
        if self.mixer is not None:
            pairs.append((self.mixer, self.target_mixer))
        with torch.no_grad():
            for online, target in pairs:
                for p_t, p in zip(target.parameters(), online.parameters()):
                    if self.hp.tau == 1.0:
                        p_t.copy_(p)
                    else:
                        p_t.mul_(1.0 - self.hp.tau).add_(p, alpha=self.hp.tau)
        self.target_updates += 1

    def modules(self) -> dict[str, nn.Module]:
        out = {"online": self.online, "target": self.target}
        if self.mixer is not None and any(True for _ in self.mixer.parameters()):
            out.update(mixer=self.mixer, target_mixer=self.target_mixer)
        return out


# ----------------------------------------------------------------------------- service
def transitions_spec(fields: list[Field]) -> MessageSpec:
    """A pushed chunk: one array per replay field, any number of rows."""
    return MessageSpec({f.name: ((None, *f.shape), np.dtype(f.dtype).name) for f in fields})


def transitions_problem(payload: dict[str, np.ndarray], info: dict[str, Any], dims: QDims) -> Optional[str]:
    """Why a chunk (shape-checked by the core) cannot go into the buffer, or None. A chunk of sequences
    (``mask``: ``sequence_buffer``'s rows) is checked on the steps its masks say it has."""
    rows = {len(v) for v in payload.values()}
    if len(rows) != 1:
        return f"rows: fields differ in length {sorted(rows)}"
    steps = info.get(ENV_STEPS)
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        return f"{ENV_STEPS}: info must carry the chunk's env steps as an integer >= 0, got {steps!r}"
    if "mask" in payload:
        mask = payload["mask"]
        count = mask.sum(1)
        if len(mask) and (count.min() < 2 or (mask != (np.arange(mask.shape[1]) < count[:, None])).any()):
            return "mask: each sequence's observations must be a prefix of at least two"
        real = mask[:, 1:]  # step t is real when its bootstrap observation t + 1 is
        payload = {"action": payload["action"][:, :-1][real], "avail": payload["avail"][:, :-1][real]}
    action = payload["action"]
    if action.size and (action.min() < 0 or action.max() >= dims.n_actions):
        return f"action: outside 0..{dims.n_actions - 1}"
    if "avail" in payload and action.size:
        if not np.take_along_axis(payload["avail"], action[..., None], axis=-1).all():
            return "action: an unavailable action (action_mask 0) was taken"
    disc = payload.get("discount", np.zeros(0))
    if disc.size and (disc.min() < 0 or disc.max() > 1):
        return "discount: must lie in [0, 1]"
    return None


class ReplayService(Service):
    """Server side: the replay buffer, the learner, and the parameters workers pull."""

    def __init__(self, cfg: ExperimentConfig, dims: QDims, learner: QLearner) -> None:
        self.cfg, self.hp, self.dims, self.learner = cfg, cfg.algorithm.params, dims, learner
        r = self.hp.replay
        hidden = learner.online.hidden_size if is_recurrent(learner.online) else None  # sequences, one per row
        self.buffer = replay_buffer(r, dims, r.capacity, hidden)
        self.buffer.snapshot_max_bytes = r.snapshot_max_bytes
        self.specs = {TRANSITIONS: transitions_spec(list(self.buffer.fields))}
        self.env_steps = 0
        self.credit = 0.0  # gradient updates owed by the replay ratio
        self.accepted = 0
        self.rejected = 0
        self._snapshot: Optional[np.ndarray] = None

    def params_vector(self) -> np.ndarray:
        if self._snapshot is None:
            trainable = [p.detach().reshape(-1) for p in self.learner.online.parameters() if p.requires_grad]
            self._snapshot = torch.cat(trainable).numpy().astype(np.float32)
        return self._snapshot

    def _params(self, worker: str, version: int) -> Message:
        return Message(SERVER, worker, PARAMS, {PARAMS: self.params_vector()}, base_version=version,
                       info={ENV_STEPS: self.env_steps})

    def hello(self, worker: str, version: int) -> list[Message]:
        return [self._params(worker, version)]

    def handle(self, msg: Message, ctx: Context) -> Outcome:
        problem = transitions_problem(msg.payload, msg.info, self.dims)
        if problem is not None:
            self.rejected += 1
            return Outcome(False, [self._params(msg.src, ctx.version)], accepted=False, reason=problem)
        self.accepted += 1
        steps = int(msg.info[ENV_STEPS])
        if len(msg.payload["action"]):
            if isinstance(self.buffer, EpisodeBuffer):
                self.buffer.add_padded(msg.payload)
            else:
                self.buffer.add(msg.payload)
        before, self.env_steps = self.env_steps, self.env_steps + steps
        every = self.hp.target_update_every
        for _ in range(self.env_steps // every - before // every):
            self.learner.update_target()
        if self.env_steps >= self.hp.replay.learning_starts and len(self.buffer):
            self.credit += self.hp.replay.ratio * steps
        n = int(self.credit)
        self.credit -= n
        train = self._learn(n, ctx) if n else []
        version = ctx.next_version if n else ctx.version
        return Outcome(bool(n), [self._params(msg.src, version)], train=train)

    def _learn(self, n: int, ctx: Context) -> list[dict[str, Any]]:
        """n gradient updates on batches drawn with the server's generator; one train.csv row (mean loss)."""
        r = self.hp.replay
        if self.hp.lr_schedule != "constant":  # the rate at the run's progress, for these n updates
            self.learner.scale_lr(lr_factor(self.hp.lr_schedule, ctx.progress))
        losses = []
        for _ in range(n):
            if r.prioritized:
                beta = r.beta_start + min(1.0, ctx.progress) * (r.beta_end - r.beta_start)
                rows, batch, weights = self.buffer.sample(r.batch_size, ctx.rng, beta)
                loss, td = self.learner.update(batch, weights)
                self.buffer.update_priorities(rows, td)
            else:
                _, batch = self.buffer.sample(r.batch_size, ctx.rng)
                loss, _ = self.learner.update(batch)
            losses.append(loss)
        self._snapshot = None
        return [diagnostics(None, float(np.mean(losses)))]

    def updates(self) -> int:
        return self.learner.updates

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"updates": np.array(self.learner.updates), "target_updates": np.array(self.learner.target_updates),
               "env_steps": np.array(self.env_steps), "credit": np.array(self.credit)}
        for prefix, module in self.learner.modules().items():
            for key, value in module.state_dict().items():
                out[f"{prefix}.{key}"] = value.detach().numpy().copy()
        for key, value in self.learner.adam_state().items():
            out[f"optim.{key}"] = value
        for key, value in self.buffer.state_dict().items():
            out[f"replay.{key}"] = np.array(value, copy=True)
        if self.learner.reward_stats is not None:
            for key, value in self.learner.reward_stats.state_dict().items():
                out[f"reward_stats.{key}"] = value
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for prefix, module in self.learner.modules().items():
            own = {k[len(prefix) + 1:]: torch.from_numpy(np.array(v)) for k, v in state.items()
                   if k.startswith(prefix + ".")}
            module.load_state_dict(own)
        self.learner.load_adam_state({k[6:]: v for k, v in state.items() if k.startswith("optim.")})
        self.buffer.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("replay.")})
        self.learner.updates = int(state["updates"])
        self.learner.target_updates = int(state["target_updates"])
        self.env_steps = int(state["env_steps"])
        self.credit = float(state["credit"])
        if self.learner.reward_stats is not None:
            stats = {k.removeprefix("reward_stats."): v for k, v in state.items() if k.startswith("reward_stats.")}
            if not stats:
                raise CheckpointError("this checkpoint's replay service has no reward statistics (reward_stats.*), "
                                      "but the run sets algorithm.standardise_rewards: true; resume it without")
            self.learner.reward_stats.load_state_dict(stats)
        self._snapshot = None

    def summary(self) -> dict[str, Any]:
        return {"transitions_inserted": int(self.buffer.inserted), "replay_size": len(self.buffer),
                "replay_bytes_per_transition": self.buffer.bytes_per_transition,
                "chunks_accepted": self.accepted, "chunks_rejected": self.rejected,
                "learning_updates": self.learner.updates, "target_updates": self.learner.target_updates}


# ----------------------------------------------------------------------------- algorithm
def check_recurrent(cfg: ExperimentConfig, dims: QDims) -> None:
    """A recurrent Q-network's settings, each refused with a ConfigError naming the key: not on a turn-based
    game, sequence replay (``replay.sequence``) with one-step targets, no prioritized replay, no dueling head."""
    hp, r = cfg.algorithm.params, cfg.algorithm.params.replay
    if getattr(cfg.critic.params, "recurrent", None) is None:
        if r.sequence is not None:
            raise ConfigError("algorithm.replay.sequence: sequence replay is for a recurrent Q-network "
                              "(critic.recurrent: gru); feed-forward learners replay transitions")
        return
    if dims.turns:
        raise ConfigError(f"critic.recurrent: {cfg.algorithm.name} on a turn-based game has no recurrent Q-network "
                          "(its transitions go from one of its turns to the next); use a feed-forward critic")
    if r.sequence is None:
        raise ConfigError("algorithm.replay.sequence: a recurrent Q-network (critic.recurrent: gru) replays "
                          "sequences; give their length in steps (an episode no longer than it is one sequence)")
    if r.prioritized:
        raise ConfigError("algorithm.replay.prioritized: not supported with a recurrent Q-network "
                          "(critic.recurrent: gru); sequences are replayed uniformly")
    if r.n_step != 1:
        raise ConfigError(f"algorithm.replay.n_step: a recurrent Q-network bootstraps one step on within its "
                          f"sequence (n_step: 1), got {r.n_step}")
    if hp.dueling:
        raise ConfigError("algorithm.dueling: not supported with a recurrent Q-network (critic.recurrent: gru)")


class QLearning(Algorithm):
    """dqn | iql | vdn | qmix: the algorithm name picks the env kind and the mixer."""

    metric_fields = ["return", "length", "version", "epsilon"]
    recurrent_policies = ("critic",)  # critic.recurrent: gru, the Q-network (check_recurrent)

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """At load time: hogwild aggregation, a discrete env of the right kind, a head that fits."""
        if cfg.server.aggregation != "hogwild":
            raise ConfigError(f"server.aggregation: {cfg.server.aggregation!r} is not supported by the replay "
                              "service (choices: hogwild)")
        dims = described(cfg, make_q_env, describe)
        check_recurrent(cfg, dims)
        if dims.turns:
            turns = TurnsConfig.from_dict(cfg.scenario.params.turns)
            if turns.critic_opponent:
                raise ConfigError("scenario.turns.critic_opponent: for the actor-critics (their critic reads the "
                                  f"opponent, their actor does not); {cfg.algorithm.name}'s Q-network is what acts")
            if turns.symmetries != "none":
                raise ConfigError(f"scenario.turns.symmetries: not supported by {cfg.algorithm.name} (ippo and ia2c "
                                  "train on board symmetries); use none")
        with seeded_init(cfg.run.seed):  # a build only to check it: the caller's torch stream stays
            build_q_network(cfg, dims)

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        self.dims = described(cfg, make_q_env, describe)
        self.service: Optional[ReplayService] = None
        if self.dims.turns:  # each episode's seat, opponent and outcome (agents/turn_based.py)
            self.metric_fields = self.metric_fields + list(TURN_FIELDS)

    def make_service(self) -> ReplayService:
        with seeded_init(self.cfg.run.seed):  # the mixers' draws follow the network's, as they did
            learner = QLearner(self.cfg.algorithm.params, self.cfg.algorithm.name, build_q_network(self.cfg, self.dims),
                               self.dims)
        self.service = ReplayService(self.cfg, self.dims, learner)
        return self.service

    def make_worker(self, index: int) -> QWorker:
        return (TurnQWorker if self.dims.turns else QWorker)(self.cfg, index)

    def acting_policy(self, state: dict[str, np.ndarray]) -> ActingPolicy:
        """The greedy policy of the checkpoint's online Q-network: its Q-values are the logits (the most
        likely action is the argmax); one network for every agent."""
        if getattr(self.cfg.critic.params, "recurrent", None) is not None:
            from marl_q.errors import UserError
            raise UserError(f"algorithm {self.cfg.algorithm.name!r}: a recurrent Q-network (critic.recurrent) has no "
                            "stateless acting policy to load from a checkpoint (docs/value_based.md)")
        service = self.make_service()
        service.load_state_dict(state)
        dims, net = self.dims, service.learner.online
        agent_id = dims.agent_id and dims.n_agents is not None

        @torch.no_grad()
        def logits(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if dims.n_agents is None:
                names = sorted(obs)
                rows = [np.asarray(obs[n], np.float32).reshape(-1) for n in names]
                if dims.seats:  # a turn-based game's seat, as the worker's rows carry it
                    seat = np.eye(dims.seats, dtype=np.float32)
                    rows = [np.concatenate([r, seat[dims.agents.index(n)]]) for r, n in zip(rows, names)]
                x = torch.from_numpy(np.stack(rows))
                return dict(zip(names, q_forward(net, x, dims, False).numpy()))
            x = np.zeros((1, dims.n_agents, dims.obs_dim), np.float32)
            for i, a in enumerate(dims.agents):
                if a in obs:
                    x[0, i] = np.asarray(obs[a], np.float32).reshape(-1)
            q = q_forward(net, torch.from_numpy(x), dims, agent_id).numpy()[0]
            return {a: q[i] for i, a in enumerate(dims.agents) if a in obs}

        return ActingPolicy(logits, agents=list(dims.agents) or None, models={"q": net},
                            info={"env_steps": service.env_steps})

    def evaluate_returns(self, episodes: int, seed: int) -> list[float]:
        """``episodes`` greedy episodes (the masked argmax of Q) of the server's current online network
        (marl_q.evaluation), played by a worker of its own through the acting path (``QWorker.play_greedy``)
        in its env reset with ``seed``; the run's workers, buffer and generators are left alone."""
        if getattr(self, "_evaluator", None) is None:
            self._evaluator = self.make_worker(0)
        worker = self._evaluator
        worker.flat.load(self.service.params_vector())
        return worker.play_greedy(episodes, seed, self.cfg.run.progress)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out = episode_summary(metrics, self.cfg.run.solve_return, self.cfg.run.solve_window)
        if self.service is not None:
            out["q_params"] = count_params(self.service.learner.online)
        return out


for _name, _help in (
        ("dqn", "DQN on a single-agent env or one seat of a turn-based game: replay on the server, Double DQN, "
                "dueling, target hard or Polyak"),
        ("iql", "independent Q-learning: one shared Q-network (agent id), each agent its own TD target"),
        ("vdn", "VDN: the sum of the agents' Qs trained on the team reward, replay on the server"),
        ("qmix", "QMIX: a monotonic hypernetwork mixer of the agents' Qs on the global state")):
    ALGORITHMS.add(_name, QLearning, config=QConfig, help=_help)
