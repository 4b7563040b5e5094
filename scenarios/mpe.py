"""mpe2's cooperative particle tasks as marl-q scenarios: simple_spread_v3 and simple_speaker_listener_v4.

mpe2 is PettingZoo's MPE moved into its own package; its ``parallel_env`` already speaks the
Parallel API and offers ``state()``. Actions are discrete. simple_speaker_listener's two agents
have different observation (3, 11) and action (3, 5) sizes; ``common_spaces: true`` pads them to a
common size so one shared actor can serve both (``scenarios.adapt.FlatParallelEnv``, the adapter
every PettingZoo env goes through: zero-padded observations, the larger action space, each step's
``infos[agent]["action_mask"]`` marking the agent's real actions; an action outside an agent's real
range is played as its action 0, never chosen by a learner that honours the mask). Rewards are mpe2's own (negative distances; see each task's docs).

``scenario.engine`` (spread only): ``native`` (default) runs ``scenarios.spread_native.SpreadNative``,
a numpy re-implementation of simple_spread_v3 that equals mpe2 step by step on the same seeds and
actions (observations, rewards, state, terminations/truncations, agents list; compared in
tests/scenarios/test_spread_native.py) without mpe2's per-entity Python objects and AEC->parallel
wrappers; ``mpe2`` runs mpe2's own ``parallel_env``.

Registered as ``marlq/spread-v0`` and ``marlq/speaker_listener-v0``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pettingzoo
from mpe2 import simple_speaker_listener_v4, simple_spread_v3
from pettingzoo import ParallelEnv

from scenarios.adapt import FlatParallelEnv
from scenarios.spec import ScenarioSpec
from scenarios.spread_native import SpreadNative

SPREAD_ENGINES = ("native", "mpe2")


@dataclass
class SpreadConfig:
    """simple_spread_v3: N agents cover N landmarks; local_ratio weighs the collision penalty.

    ``engine``: ``native`` (numpy, same episodes as mpe2) or ``mpe2`` (mpe2's own environment).
    """

    n_agents: int = 3
    max_cycles: int = 25
    local_ratio: float = 0.5
    engine: str = "native"

    def validate(self) -> None:
        _check_engine(self.engine)


@dataclass
class SpeakerListenerConfig:
    """simple_speaker_listener_v4; ``common_spaces`` pads both agents to one observation/action size."""

    max_cycles: int = 25
    common_spaces: bool = False


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"scenario.{key} must be a positive integer, got {value!r}")
    return int(value)


def _check_engine(engine: Any) -> str:
    if engine not in SPREAD_ENGINES:
        raise ValueError(f"scenario.engine must be one of {', '.join(SPREAD_ENGINES)}, got {engine!r}")
    return engine


def spread_env(n_agents: int = 3, max_cycles: int = 25, local_ratio: float = 0.5,
               engine: str = "native") -> ParallelEnv:
    """simple_spread_v3 with discrete actions (native numpy or mpe2's), arguments checked with clear messages."""
    n_agents = _positive_int("n_agents", n_agents)
    max_cycles = _positive_int("max_cycles", max_cycles)
    if not 0.0 <= float(local_ratio) <= 1.0:
        raise ValueError(f"scenario.local_ratio must lie in [0, 1], got {local_ratio!r}")
    if _check_engine(engine) == "native":
        return SpreadNative(N=n_agents, local_ratio=float(local_ratio), max_cycles=max_cycles)
    return simple_spread_v3.parallel_env(
        N=n_agents, local_ratio=float(local_ratio), max_cycles=max_cycles, continuous_actions=False
    )


def speaker_listener_env(max_cycles: int = 25, common_spaces: bool = False) -> ParallelEnv:
    """mpe2's simple_speaker_listener_v4 with discrete actions, optionally padded to common spaces."""
    max_cycles = _positive_int("max_cycles", max_cycles)
    if not isinstance(common_spaces, bool):
        raise ValueError(f"scenario.common_spaces must be true or false, got {common_spaces!r}")
    env = simple_speaker_listener_v4.parallel_env(max_cycles=max_cycles, continuous_actions=False)
    return FlatParallelEnv(env, common_spaces=True, state="env") if common_spaces else env


def _make_spread(cfg: SpreadConfig, seed: int) -> ParallelEnv:
    env = spread_env(cfg.n_agents, cfg.max_cycles, cfg.local_ratio, cfg.engine)
    env.reset(seed=seed)
    return env


def _make_speaker_listener(cfg: SpeakerListenerConfig, seed: int) -> ParallelEnv:
    env = speaker_listener_env(cfg.max_cycles, cfg.common_spaces)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "spread": ScenarioSpec(
        config=SpreadConfig,
        make=_make_spread,
        kind="parallel",
        help="simple_spread_v3: N agents cover N landmarks (discrete actions; engine native | mpe2)",
    ),
    "speaker_listener": ScenarioSpec(
        config=SpeakerListenerConfig,
        make=_make_speaker_listener,
        kind="parallel",
        help="mpe2 simple_speaker_listener_v4: a speaker guides a listener to a landmark",
    ),
}

pettingzoo.register("parallel", "marlq/spread-v0", spread_env)
pettingzoo.register("parallel", "marlq/speaker_listener-v0", speaker_listener_env)
