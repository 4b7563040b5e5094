"""Registries: a name in YAML -> the class or factory that implements it (the EPyMARL way).

Code never branches on these names elsewhere; it asks the registry. A registry fills itself on first
use: the plugin index (``marl_q.plugins``) declares every name with the module that registers it,
read from the modules' source, and a name's module is imported when the name is first looked up
(``get``), so a command imports only what it uses. Iterating a registry imports all of its modules.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional

from marl_q import plugins
from marl_q.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    """One registered component: the object, its config dataclass (or None) and a one-line help."""

    name: str
    obj: Any
    config: Optional[type]
    help: str


class Registry:
    """A string -> component table with helpful errors for unknown names.

    Besides the registered entries it holds declared ones: a name and the module whose import
    registers it (``declare``), and modules that register names the index could not read
    (``declare_source``), imported only when a lookup needs them.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._view = MappingProxyType(self._entries)  # ``registered``
        self._declared: dict[str, tuple[str, Optional[str]]] = {}  # name -> (module, help or None: unknown)
        self._sources: list[str] = []
        self._indexed = False  # whether the plugin index has declared this registry's names

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

    def replace(self, name: str, obj: Any, *, config: Optional[type] = None, help: str = "") -> None:
        """Register ``obj`` under ``name`` in place of whatever was there (a test's stand-in)."""
        self._entries[name] = Entry(name, obj, config, help)

    def remove(self, name: str) -> None:
        """Forget the registered entry ``name`` (undoing a ``replace`` of a name that was not there)."""
        del self._entries[name]

    @property
    def registered(self) -> Mapping[str, Entry]:
        """The entries registered so far, in the order they were, read-only and live: nothing is indexed
        or imported (what ``circuits.blocks``' tables read: a block is registered when its module is imported)."""
        return self._view

    def declare(self, name: str, module: str, help: Optional[str] = None) -> None:
        """Importing ``module`` registers ``name`` (``help``: its one-line help, None if only the import
        tells); the module is imported when the name is first looked up."""
        if name not in self._entries:
            self._declared.setdefault(name, (module, help))

    def declare_source(self, module: str) -> None:
        """``module`` registers names here that only its import tells (imported to list or find them)."""
        if module not in self._sources:
            self._sources.append(module)

    def get(self, name: str, *, key: str = "") -> Entry:
        """The entry for ``name`` (importing its module on first use); a ConfigError listing the choices
        (and the closest) otherwise."""
        if not self._indexed:
            _index(self)
        if name not in self._entries and name in self._declared:
            module = self._declared[name][0]
            _import(module)
            if name not in self._entries:
                raise RuntimeError(f"{self.kind} {name!r}: module {module} was read as registering it, "
                                   "but its import did not")
        if name not in self._entries:
            self._load_sources()
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(unknown_choice_message(key or self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        """Every name, registered or declared (nothing is imported but modules the index could not read)."""
        if not self._indexed:
            _index(self)
        self._load_sources()
        return sorted(set(self._entries) | set(self._declared))

    def describe(self) -> list[tuple[str, str]]:
        """(name, one-line help) of every name; imports only the modules whose help the index could not read."""
        out = []
        for name in self.names():
            help = self._entries[name].help if name in self._entries else self._declared[name][1]
            out.append((name, help if help is not None else self.get(name).help))
        return out

    def load_all(self) -> None:
        """Import every module that registers here (what iterating needs)."""
        if not self._indexed:
            _index(self)
        self._load_sources()
        for name in [n for n in self._declared if n not in self._entries]:
            self.get(name)

    def __contains__(self, name: object) -> bool:
        if not self._indexed:
            _index(self)
        if name in self._entries or name in self._declared:
            return True
        self._load_sources()
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        self.load_all()
        return iter(self._entries[n] for n in sorted(self._entries))

    def _load_sources(self) -> None:
        for module in list(self._sources):
            _import(module)


def _index(reg: Registry) -> None:
    """Declare the plugins' names of ``reg`` (once per process; marl_q.plugins); a registry made
    elsewhere has no index."""
    regs = registries()
    names = [name for name, r in regs.items() if r is reg]
    if names:
        plugins.index_plugins(regs, names)
    reg._indexed = True


def _import(module: str) -> None:
    """Import a plugin module and register what it exports (marl_q.plugins)."""
    plugins.import_plugin(module, registries())


def registries() -> dict[str, Registry]:
    """Every registry of this module by its name (ALGORITHMS, HEADS, ...): the tables the plugin index fills."""
    return {name: reg for name, reg in globals().items() if isinstance(reg, Registry)}


def index_plugins(names: Optional[list[str]] = None) -> None:
    """Declare the plugins' names of the registries ``names`` (``["COMMANDS"]``; all when None), read from
    their source, nothing imported (``marl_q.plugins.index_plugins``)."""
    plugins.index_plugins(registries(), names)


def load_plugins() -> None:
    """Import every plugin module and register what it exports (what a full listing or a test over all
    components needs; a lookup by name imports only its own module)."""
    plugins.load_plugins(registries())


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
# the building blocks of the quantum heads' circuits (listed by `marlq list`; the heads' configs validate them):
# the one table of each kind (circuits.blocks.register adds to it; circuits.blocks' ANSATZE etc. are views of it)
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


ENV_KINDS = {"parallel": "a multi-agent PettingZoo ParallelEnv", "gym_vector": "a single-agent vector environment",
             "aec": "a turn-based (AEC) game"}


def cannot_take_turns(cfg: Any) -> ConfigError:
    """The one error of a learner given a turn-based (AEC) game it cannot play (agents/turn_based.py)."""
    return ConfigError(f"algorithm {cfg.algorithm.name} cannot take turns: scenario {cfg.scenario.name!r} "
                       f"({getattr(cfg.scenario.params, 'env', '')}) is a turn-based (AEC) game; use ippo, ia2c or dqn")


def make_env(cfg: Any, seed: int, kind: str) -> Any:
    """The scenario's environment, seeded; a ConfigError naming the algorithm and the scenario when
    the scenario is not of ``kind`` (``parallel`` | ``gym_vector``) or its name is unknown."""
    spec = SCENARIOS.get(cfg.scenario.name, key="scenario.name").obj
    actual = spec.kind_for(cfg.scenario.params)  # gymnasium: single-agent, or multi-agent (Tuple spaces)
    if actual == "aec" and kind != "aec":  # the families that take turns ask for kind aec (agents/turn_based.py)
        raise cannot_take_turns(cfg)
    if actual != kind:
        hint = "; use scenario.name: pettingzoo" if kind == "parallel" else "; use scenario.name: gymnasium"
        raise ConfigError(f"algorithm {cfg.algorithm.name}: scenario {cfg.scenario.name!r} is not "
                          f"{ENV_KINDS.get(kind, kind)} (kind {actual!r}){hint}")
    return spec.make(cfg.scenario.params, seed=seed)


def algorithm_class(cfg: Any) -> Any:
    """The class that runs ``cfg``: ``algorithm.name``'s, or for a run with one learner per team
    (``learners:``) the class its family names in ``team_learners`` (``"module:Class"``, imported here:
    the team actor-critics' is agents.team_learners.TeamLearners); a ConfigError when the family has none."""
    import importlib

    cls = ALGORITHMS.get(cfg.algorithm.name, key="algorithm.name").obj
    if not getattr(cfg, "learners", None):
        return cls
    where = getattr(cls, "team_learners", None)
    if where is None:
        raise ConfigError(f"learners: algorithm {cfg.algorithm.name!r} cannot train one learner per team "
                          "(algorithm.name and each learner's name must be ippo, mappo, ia2c or maa2c)")
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
