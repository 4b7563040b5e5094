"""The record a scenario module exports so the runtime can register it (no marl_q import here)."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np


class ScenarioSpec(NamedTuple):
    """How to build one environment: its config dataclass, a factory ``make(cfg, seed)`` and its kind.

    kind: ``gym_vector`` (a Gymnasium VectorEnv), ``parallel`` (a PettingZoo ParallelEnv) or
    ``custom`` (an object the matching algorithm knows how to drive). A scenario whose kind depends
    on its config (``gymnasium``: a single-agent env, or a multi-agent one with Tuple spaces) gives
    ``kind_of(cfg)``; ``kind`` is then the kind of its default config.
    """

    config: type
    make: Callable[..., Any]
    kind: str
    help: str
    kind_of: Optional[Callable[[Any], str]] = None

    def kind_for(self, cfg: Any) -> str:
        """The kind of env ``make(cfg, ...)`` returns for this scenario config."""
        return self.kind_of(cfg) if self.kind_of is not None else self.kind


def check_cue_game_sizes(n_agents: Any, n_cues: Any, episode_length: Any) -> None:
    """The sizes the cue games (team_cue, penalty_cue) share: positive integers, at least two cues."""
    for key, value in {"n_agents": n_agents, "n_cues": n_cues, "episode_length": episode_length}.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"scenario.{key} must be a positive integer, got {value!r}")
    if n_cues < 2:
        raise ValueError(f"scenario.n_cues must be at least 2 (one cue is no game), got {n_cues}")


def cue_game_actions(game: str, actions: dict[str, Any], agents: list[str], n_actions: int) -> np.ndarray:
    """The cue games' joint action as an int array in ``agents``' order, after the checks they share: one action
    per live agent, each in ``0..n_actions - 1`` (a ValueError naming the game otherwise)."""
    if set(actions) != set(agents):
        raise ValueError(f"{game} step needs one action per live agent {agents}, got {sorted(actions)}")
    chosen = np.array([int(actions[a]) for a in agents])
    if np.any((chosen < 0) | (chosen >= n_actions)):
        raise ValueError(f"{game} actions must lie in 0..{n_actions - 1}, got {chosen.tolist()}")
    return chosen
