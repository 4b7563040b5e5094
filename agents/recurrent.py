"""Recurrent heads (a GRU) and the chunked backpropagation through time that trains them.

One place for memory, for any learner that wants it (the team actor-critics of agents/mappo.py use
it today; a value-based agent can use the same head and layout):

- ``RecurrentHead``: features (B, in) -> the MLP's hidden layers -> a ``GRUCell`` -> a linear output
  (B, out). It carries a hidden state (B, H) that the caller owns:
  ``initial_state(B)``, ``step(x, h, reset) -> (out, h')`` for acting one step, and
  ``unroll(x, h0, resets) -> (outs, h_last)`` over a chunk of L steps. ``reset`` marks the rows
  whose observation is the first of an episode: their state is zeroed *before* the step, so no
  memory crosses an episode boundary, while a state carried across rollout boundaries is kept.
- The sequence layout of a rollout of T steps x R rows cut into C = T / L chunks of L steps:
  ``to_sequences`` (T, R, ...) -> (L, C R, ...) (sequence s = c R + r), ``from_sequences`` back.
  Minibatches pick whole sequences, and each starts from the state the rollout recorded at its
  chunk's start (detached: the gradient flows L steps back at most).

``docs/recurrent.md`` has the config keys and what stays feed-forward.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn


class RecurrentHead(nn.Module):
    """An MLP encoder, a GRU cell of the encoder's width, and a linear output layer."""

    recurrent = True

    def __init__(self, encoder: nn.Module, hidden_size: int, out: nn.Linear) -> None:
        super().__init__()
        self.encoder = encoder
        self.gru = nn.GRUCell(hidden_size, hidden_size)
        self.out = out
        self.hidden_size = hidden_size

    def initial_state(self, batch: int) -> torch.Tensor:
        """The state of rows that have seen nothing yet: zeros (batch, H)."""
        return torch.zeros(batch, self.hidden_size)

    def step(self, x: torch.Tensor, h: torch.Tensor, reset: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: x (B, in), h (B, H), reset (B,) bool (True: an episode starts at x, the state is
        zeroed first). Returns the outputs (B, out) and the new state (B, H)."""
        if reset is not None:
            h = torch.where(reset[:, None], torch.zeros((), dtype=h.dtype), h)
        h = self.gru(self.encoder(x), h)
        return self.out(h), h

    def unroll(self, x: torch.Tensor, h0: torch.Tensor, resets: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """L steps: x (L, B, in), h0 (B, H), resets (L, B) bool. Returns the outputs (L, B, out) and
        the state after the last step (B, H). The encoder and output layer run once over all L B rows.

        The recurrence runs in torch's fused GRU (``torch.gru``: the cell's own kernel and parameters,
        one call per stretch of steps between resets), not a Python loop over ``GRUCell``: the same
        numbers, and the update's time no longer grows with a Python call per step. A stretch starts
        at each step where some row resets; its rows that reset are zeroed first."""
        L, B = x.shape[:2]
        feats = self.encoder(x.reshape(L * B, -1)).reshape(L, B, -1)
        cell = self.gru
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        starts = [0]
        if resets is not None:
            starts += (torch.nonzero(resets[1:].any(dim=1)).flatten() + 1).tolist()
        zero = torch.zeros((), dtype=h0.dtype)
        h, pieces = h0, []
        for a, b in zip(starts, starts[1:] + [L]):
            if resets is not None:
                h = torch.where(resets[a][:, None], zero, h)
            hs, h = torch.gru(feats[a:b], h[None], weights, True, 1, 0.0, self.training, False, False)
            h = h[0]
            pieces.append(hs)
        hs = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        return self.out(hs.reshape(L * B, -1)).reshape(L, B, -1), h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise TypeError("a recurrent head carries a hidden state: call step(x, h, reset) or unroll(x, h0, resets)")


def is_recurrent(module: Any) -> bool:
    return bool(getattr(module, "recurrent", False))


# ----------------------------------------------------------------------------- sequence layout
def to_sequences(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """(T, R, ...) -> (L, C R, ...) with L = chunk, C = T / L: sequence s = c R + r holds steps
    c L .. c L + L - 1 of row r."""
    T, R = x.shape[:2]
    C = T // chunk
    rest = x.shape[2:]
    return x.reshape((C, chunk, R) + rest).transpose(0, 1).reshape((chunk, C * R) + rest)


def from_sequences(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``to_sequences``' inverse: (L, C R, ...) -> (C L, R, ...)."""
    L, S = x.shape[:2]
    C = S // rows
    rest = x.shape[2:]
    return x.reshape((L, C, rows) + rest).transpose(0, 1).reshape((C * L, rows) + rest)


def sequence_forward(net: nn.Module, x: torch.Tensor, h0: Optional[torch.Tensor],
                     resets: Optional[torch.Tensor]) -> torch.Tensor:
    """A head's outputs (L, B, out) on sequences x (L, B, in): unrolled from h0 when it is recurrent,
    row by row when it is feed-forward (h0, resets unused)."""
    if is_recurrent(net):
        return net.unroll(x, h0, resets)[0]
    L, B = x.shape[:2]
    return net(x.reshape(L * B, -1)).reshape(L, B, -1)
