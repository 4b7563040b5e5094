"""Turn-based (AEC) games for the team actor-critics with decentralised critics (ippo, ia2c) and for
the value-based ``dqn`` (agents/q_learning.py's ``TurnQWorker``, below ``TurnPlay``).

A turn-based game (scenarios/aec.py, scenario kind ``aec``: PettingZoo's classic games) is played by
the learner in one seat per episode against opponents in the others, and rolled out by the one
rollout loop (agents/rollout.py) over ``TurnCopies``, a vector of game copies in which a step is one
turn of the learner in every copy: the learner's move, then the opponents' moves up to its next turn
(or the game's end). So:

- only the agent whose turn it is acts; a batch row is the learner's seat in one copy;
- the reward of a step is what the learner was credited from its move up to its next turn
  (``TurnGame.advance``: rewards arriving on the opponents' turns included); the game's end ends the
  episode for all, and the copy restarts on its next step (next-step autoreset, as
  ``ParallelCopies``; that step is masked out);
- the legal-move mask reaches sampling (illegal logits at ``MASKED_LOGIT``), the loss (the batch's
  ``avail``: log-probabilities and entropies of the masked distribution) and the greedy evaluation;
- the learner's seat alternates between episodes (copy ``e``'s k-th episode: seat ``(k + e) mod N``),
  and the learner's one-hot seat id is appended to its observation where the family appends agent ids;
- with ``scenario.turns.symmetries`` the rollout's batch holds every copy once per board symmetry
  (scenarios/board_symmetry.py: boards, masks and moves mapped together), so the update learns each
  position in every orientation; env steps still count the moves played.

Env steps (the run's budget and ``env_steps`` columns) count the learner's moves; the opponents'
moves are part of the environment it plays in.

Opponents (``scenario.turns.opponents``; each training episode draws one, uniformly or with the
relative ``scenario.turns.weights``):
``self_play`` plays a frozen past policy of the learner's drawn uniformly from a pool (``Pool``):
the initial parameters, then a snapshot every ``refresh`` rollouts (dqn: chunks), the newest
``pool_size`` kept; ``random`` and scripted callables are ``scenarios.aec``'s. A frozen actor samples
from its masked distribution; a frozen Q-network plays epsilon-greedy at the learner's final epsilon.
Evaluation (``play_greedy``) plays the greedy learner against every ``scenario.turns.eval_opponents``
entry, seats alternating, and reports win, draw and loss rates.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from agents.heads import FlatParameters
from agents.rollout import EpisodeBook, Step, rollout
from marl_q.evaluation import EvalReturns, eval_progress
from marl_q.registry import SCENARIOS
from marl_q.seeding import derive
from scenarios.aec import (RANDOM, SELF_PLAY, TURN_FIELDS, Opponent, RandomOpponent, ScriptedOpponent, TurnGame,
                           TurnsConfig, opponent_name)
from scenarios.board_symmetry import Symmetry, augment, symmetries
from scenarios.tictactoe_minimax import SPEC as MINIMAX
from scenarios.tictactoe_minimax import against_minimax, against_random_player, observation_of

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig


def turn_based(cfg: ExperimentConfig) -> bool:
    """Whether the config's scenario is a turn-based game (kind ``aec``)."""
    return SCENARIOS.get(cfg.scenario.name).obj.kind_for(cfg.scenario.params) == "aec"


def board_group(game: TurnGame, kind: str) -> tuple[tuple[int, ...], list[Symmetry]]:
    """The game's board shape (its first agent's observation as the env gives it) and the symmetry
    group ``kind`` (``scenario.turns.symmetries``) on it; a board the group does not fit raises ValueError."""
    agent = game.possible_agents[0]
    board = game.board_shapes[agent]
    return board, symmetries(kind, board, int(game.action_space(agent).n))


def make_opponent(spec: str, rng: np.random.Generator) -> Opponent:
    """A fixed opponent: ``random`` or a scripted callable's import path."""
    return RandomOpponent(rng) if spec == RANDOM else ScriptedOpponent(spec, rng)


# ----------------------------------------------------------------------------- self-play
class Pool:
    """The frozen past policies of self-play: flat parameter vectors of the learner's networks (an
    actor-critic's actor and critic, a Q-learner's Q-network), played through a model of their own
    (built as the learner's, seeded on its own)."""

    def __init__(self, models: tuple[Any, Any, Any], first: np.ndarray, size: int,
                 seat_ids: Optional[np.ndarray], agents: list[str], rng: np.random.Generator) -> None:
        """``models``: (the network a frozen policy acts through, a second network whose parameters follow
        it in the flat vectors or None, what chooses a move from the network's output: ``sample(out, rng,
        mask)``): an actor-critic's actor, critic and distribution (a draw from the masked policy), or
        a Q-network, None and ``agents.q_learning.FrozenGreedy`` (epsilon-greedy on the masked Q-values)."""
        self.actor, critic, self.dist = models
        self.flat = FlatParameters(*(m for m in (self.actor, critic) if m is not None))
        self.snapshots: list[np.ndarray] = [first.copy()]
        self.size, self.seat_ids, self.rng = size, seat_ids, rng
        self.index = {a: i for i, a in enumerate(agents)}
        self.loaded: Optional[int] = None
        self.added = 0  # snapshots taken (the pool's generation): a Frozen opponent names its own

    def add(self, params: np.ndarray) -> None:
        self.snapshots.append(params.copy())
        self.added += 1
        if len(self.snapshots) > self.size:
            self.snapshots.pop(0)
        self.loaded = None

    def draw(self) -> "Frozen":
        k = int(self.rng.integers(len(self.snapshots)))
        return Frozen(self, self.added - (len(self.snapshots) - 1 - k))

    def move(self, generation: int, agent: str, flat: np.ndarray, mask: np.ndarray) -> int:
        """A draw from snapshot ``generation``'s masked distribution (the oldest kept if it left the pool)."""
        k = max(0, len(self.snapshots) - 1 - (self.added - generation))
        if self.loaded != k:
            self.flat.load(self.snapshots[k])
            self.loaded = k
        x = flat[None, :]
        if self.seat_ids is not None:
            x = np.concatenate([x, self.seat_ids[self.index[agent]][None, :]], axis=1)
        with torch.no_grad():
            out = self.actor(torch.from_numpy(x.astype(np.float32))).numpy()
        return int(self.dist.sample(out, self.rng, mask[None, :])[0])


class Frozen(Opponent):
    """One episode's self-play opponent: the pool's snapshot of one generation."""

    name = SELF_PLAY

    def __init__(self, pool: Pool, generation: int) -> None:
        self.pool, self.generation = pool, generation

    def move(self, agent: str, observation: Any, mask: np.ndarray, flat: np.ndarray) -> int:
        return self.pool.move(self.generation, agent, flat, mask)


# ----------------------------------------------------------------------------- the vector
class TurnCopies:
    """Copies of a turn-based game, the learner in one seat of each (module docstring): a step is one
    learner move per copy. ``draw()`` gives each new episode's opponent; ``seat`` fixes the learner's
    seat (an index into the agents) instead of alternating; ``reset_seeds`` seeds each copy's first reset."""

    def __init__(self, games: list[TurnGame], agents: list[str], draw: Callable[[], Opponent],
                 seat: Optional[int] = None, reset_seeds: Optional[list[int]] = None) -> None:
        self.games, self.agents, self.draw, self.fixed_seat = games, agents, draw, seat
        self.num_envs = E = len(games)
        first = agents[0]
        self.obs = np.zeros((E,) + games[0].observation_space(first).shape, dtype=np.float32)
        self.mask = np.ones((E, int(games[0].action_space(first).n)), dtype=np.float32)
        self.pending = np.ones(E, dtype=bool)
        self.started = np.zeros(E, dtype=np.int64)  # episodes started per copy
        self.seat = np.zeros(E, dtype=np.int64)
        self.opponent: list[Optional[Opponent]] = [None] * E
        self.illegal = np.zeros(E, dtype=np.int64)  # the learner's illegal moves this episode
        self.reset_seeds = None if reset_seeds is None else [int(s) for s in reset_seeds]

    def observe(self) -> "TurnCopies":
        """The copies themselves: the family reads ``obs``, ``mask`` and ``seat``."""
        return self

    def _start(self, e: int) -> None:
        """A new episode in copy ``e``: reset, the learner's seat, an opponent, the opponents' first moves."""
        game = self.games[e]
        for _ in range(100):
            seed = self.reset_seeds[e] if self.reset_seeds is not None and self.started[e] == 0 else None
            game.reset(seed=seed)
            N = len(self.agents)
            self.seat[e] = self.fixed_seat if self.fixed_seat is not None else (self.started[e] + e) % N
            self.started[e] += 1
            self.opponent[e] = self.draw()
            self.illegal[e] = 0
            turn = game.advance(self.agents[self.seat[e]], self.opponent[e].move)
            if turn is not None:  # (a game the opponents end before the learner's first turn is played again)
                self.obs[e], self.mask[e] = turn
                return
        raise RuntimeError(f"turn-based game: 100 games in a row ended before seat {self.agents[self.seat[e]]!r} "
                           "had a turn")

    def step(self, actions: np.ndarray) -> Step:
        """``actions``: the learner's move per copy. ``data``: per copy None (a restart) or (the learner's
        credited reward, whether its episode terminated, whether it ended)."""
        E = self.num_envs
        valid, ended, reward = np.zeros(E, dtype=bool), np.zeros(E, dtype=bool), np.zeros(E)
        data: list[Optional[tuple[float, bool, bool]]] = []
        for e, game in enumerate(self.games):
            if self.pending[e]:
                self._start(e)
                self.pending[e] = False
                data.append(None)
                continue
            seat = self.agents[self.seat[e]]
            a = int(actions[e])
            self.illegal[e] += int(self.mask[e, a] <= 0)
            game.play(a)
            turn = game.advance(seat, self.opponent[e].move)
            reward[e] = game.take(seat)
            valid[e] = True
            if turn is None:
                self.obs[e] = game.final
                ended[e] = self.pending[e] = True
                data.append((reward[e], bool(game.terminated), True))
            else:
                self.obs[e], self.mask[e] = turn
                data.append((reward[e], False, False))
        return Step(valid, reward, ended, data)

    def outcome(self, e: int) -> dict[str, Any]:
        """The finished episode of copy ``e``: seat, opponent, win/draw/loss as 0/1, illegal moves."""
        result = self.games[e].outcome(self.agents[self.seat[e]])
        return {"seat": int(self.seat[e]), "opponent": self.opponent[e].name,
                "win": int(result == "win"), "draw": int(result == "draw"), "loss": int(result == "loss"),
                "illegal": int(self.illegal[e])}


# ----------------------------------------------------------------------------- the worker
class TurnPlay:
    """What every learner that takes turns shares (the actor-critics' ``TurnTaking``, below; the
    Q-learner's ``agents.q_learning.TurnQWorker``): its opponents (``start_turns``), its rows, and the
    greedy matches and evaluation against fixed opponents. The learner gives ``cfg``, ``index``,
    ``envs`` (``TurnGame`` copies), ``turn_agents`` (the seats), ``flat`` (its parameters, for the self-play pool),
    ``agent_ids()`` (the (N, N) one-hot seat ids appended to its rows, or None) and ``greedy(vec)``
    (its most likely legal move per copy of a ``TurnCopies``)."""

    turn_agents: list[str]  # the game's seats (possible_agents), in order: the learner's own property

    def start_turns(self, pool_models: Callable[[], tuple[Any, Any, Any]]) -> TurnCopies:
        """Seat ids, ``scenario.turns``, the opponents' generator, the self-play pool (its frozen policies
        played through ``pool_models()``: ``Pool``'s models) and the fixed opponents; the game copies
        the learner plays in, each episode's opponent drawn by ``draw_opponent``."""
        self.seat_ids = self.agent_ids()
        self.turns = TurnsConfig.from_dict(self.cfg.scenario.params.turns)
        self.opponent_rng = np.random.default_rng(derive(self.cfg.run.seed, "opponents", self.index))
        self.pool = None
        if SELF_PLAY in self.turns.opponents:
            self.pool = Pool(pool_models(), self.flat.numpy(), self.turns.pool_size, self.seat_ids,
                             self.turn_agents, self.opponent_rng)
        self.fixed = {spec: make_opponent(spec, self.opponent_rng) for spec in self.turns.opponents
                      if spec != SELF_PLAY}
        return TurnCopies(self.envs, self.turn_agents, self.draw_opponent)

    def draw_opponent(self) -> Opponent:
        """A training episode's opponent: one of ``turns.opponents``, uniformly or by ``turns.weights``
        (``TurnsConfig.draw``; a pool snapshot for self-play)."""
        spec = self.turns.draw(self.opponent_rng)
        return self.pool.draw() if spec == SELF_PLAY else self.fixed[spec]

    def turn_rows(self, vec: TurnCopies) -> np.ndarray:
        """The learner's inputs, one row per copy: its observation and, with agent ids, its seat's."""
        if self.seat_ids is None:
            return vec.obs.copy()
        return np.concatenate([vec.obs, self.seat_ids[vec.seat]], axis=1)

    def greedy_on_board(self, board: tuple[int, ...], seat: int) -> int:
        """The greedy learner's move in ``seat`` on a tic-tac-toe board seen from its side
        (``scenarios.tictactoe_minimax``'s 9-tuple), read as the env's observation and mask."""
        obs = observation_of(board).astype(np.float32).reshape(1, -1)
        mask = np.array([[c == 0 for c in board]], dtype=np.float32)
        return int(self.greedy(SimpleNamespace(obs=obs, seat=np.array([seat]), mask=mask))[0])

    def play_matches(self, spec: str, games: int, seed: int, seat: Optional[int] = None,
                     bar: Any = None) -> list[dict[str, Any]]:
        """``games`` games of the greedy learner against the fixed opponent ``spec`` in one copy (seats
        alternating, or ``seat``), the game reset with ``seed`` first and the opponent drawing from a
        generator seeded with ``seed``: each game's row (return, length, seat, opponent, win, draw,
        loss, illegal)."""
        opponent = make_opponent(spec, np.random.default_rng(seed))
        vec = TurnCopies(self.envs[:1], self.turn_agents, lambda: opponent, seat=seat, reset_seeds=[seed])
        rows, _ = rollout(vec, EpisodeBook(1), None, self.greedy, row=vec.outcome, until=games)
        if bar is not None:
            bar.update(len(rows))
        return rows[:games]

    def play_greedy(self, episodes: int, seed: int, progress: bool = False) -> EvalReturns:
        """``episodes`` greedy games against each evaluation opponent (seats alternating): their returns,
        with the columns ``win_<opponent>``, ``draw_<opponent>``, ``loss_<opponent>`` (rates) and
        ``illegal`` (illegal moves sampled, all opponents together)."""
        returns, columns, illegal = [], {}, 0
        specs = self.turns.eval_opponents
        with eval_progress(episodes * len(specs), progress) as bar:
            for k, spec in enumerate(specs):
                rows = self.play_matches(spec, episodes, derive(seed, "opponents", k), bar=bar)
                name = rows[0]["opponent"]
                for key in ("win", "draw", "loss"):
                    columns[f"{key}_{name}"] = float(np.mean([r[key] for r in rows]))
                illegal += sum(r["illegal"] for r in rows)
                returns += [r["return"] for r in rows]
        columns["illegal"] = illegal
        return EvalReturns(returns, columns)


class TurnTaking(TurnPlay):
    """The turn-based rollout and evaluation of a team worker: mixed in before ``TeamWorker``
    (agents/mappo.py's ``TurnWorker``), whose environments are then ``TurnGame`` copies."""

    def reset_env(self) -> None:
        self.vec = self.start_turns(self.make_models)
        self._opponent_column: dict[str, int] = {}  # the critic's one-hot column of each opponent (its first)
        for i, spec in enumerate(self.turns.opponents):
            self._opponent_column.setdefault(opponent_name(spec), i)
        self.board, self.symmetries = board_group(self.envs[0], self.turns.symmetries)
        self.book = EpisodeBook(len(self.envs))
        self.rollouts = 0

    @property
    def turn_agents(self) -> list[str]:
        return self.desc.agents

    def load_policy(self, models: dict[str, Any]) -> None:
        """Act with a checkpoint's actor (``marl_q.rundir.load_trained``'s policy models)."""
        self.actor.load_state_dict(models["actor"].state_dict())

    def critic_rows(self, vec: TurnCopies, actor_rows: np.ndarray) -> np.ndarray:
        """The critic's inputs with ``turns.critic_opponent``: the actor's rows and a one-hot of each
        copy's current opponent (its index in ``turns.opponents``; zeros before a copy's first game)."""
        onehot = np.zeros((len(vec.opponent), len(self._opponent_column)), dtype=np.float32)
        for e, opponent in enumerate(vec.opponent):
            if opponent is not None:
                onehot[e, self._opponent_column[opponent.name]] = 1.0
        return np.concatenate([actor_rows, onehot], axis=1)

    def rollout(self) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
        """n_steps learner turns in every copy (agents.rollout); restarts are masked out."""
        self.rollouts += 1
        if self.pool is not None and self.rollouts % self.turns.refresh == 0:
            self.pool.add(self.flat.numpy())
        T, E = self.ac.n_steps, len(self.envs)
        batch: dict[str, np.ndarray] = {
            "actions": np.zeros((T, E), dtype=np.int64), "rewards": np.zeros((T, E)),
            "terminated": np.zeros((T, E), dtype=bool), "dones": np.zeros((T, E), dtype=bool),
            "valid": np.zeros((T, E), dtype=bool)}
        obs_l, avail_l, critic_l = [], [], []
        with_opponent = self.turns.critic_opponent

        def act(vec: TurnCopies) -> np.ndarray:
            x = self.turn_rows(vec)
            obs_l.append(x)
            if with_opponent:
                critic_l.append(self.critic_rows(vec, x))
            avail_l.append(vec.mask.copy())
            with torch.no_grad():
                out = self.actor(torch.from_numpy(x)).numpy()
            return self.dist.sample(out, self.rng, vec.mask)

        def store(t: int, vec: TurnCopies, actions: np.ndarray, step: Step) -> None:
            batch["actions"][t] = actions
            for e, stepped in enumerate(step.data):
                if stepped is None:
                    continue
                batch["valid"][t, e] = True
                batch["rewards"][t, e], batch["terminated"][t, e], batch["dones"][t, e] = stepped

        episodes, steps = rollout(self.vec, self.book, T, act, store,
                                  row=lambda e: dict(version=self.version, **self.vec.outcome(e)))
        batch["obs"] = np.stack(obs_l + [self.turn_rows(self.vec)])
        if with_opponent:
            batch["critic_obs"] = np.stack(critic_l + [self.critic_rows(self.vec, batch["obs"][-1])])
        batch["avail"] = np.stack(avail_l)
        return augment(batch, self.symmetries, self.board), episodes, steps

    def greedy(self, vec: TurnCopies) -> np.ndarray:
        """The learner's most likely legal move per copy."""
        with torch.no_grad():
            return self.dist.mode(self.actor(torch.from_numpy(self.turn_rows(vec))).numpy(), vec.mask)


def main(argv: Optional[list[str]] = None) -> int:
    """python -m agents.turn_based RUN_DIR --opponent SPEC [--games N] [--seed S] [--exact]: the greedy
    policy of a trained turn-based run (its newest checkpoint) against a fixed opponent, ``--games`` games
    in each seat; prints win, draw and loss rates per seat and the illegal moves sampled. ``--exact``
    (tic-tac-toe against the minimax player or random): the exact rates per seat instead, every
    tie-break of minimax, or every move of the random player, walked (``scenarios.tictactoe_minimax``'s
    ``against_minimax``, ``against_random_player``), and each lost game's moves (against random: the
    ten most likely and their count)."""
    import argparse
    import json
    from pathlib import Path

    from marl_q.errors import UserError
    from marl_q.registry import ALGORITHMS
    from marl_q.rundir import load_trained

    parser = argparse.ArgumentParser(prog="python -m agents.turn_based", description=main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--opponent", default=RANDOM, help="random or package.module:callable")
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact", action="store_true",
                        help=f"with --opponent {MINIMAX} or {RANDOM} on tictactoe_v3: exact rates and the lost "
                             "games' moves")
    args = parser.parse_args(argv)
    try:
        trained = load_trained(args.run_dir)
        if not turn_based(trained.cfg):
            raise UserError(f"{args.run_dir}: not a run of a turn-based game")
        TurnsConfig.from_dict({"eval_opponents": [args.opponent]})
        env = str(getattr(trained.cfg.scenario.params, "env", ""))
        if args.exact and (args.opponent not in (MINIMAX, RANDOM) or not env.endswith("tictactoe_v3:env")):
            raise UserError(f"--exact needs --opponent {MINIMAX} or {RANDOM} and a run of "
                            f"pettingzoo.classic.tictactoe_v3:env (got --opponent {args.opponent} on "
                            f"{env or trained.cfg.scenario.name})")
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=__import__("sys").stderr)
        return 2
    worker = ALGORITHMS.get(trained.cfg.algorithm.name).obj(trained.cfg).make_worker(0)
    worker.load_policy(trained.policy.models)
    out = {"run": str(args.run_dir), "checkpoint": trained.checkpoint.name, "opponent": args.opponent}
    if args.exact:
        out.pop("opponent")
        out.update(opponent=args.opponent, exact=True)
        walk = against_minimax if args.opponent == MINIMAX else against_random_player
        for seat, agent in enumerate(worker.turn_agents):
            rates, lost = walk(lambda board, seat=seat: worker.greedy_on_board(board, seat), seat == 0)
            out[agent] = {**rates, "lost": [[round(p, 6), " ".join(line)] for p, line in lost]}
            if args.opponent == RANDOM:  # many lines lose against random now and then: the likeliest
                out[agent].update(lost=out[agent]["lost"][:10], lost_lines=len(lost))
        print(json.dumps(out))
        return 0
    for seat, agent in enumerate(worker.turn_agents):
        rows = worker.play_matches(args.opponent, args.games, derive(args.seed, "opponents", seat), seat=seat)
        out[agent] = {key: float(np.mean([r[key] for r in rows])) for key in ("win", "draw", "loss")}
        out[agent].update(games=len(rows), illegal=int(sum(r["illegal"] for r in rows)))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
