"""Staleness weights w(s) for an update computed s server versions ago (docs/actor_critic.md)."""
from __future__ import annotations

import math

from marl_q.registry import STALENESS


@STALENESS.register("constant", help="w(s) = 1")
def constant(s: int, a: float = 0.5, b: int = 4) -> float:
    return 1.0


@STALENESS.register("poly", help="w(s) = (1 + s)^-a  (FedAsync)")
def poly(s: int, a: float = 0.5, b: int = 4) -> float:
    return (1.0 + s) ** (-a)


@STALENESS.register("hinge", help="w(s) = 1 if s <= b else 1 / (a (s - b) + 1)  (FedAsync)")
def hinge(s: int, a: float = 0.5, b: int = 4) -> float:
    return 1.0 if s <= b else 1.0 / (a * (s - b) + 1.0)


@STALENESS.register("inv_sqrt", help="w(s) = 1 / sqrt(1 + s)  (FedBuff)")
def inv_sqrt(s: int, a: float = 0.5, b: int = 4) -> float:
    return 1.0 / math.sqrt(1.0 + s)
