"""A perfect tic-tac-toe player for PettingZoo's ``tictactoe_v3``: minimax with random tie-breaks.

``minimax(observation, action_mask, rng)`` is a scripted opponent (``scenario.turns``, scenarios/aec.py):
``observation`` is the env's (3, 3, 2) planes from the mover's side (plane 0 its own marks, plane 1 the
opponent's; ``board_of`` reads them in action order), and the move is drawn uniformly among those of the best game-theoretic value (win 1,
draw 0, loss -1 for the mover, perfect play on both sides), so it never loses and varies its games.

``minimax_centre`` is the same player, except that it opens in the centre when it moves first (a
training opponent for the second seat's hardest opening).

``against_random(board, to_move, safe)`` is the best win and loss probabilities against a uniform random
player (the ceiling of a learner's win rate against random; ``safe``: among minimax-safe moves only).

``against_minimax(policy, first)`` is the exact win, draw and loss probabilities of a deterministic player
against ``minimax`` (every tie-break walked), with each lost game's moves: where a policy loses, and how often.

``values(board)`` gives every legal move's value; boards are 9-tuples of 0 (empty), 1 (mover),
2 (opponent), cells in the action order 0..8. Memoised negamax over the at most 3^9 positions.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

import numpy as np

SPEC = "scenarios.tictactoe_minimax:minimax"  # the player's import path, as scenario.turns names it
CENTRE = 4  # the centre cell
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def board_of(observation: np.ndarray) -> tuple[int, ...]:
    """The 9-tuple board (action order) of a ``tictactoe_v3`` observation: ``observation.reshape(9, 2)``
    is (own mark, opponent's mark) per cell in action order (checked against the env in the tests)."""
    planes = np.asarray(observation).reshape(9, 2)
    return tuple(int(1 if planes[a, 0] else (2 if planes[a, 1] else 0)) for a in range(9))


def observation_of(board: tuple[int, ...]) -> np.ndarray:
    """The ``tictactoe_v3`` observation (3, 3, 2) of a board seen from the mover's side (``board_of``'s inverse)."""
    planes = np.zeros((9, 2), dtype=np.int8)
    for a, c in enumerate(board):
        if c:
            planes[a, c - 1] = 1
    return planes.reshape(3, 3, 2)


def winner(board: tuple[int, ...]) -> Optional[int]:
    """1 or 2 when that side has three in a line, else None."""
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return None


@lru_cache(maxsize=None)
def value(board: tuple[int, ...]) -> int:
    """The mover's (side 1's) game value with perfect play: 1 win, 0 draw, -1 loss."""
    if winner(board) == 2:
        return -1
    if winner(board) == 1:
        return 1
    moves = [a for a in range(9) if board[a] == 0]
    if not moves:
        return 0
    return max(-value(_swap(_put(board, a))) for a in moves)


def _put(board: tuple[int, ...], a: int) -> tuple[int, ...]:
    return board[:a] + (1,) + board[a + 1:]


def _swap(board: tuple[int, ...]) -> tuple[int, ...]:
    """The same board from the other side (1 and 2 exchanged)."""
    return tuple((0, 2, 1)[c] for c in board)


def values(board: tuple[int, ...]) -> dict[int, int]:
    """Each legal move's value for the mover."""
    return {a: -value(_swap(_put(board, a))) for a in range(9) if board[a] == 0}


def best_moves(board: tuple[int, ...]) -> list[int]:
    """The legal moves of the best value, in action order."""
    vals = values(board)
    top = max(vals.values())
    return [a for a, v in vals.items() if v == top]


def minimax(observation: np.ndarray, action_mask: np.ndarray, rng: np.random.Generator) -> int:
    """A best move (uniformly among the ties) of the side to move."""
    board = board_of(observation)
    moves = [a for a in best_moves(board) if action_mask[a]]
    return int(moves[rng.integers(len(moves))])



def minimax_centre(observation: np.ndarray, action_mask: np.ndarray, rng: np.random.Generator) -> int:
    """``minimax``, except that on the empty board it opens in the centre (cell 4). As a training
    opponent it puts the learner, in the second seat, in the one opening it must defend move after
    move; ``minimax`` opens there one game in nine (every opening draws, so it draws among all nine)."""
    if not np.asarray(observation).any():
        return CENTRE
    return minimax(observation, action_mask, rng)


# ----------------------------------------------------------------------------- against a random player
@lru_cache(maxsize=None)
def against_random(board: tuple[int, ...], to_move: bool, safe: bool) -> tuple[float, float]:
    """(win, loss) probabilities of side 1 playing best against a uniform random side 2 from ``board``
    (``to_move``: side 1 moves next): side 1 maximises win minus loss probability (expectimax over the
    random side's moves); ``safe`` restricts it to moves of the best game value (``values``), so it
    never loses to any player. The ceiling of a tic-tac-toe learner's win rate against random."""
    w = winner(board)
    if w is not None:
        return (1.0, 0.0) if w == 1 else (0.0, 1.0)
    moves = [a for a in range(9) if board[a] == 0]
    if not moves:
        return 0.0, 0.0
    if to_move:
        if safe:
            vals = values(board)
            moves = [a for a in moves if vals[a] == max(vals.values())]
        return max((against_random(_put(board, a), False, safe) for a in moves), key=lambda o: o[0] - o[1])
    outs = [against_random(board[:a] + (2,) + board[a + 1:], True, safe) for a in moves]
    return sum(o[0] for o in outs) / len(outs), sum(o[1] for o in outs) / len(outs)


def best_move_against_random(board: tuple[int, ...], safe: bool) -> int:
    """Side 1's move that ``against_random`` values highest (the first in action order among ties)."""
    moves = [a for a in range(9) if board[a] == 0]
    if safe:
        vals = values(board)
        moves = [a for a in moves if vals[a] == max(vals.values())]
    scores = [against_random(_put(board, a), False, safe) for a in moves]
    return moves[max(range(len(moves)), key=lambda i: scores[i][0] - scores[i][1])]


# ----------------------------------------------------------------------------- a policy's exact outcome
def against_minimax(policy: Callable[[tuple[int, ...]], int], first: bool
                    ) -> tuple[dict[str, float], list[tuple[float, tuple[str, ...]]]]:
    """Exact outcome of a deterministic player against ``minimax``, which draws uniformly among its best
    moves: every tie is walked, each continuation weighted by its probability. ``policy(board)`` gives
    the player's move on a board seen from its side (1 its marks, 2 minimax's); ``first``: it moves first.
    Returns the rates ``{"win", "draw", "loss"}`` (they sum to 1) and the lost games, each as
    (probability, moves), the moves in play order as ``p<cell>`` (the player's; ``*`` after one of a
    lower game value than its best) and ``m<cell>`` (minimax's), most likely first."""
    return exact_outcome(policy, first, lambda board: best_moves(_swap(board)))


def against_random_player(policy: Callable[[tuple[int, ...]], int], first: bool
                          ) -> tuple[dict[str, float], list[tuple[float, tuple[str, ...]]]]:
    """``against_minimax``'s exact outcome against a uniform random player instead (every legal move
    walked, each with its probability; its moves written ``m<cell>`` too)."""
    return exact_outcome(policy, first, lambda board: [a for a in range(9) if board[a] == 0])


def exact_outcome(policy: Callable[[tuple[int, ...]], int], first: bool,
                  replies: Callable[[tuple[int, ...]], list[int]]
                  ) -> tuple[dict[str, float], list[tuple[float, tuple[str, ...]]]]:
    """The exact outcome of a deterministic ``policy`` against an opponent drawing uniformly among
    ``replies(board)`` (the board seen from the policy's side): ``against_minimax``'s rates and lost games."""
    rates = {"win": 0.0, "draw": 0.0, "loss": 0.0}
    lost: list[tuple[float, tuple[str, ...]]] = []

    def walk(board: tuple[int, ...], player_moves: bool, p: float, line: tuple[str, ...]) -> None:
        w = winner(board)
        if w is not None or 0 not in board:
            result = "win" if w == 1 else ("loss" if w == 2 else "draw")
            rates[result] += p
            if result == "loss":
                lost.append((p, line))
            return
        if player_moves:
            a = int(policy(board))
            if board[a] != 0:
                raise ValueError(f"the policy played the taken cell {a} on {board}")
            vals = values(board)
            mark = "" if vals[a] == max(vals.values()) else "*"
            walk(_put(board, a), False, p, line + (f"p{a}{mark}",))
            return
        moves = replies(board)
        for a in moves:
            walk(board[:a] + (2,) + board[a + 1:], True, p / len(moves), line + (f"m{a}",))

    walk((0,) * 9, first, 1.0, ())
    return rates, sorted(lost, key=lambda x: -x[0])
