"""Aggregation rules: when pushed updates are combined and applied, and who hears back.

`hogwild` applies each update on arrival, scaled by its staleness weight (A3C, FedAsync);
`buffered` sums K weighted updates and applies their mean (FedBuff); `sync` waits for one update
from every worker and applies their mean (the barrier every asynchronous claim is measured against).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from marl_q.registry import AGGREGATIONS

Combined = Optional[np.ndarray]


class Aggregator:
    """offer(worker, update, weight) -> (combined update to apply or None, workers to reply to now).

    A service that keeps whole pushes instead of arrays (COMA's episodes, which it learns from as a
    batch) asks the same rule as questions: does a worker's new push replace its earlier one in the
    round (``replaces_in_round``), is the round complete (``round_complete``), and who hears back now
    (``reply_to``)."""

    replaces_in_round = False  # a worker pushing twice in a round replaces its first push

    def __init__(self, workers: tuple[str, ...], buffer_k: int) -> None:
        self.workers = workers
        self.buffer_k = buffer_k

    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        raise NotImplementedError

    def round_complete(self, senders: Sequence[str]) -> bool:
        """Whether the pushes held, from ``senders`` (one name per push, in arrival order), make a round."""
        raise NotImplementedError

    def reply_to(self, worker: str, complete: bool) -> list[str]:
        """Who hears back after ``worker``'s push, which completed a round or not: the pusher."""
        return [worker]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        pass


def holds_rounds(rule: type[Aggregator]) -> bool:
    """Whether an aggregation rule can be asked about rounds of whole pushes (round_complete)."""
    return rule.round_complete is not Aggregator.round_complete


@AGGREGATIONS.register("hogwild", help="apply each update on arrival, scaled by w(staleness)")
class Hogwild(Aggregator):
    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        return (update if weight == 1.0 else update * np.float32(weight)), self.reply_to(worker, True)

    def round_complete(self, senders: Sequence[str]) -> bool:
        return len(senders) >= 1


@AGGREGATIONS.register("buffered", help="sum w(s_i) u_i over server.buffer_k arrivals, then apply the mean (FedBuff)")
class Buffered(Aggregator):
    def __init__(self, workers: tuple[str, ...], buffer_k: int) -> None:
        super().__init__(workers, buffer_k)
        self._sum: Optional[np.ndarray] = None
        self._count = 0

    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        scaled = update * np.float32(weight)
        self._sum = scaled if self._sum is None else self._sum + scaled
        self._count += 1
        if self._count < self.buffer_k:
            return None, self.reply_to(worker, False)
        combined = self._sum / np.float32(self._count)
        self._sum, self._count = None, 0
        return combined, self.reply_to(worker, True)

    def round_complete(self, senders: Sequence[str]) -> bool:
        return len(senders) >= self.buffer_k

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"count": np.array(self._count)}
        if self._sum is not None:
            out["sum"] = self._sum
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._count = int(state.get("count", 0))
        self._sum = state.get("sum")


@AGGREGATIONS.register("sync", help="barrier: one update from every worker, apply their mean, broadcast")
class Sync(Aggregator):
    replaces_in_round = True

    def __init__(self, workers: tuple[str, ...], buffer_k: int) -> None:
        super().__init__(workers, buffer_k)
        self._round: dict[str, np.ndarray] = {}

    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        self._round[worker] = update  # a worker pushing twice in a round replaces its update
        if len(self._round) < len(self.workers):
            return None, self.reply_to(worker, False)
        if len(self.workers) == 1:  # the mean of one update is that update (bit for bit); skip the copies
            combined = update
        else:
            combined = np.mean([self._round[w] for w in self.workers], axis=0).astype(update.dtype, copy=False)
        self._round.clear()
        return combined, self.reply_to(worker, True)

    def round_complete(self, senders: Sequence[str]) -> bool:
        return set(senders) >= set(self.workers)

    def reply_to(self, worker: str, complete: bool) -> list[str]:
        """Nobody until the round is complete; then every worker (the barrier lifts)."""
        return list(self.workers) if complete else []
