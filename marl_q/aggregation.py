"""Aggregation rules: when pushed updates are combined and applied, and who hears back.

`hogwild` applies each update on arrival, scaled by its staleness weight (A3C, FedAsync);
`buffered` sums K weighted updates and applies their mean (FedBuff); `sync` waits for one update
from every worker and applies their mean (the barrier every asynchronous claim is measured against).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from marl_q.registry import AGGREGATIONS

Combined = Optional[np.ndarray]


class Aggregator:
    """offer(worker, update, weight) -> (combined update to apply or None, workers to reply to now)."""

    def __init__(self, workers: tuple[str, ...], buffer_k: int) -> None:
        self.workers = workers
        self.buffer_k = buffer_k

    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        pass


@AGGREGATIONS.register("hogwild", help="apply each update on arrival, scaled by w(staleness)")
class Hogwild(Aggregator):
    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        return (update if weight == 1.0 else update * np.float32(weight)), [worker]


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
            return None, [worker]
        combined = self._sum / np.float32(self._count)
        self._sum, self._count = None, 0
        return combined, [worker]

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
    def __init__(self, workers: tuple[str, ...], buffer_k: int) -> None:
        super().__init__(workers, buffer_k)
        self._round: dict[str, np.ndarray] = {}

    def offer(self, worker: str, update: np.ndarray, weight: float) -> tuple[Combined, list[str]]:
        self._round[worker] = update  # a worker pushing twice in a round replaces its update
        if len(self._round) < len(self.workers):
            return None, []
        if len(self.workers) == 1:  # the mean of one update is that update (bit for bit); skip the copies
            combined = update
        else:
            combined = np.mean([self._round[w] for w in self.workers], axis=0).astype(update.dtype, copy=False)
        self._round.clear()
        return combined, list(self.workers)
