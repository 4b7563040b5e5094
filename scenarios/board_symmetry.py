"""The symmetries of a board game, as permutations of its observation planes, masks and actions.

``scenario.turns.symmetries`` (scenarios/aec.py) names a group of board symmetries; the turn-based
learners (agents/turn_based.py) then train on every transition of a rollout once per symmetry: the
observation, the legal-move mask and the move taken mapped together (``augment``), rewards and ends
unchanged. A position the learner met in one orientation teaches it all of them, and a policy that
has collapsed onto a move in one orientation gets the gradient of the moves it made in the others.

- ``none``: no augmentation (the default).
- ``dihedral``: the 8 rotations and reflections of a square board. The observation is (H, H, C)
  planes (row, column, plane), the actions are the H*H cells in row-major order (action
  ``r * H + c`` is the cell at row r, column c): PettingZoo's ``tictactoe_v3``.
- ``mirror``: the left-right reflection. The observation is (H, W, C) planes, the actions are the W
  columns: PettingZoo's ``connect_four_v3``.

A symmetry is ``Symmetry(cells, actions)``: ``cells[k]`` is the cell (row-major index into the H*W
board) whose content the mapped board holds at cell k, and ``actions[a]`` is the mapped move of move a.
A mask maps as a board of actions does: ``mask[inverse(actions)]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

NONE, DIHEDRAL, MIRROR = "none", "dihedral", "mirror"
KINDS = (NONE, DIHEDRAL, MIRROR)


@dataclass(frozen=True)
class Symmetry:
    cells: np.ndarray  # (H*W,): the mapped board's cell k holds the original board's cell cells[k]
    actions: np.ndarray  # (A,): move a maps to move actions[a]

    @property
    def action_source(self) -> np.ndarray:
        """The inverse of ``actions``: the mapped mask's entry b is the original mask's ``action_source[b]``."""
        return np.argsort(self.actions)


def symmetries(kind: str, board: Sequence[int], n_actions: int) -> list[Symmetry]:
    """The group ``kind`` on observations of shape ``board`` (H, W, C) with ``n_actions`` moves, the
    identity first. A board the group does not fit raises ValueError naming what was expected."""
    if kind not in KINDS:
        raise ValueError(f"turns.symmetries: one of {', '.join(KINDS)}, got {kind!r}")
    if kind == NONE:
        return []
    shape = tuple(int(s) for s in board)
    if len(shape) != 3:
        raise ValueError(f"turns.symmetries: {kind} needs (rows, columns, planes) observations, got shape {shape}")
    H, W, _ = shape
    grid = np.arange(H * W).reshape(H, W)
    if kind == DIHEDRAL:
        if H != W or n_actions != H * W:
            raise ValueError(f"turns.symmetries: dihedral needs a square board whose moves are its cells "
                             f"((H, H, C) observations, H*H actions), got observations {shape} and {n_actions} actions")
        out = []
        for flip in (False, True):
            for k in range(4):
                g = np.rot90(grid, k)
                g = np.fliplr(g) if flip else g
                cells = g.reshape(-1).copy()
                out.append(Symmetry(cells, np.argsort(cells)))  # move a (a cell) goes where its content goes
        return out
    if n_actions != W:
        raise ValueError(f"turns.symmetries: mirror needs one move per column ((H, W, C) observations, W actions), "
                         f"got observations {shape} and {n_actions} actions")
    cols = np.arange(W)[::-1].copy()
    return [Symmetry(np.arange(H * W), np.arange(W)),
            Symmetry(np.fliplr(grid).reshape(-1).copy(), cols)]


def map_rows(rows: np.ndarray, sym: Symmetry, board: Sequence[int]) -> np.ndarray:
    """``rows`` (..., D) whose first H*W*C columns are a flattened (H, W, C) observation (the rest, such
    as appended ids, are kept): the board part mapped by ``sym``."""
    H, W, C = (int(s) for s in board)
    n = H * W * C
    out = rows.copy()
    planes = rows[..., :n].reshape(rows.shape[:-1] + (H * W, C))
    out[..., :n] = planes[..., sym.cells, :].reshape(rows.shape[:-1] + (n,))
    return out


def augment(batch: dict[str, np.ndarray], group: list[Symmetry], board: Sequence[int]) -> dict[str, np.ndarray]:
    """A rollout batch (agents.actor_critic.actor_critic_update's: ``obs`` (T+1, E, D), optional
    ``critic_obs``, ``avail`` (T, E, A), ``actions`` (T, E), and per-step ``rewards``, ``terminated``,
    ``dones``, ``valid``) with its E columns repeated once per symmetry of ``group`` along the column
    axis (E * len(group) columns, the identity's first): boards, masks and moves mapped, the rest copied."""
    if not group:
        return batch
    out: dict[str, np.ndarray] = {}
    for key, value in batch.items():
        if key in ("obs", "critic_obs"):
            parts = [map_rows(value, g, board) for g in group]
        elif key == "avail":
            parts = [value[..., g.action_source] for g in group]
        elif key == "actions":
            parts = [g.actions[value] for g in group]
        else:
            parts = [value] * len(group)
        out[key] = np.concatenate(parts, axis=1)
    return out
