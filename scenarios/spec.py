"""The record a scenario module exports so the runtime can register it (no marl_q import here)."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple


class ScenarioSpec(NamedTuple):
    """How to build one environment: its config dataclass, a factory ``make(cfg, seed)`` and its kind.

    kind: ``gym_vector`` (a Gymnasium VectorEnv), ``parallel`` (a PettingZoo ParallelEnv) or
    ``custom`` (an object the matching algorithm knows how to drive).
    """

    config: type
    make: Callable[..., Any]
    kind: str
    help: str
