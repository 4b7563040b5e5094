"""Registries: a name in YAML -> the class or factory that implements it (the EPyMARL way).

Code never branches on these names elsewhere; it asks the registry.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from marl_q.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    """One registered component: the object, its config dataclass (or None) and a one-line help."""

    name: str
    obj: Any
    config: Optional[type]
    help: str


class Registry:
    """A string -> component table with helpful errors for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, *, config: Optional[type] = None, help: str = "") -> Callable[[Any], Any]:
        """Decorator form: ``@ALGORITHMS.register("a3c", config=Cfg, help=...)``."""

        def deco(obj: Any) -> Any:
            self.add(name, obj, config=config, help=help)
            return obj

        return deco

    def add(self, name: str, obj: Any, *, config: Optional[type] = None, help: str = "") -> None:
        """Register ``obj`` under ``name``; registering the same object twice is a no-op."""
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise RuntimeError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = Entry(name, obj, config, help)

    def get(self, name: str, *, key: str = "") -> Entry:
        """The entry for ``name``; a ConfigError listing the choices (and the closest) otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(unknown_choice_message(key or self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries[n] for n in self.names())


def unknown_choice_message(key: str, value: object, choices: list[str]) -> str:
    """'key: unknown value 'x'; did you mean 'y'? choices: a, b, c'."""
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown value {value!r}{hint} (choices: {', '.join(choices)})"


ALGORITHMS = Registry("algorithm")
HEADS = Registry("head")
SCENARIOS = Registry("scenario")
BACKENDS = Registry("backend")
AGGREGATIONS = Registry("aggregation")
STALENESS = Registry("staleness rule")
BENCHES = Registry("benchmark")
PLOTS = Registry("plot set")  # run directories -> PNGs; "standard" draws the plots of every run
COMMANDS = Registry("command")  # extra `marlq NAME ...` commands (analysis reports), callable(argv) -> int
# the building blocks of the quantum heads' circuits (listed by `marlq list`; the heads' configs validate them)
ANSATZE = Registry("ansatz")
ENCODINGS = Registry("encoding")
OBSERVABLES = Registry("observable")

ALL = {
    "algorithms": ALGORITHMS,
    "heads": HEADS,
    "scenarios": SCENARIOS,
    "backends": BACKENDS,
    "aggregations": AGGREGATIONS,
    "staleness": STALENESS,
    "benches": BENCHES,
    "commands": COMMANDS,
    "ansatze": ANSATZE,
    "encodings": ENCODINGS,
    "observables": OBSERVABLES,
}


ENV_KINDS = {"parallel": "a multi-agent PettingZoo ParallelEnv", "gym_vector": "a single-agent vector environment"}


def make_env(cfg: Any, seed: int, kind: str) -> Any:
    """The scenario's environment, seeded; a ConfigError naming the algorithm and the scenario when
    the scenario is not of ``kind`` (``parallel`` | ``gym_vector``) or its name is unknown."""
    spec = SCENARIOS.get(cfg.scenario.name, key="scenario.name").obj
    if spec.kind != kind:
        hint = "; use scenario.name: pettingzoo" if kind == "parallel" else "; use scenario.name: gymnasium"
        raise ConfigError(f"algorithm {cfg.algorithm.name}: scenario {cfg.scenario.name!r} is not "
                          f"{ENV_KINDS.get(kind, kind)} (kind {spec.kind!r}){hint}")
    return spec.make(cfg.scenario.params, seed=seed)
