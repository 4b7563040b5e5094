"""Turn-based (AEC) PettingZoo games, played natively: one agent acts per turn.

PettingZoo's classic games (``tictactoe_v3``, ``connect_four_v3``, ...) are AEC environments that
PettingZoo refuses to convert to parallel ones (their ``metadata["is_parallelizable"]`` is False).
``scenario.name: pettingzoo`` reads such an env as a turn-based game (scenario kind ``aec``) instead
of converting it; the learners that take turns (ippo, ia2c: agents/turn_based.py) drive it.

What the game does (``TurnGame``):

- **Turns.** Only the agent whose turn it is (``agent_selection``) acts. A learner plays one seat
  (one of ``possible_agents``) per episode; the other seats are opponents (``Opponent``), whose
  moves the game plays between two of the learner's turns (``advance``).
- **Reward credit.** Every agent is credited what PettingZoo's ``last()`` gives it at its turn: the
  reward it earned since it last acted, including rewards that arrived on the other agents' turns
  (tic-tac-toe's -1 for the move that let the opponent win arrives on the opponent's turn). At the
  game's end every agent's last turn (PettingZoo's dead step) is read, so each is credited what it
  earned, and the episode ends for all.
- **Observations and masks.** PettingZoo classic's ``{"observation", "action_mask"}`` dict is read as
  the observation (flattened to float32) and the mask of legal actions; without such a dict the mask
  is ``infos[agent]["action_mask"]`` when present, else every action.
- **Outcome.** Win, draw or loss of a seat: its episode total against the best of the others' totals.

Opponents (``scenario.turns``, ``TurnsConfig``; each training episode draws one, uniformly or with
``weights``): ``self_play`` (the learner's own past policies, a
pool of frozen copies; agents/turn_based.py), ``random`` (a uniform legal move) or a scripted
callable given by import path ``package.module:callable``, called as ``callable(observation,
action_mask, rng) -> action`` (observation as the env gives it, e.g. tic-tac-toe's (3, 3, 2) planes,
``rng`` a ``numpy.random.Generator``). ``scenarios.tictactoe_minimax:minimax`` is one.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from scenarios.board_symmetry import KINDS as SYMMETRY_KINDS

SELF_PLAY, RANDOM = "self_play", "random"
# the metrics columns of a turn-based episode: the learner's seat (its index in possible_agents),
# the opponent's name, the outcome as three 0/1 columns (their means are the rates), illegal moves sampled
TURN_FIELDS = ("seat", "opponent", "win", "draw", "loss", "illegal")


def turn_based_env(env: Any) -> bool:
    """Whether ``env`` is an AEC env that PettingZoo will not convert to a parallel one (a turn-based game)."""
    return isinstance(env, AECEnv) and not (getattr(env, "metadata", None) or {}).get("is_parallelizable", False)


# ----------------------------------------------------------------------------- opponents
def opponent_name(spec: str) -> str:
    """The name an opponent's columns carry: ``self_play``, ``random``, or a scripted callable's attribute."""
    return spec.rpartition(":")[2].rpartition(".")[2] if ":" in spec else spec


def load_scripted(spec: str, key: str) -> Callable[..., Any]:
    """The callable an import path ``package.module:callable`` names; a ValueError naming ``key`` and
    the path when it does not import or is no callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: {spec!r} is neither {SELF_PLAY!r}, {RANDOM!r} nor an import path "
                         "package.module:callable")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}: cannot import module {module_name!r} of {spec!r} ({' '.join(str(exc).split())})") \
            from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}: {spec!r} is not callable (a {type(obj).__name__})")
    return obj


class Opponent:
    """A seat's player that is not the learner: ``move(agent, observation, mask, flat) -> action``."""

    name = ""

    def move(self, agent: str, observation: Any, mask: np.ndarray, flat: np.ndarray) -> int:
        raise NotImplementedError


class RandomOpponent(Opponent):
    """A uniform draw among the legal actions, from ``rng`` (one ``integers`` draw a move)."""

    name = RANDOM

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def move(self, agent: str, observation: Any, mask: np.ndarray, flat: np.ndarray) -> int:
        legal = np.flatnonzero(mask > 0)
        return int(legal[self.rng.integers(len(legal))])


class ScriptedOpponent(Opponent):
    """``callable(observation, action_mask, rng)`` given by import path (resolved again after unpickling)."""

    def __init__(self, spec: str, rng: np.random.Generator) -> None:
        self.spec, self.rng, self.name = spec, rng, opponent_name(spec)
        self.fn = load_scripted(spec, "scenario.turns")

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "rng": self.rng, "name": self.name}

    def move(self, agent: str, observation: Any, mask: np.ndarray, flat: np.ndarray) -> int:
        fn = self.__dict__.get("fn")
        if fn is None:  # unpickled: the function is derived from its import path, never saved
            fn = self.fn = load_scripted(self.spec, "scenario.turns")
        return int(fn(observation, mask, self.rng))


# ----------------------------------------------------------------------------- config
@dataclass
class TurnsConfig:
    """``scenario.turns`` of a turn-based game (module docstring)."""

    opponents: list[str] = field(default_factory=lambda: [SELF_PLAY])  # each training episode draws one
    pool_size: int = 8  # self_play: the frozen past policies kept (the newest)
    refresh: int = 10  # self_play: the learner's rollouts between two snapshots into the pool
    eval_opponents: list[str] = field(default_factory=lambda: [RANDOM])  # evaluation plays each
    # training: each episode's opponent drawn with these relative weights, one per ``opponents`` entry
    # (None: uniformly, one ``integers`` draw; else one ``choice`` draw with the normalised weights)
    weights: Optional[list[float]] = None
    # the critic also reads a one-hot of the episode's training opponent (its index in ``opponents``);
    # the actor does not (it never knows whom it plays). Without it V(s) averages over the opponents,
    # and an episode's advantages say more about which opponent was drawn than about the moves.
    critic_opponent: bool = False
    # training on every rollout transition once per board symmetry (scenarios/board_symmetry.py):
    # none, dihedral (a square board whose moves are its cells) or mirror (moves are columns)
    symmetries: str = "none"

    @classmethod
    def from_dict(cls, raw: Optional[dict[str, Any]]) -> "TurnsConfig":
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"turns: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
        for key in ("opponents", "eval_opponents"):
            if key in raw and isinstance(raw[key], str):
                raw[key] = [raw[key]]
        cfg = cls(**raw)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for key in ("pool_size", "refresh"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"turns.{key}: must be a positive integer, got {value!r}")
        for key, allowed in (("opponents", (SELF_PLAY, RANDOM)), ("eval_opponents", (RANDOM,))):
            specs = getattr(self, key)
            if not isinstance(specs, list) or not specs or not all(isinstance(s, str) for s in specs):
                raise ValueError(f"turns.{key}: a non-empty list of {', '.join(allowed)} or import paths, got {specs!r}")
            names = [opponent_name(s) for s in specs]
            if len(set(names)) != len(names):
                raise ValueError(f"turns.{key}: two opponents share a name ({', '.join(names)})")
            for spec in specs:
                if spec not in allowed:
                    if spec == SELF_PLAY:
                        raise ValueError(f"turns.{key}: {SELF_PLAY} is a training opponent; evaluation plays fixed ones "
                                         f"({RANDOM} or import paths)")
                    load_scripted(spec, f"turns.{key}")

        if not isinstance(self.critic_opponent, bool):
            raise ValueError(f"turns.critic_opponent: true or false, got {self.critic_opponent!r}")
        if self.symmetries not in SYMMETRY_KINDS:
            raise ValueError(f"turns.symmetries: one of {', '.join(SYMMETRY_KINDS)}, got {self.symmetries!r}")
        if self.weights is not None:
            w = self.weights
            if (not isinstance(w, list) or len(w) != len(self.opponents)
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w)
                    or not all(np.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0):
                raise ValueError(f"turns.weights: one non-negative number per opponent ({len(self.opponents)}: "
                                 f"{', '.join(self.opponents)}), not all zero, got {w!r}")

    def critic_columns(self) -> int:
        """The columns the critic's input gains (``critic_opponent``: one per training opponent)."""
        return len(self.opponents) if self.critic_opponent else 0

    def probabilities(self) -> Optional[np.ndarray]:
        """Each training opponent's probability of being drawn for an episode (None: uniform)."""
        if self.weights is None:
            return None
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()

    def draw(self, rng: np.random.Generator) -> str:
        """A training episode's opponent spec: one of ``opponents``, uniformly or by ``weights``."""
        specs, p = self.opponents, self.probabilities()
        if p is not None:
            return specs[int(rng.choice(len(specs), p=p))]
        return specs[int(rng.integers(len(specs)))] if len(specs) > 1 else specs[0]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- the game
def _observation_part(agent: str, space: spaces.Space) -> spaces.Space:
    """The observation of a classic game's {"observation", "action_mask"} dict, else the space itself."""
    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        space = space.spaces["observation"]
    if not isinstance(space, spaces.Box):
        raise ValueError(f"agent {agent!r}: observation space {space} is not supported; marl-q's heads take flat Box "
                         "vectors (or a Dict of 'observation' and 'action_mask', PettingZoo classic's)")
    return space


class TurnGame:
    """A turn-based PettingZoo game (module docstring), exposing the spaces the team learners size
    their networks from (``possible_agents``, flat ``observation_space``, ``action_space``, ``action_mask``)."""

    def __init__(self, env: AECEnv) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        # each agent's observation shape as the env gives it (before flattening: a board's planes)
        self.board_shapes = {a: tuple(int(d) for d in _observation_part(a, env.observation_space(a)).shape)
                             for a in self.possible_agents}
        self._obs_dims = {a: int(np.prod(shape)) for a, shape in self.board_shapes.items()}
        for a in self.possible_agents:
            space = env.action_space(a)
            if not isinstance(space, spaces.Discrete):
                raise ValueError(f"agent {a!r}: action space {space} is not supported in a turn-based game (Discrete)")
        self.earned = {a: 0.0 for a in self.possible_agents}  # since the agent's last turn
        self.totals = {a: 0.0 for a in self.possible_agents}  # this episode
        self.moves = 0  # every agent's moves this episode
        self.terminated: Optional[bool] = None  # how the game ended for the seat advance() was asked about

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (self._obs_dims[agent],), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return self.env.action_space(agent)

    def action_mask(self, agent: str) -> np.ndarray:
        """The size of the agent's mask (the legal moves of a turn come from ``read``)."""
        return np.ones(int(self.env.action_space(agent).n), dtype=np.int8)

    def reset(self, seed: Optional[int] = None) -> None:
        self.env.reset(seed=seed)
        self.earned = {a: 0.0 for a in self.possible_agents}
        self.totals = {a: 0.0 for a in self.possible_agents}
        self.moves, self.terminated = 0, None

    def read(self, agent: str, obs: Any, info: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """(the observation as the env gives it, flattened float32, the legal-move mask as float32)."""
        n = int(self.env.action_space(agent).n)
        mask: Any = None
        if isinstance(obs, dict) and "observation" in obs:
            mask, obs = obs.get("action_mask"), obs["observation"]
        if mask is None and isinstance(info, dict):
            mask = info.get("action_mask")
        mask = np.ones(n, dtype=np.float32) if mask is None else np.asarray(mask, dtype=np.float32).reshape(n)
        return obs, np.asarray(obs, dtype=np.float32).reshape(-1), mask

    def play(self, action: int) -> None:
        """The agent whose turn it is plays ``action``."""
        self.moves += 1
        self.env.step(int(action))

    def advance(self, seat: str, others: Callable[[str, Any, np.ndarray, np.ndarray], int]
                ) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Play the other seats' turns (``others(agent, observation, mask, flat)``) until it is ``seat``'s
        turn: (its flat observation, mask); or until the game is over: None (``terminated`` then says
        whether the seat's episode terminated, not truncated, and ``final`` and ``final_mask`` hold its last
        observation and mask).
        Every agent is credited ``last()``'s reward at each of its turns, dead ones included."""
        env = self.env
        while env.agents:
            agent = env.agent_selection
            obs, rew, term, trunc, info = env.last()
            self.earned[agent] += float(rew)
            self.totals[agent] += float(rew)
            if term or trunc:
                if agent == seat:
                    self.terminated = bool(term)
                    _, self.final, self.final_mask = self.read(agent, obs, info)
                env.step(None)
                continue
            raw, flat, mask = self.read(agent, obs, info)
            if agent == seat:
                return flat, mask
            self.play(others(agent, raw, mask, flat))
        if self.terminated is None:  # the env removed the seat without a last turn
            self.terminated = True
        return None

    def take(self, agent: str) -> float:
        """The reward credited to ``agent`` since it was last asked (its transition's reward)."""
        out, self.earned[agent] = self.earned[agent], 0.0
        return out

    def outcome(self, seat: str) -> str:
        """``win``, ``draw`` or ``loss`` of ``seat``: its episode total against the best of the others'."""
        best = max(v for a, v in self.totals.items() if a != seat)
        mine = self.totals[seat]
        return "win" if mine > best else ("loss" if mine < best else "draw")

    def close(self) -> None:
        self.env.close()


def make_turn_game(env: AECEnv, seed: int) -> TurnGame:
    """``env`` as a ``TurnGame``, reset with ``seed``."""
    game = TurnGame(env)
    game.reset(seed=seed)
    return game
