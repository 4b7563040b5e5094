"""Fill the registries from the other packages: the one place marl_q reaches outside itself."""
from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib import metadata
from types import ModuleType

from marl_q import registry

# Modules whose import registers components, or which export plain dicts to register.
PLUGIN_MODULES = ["marl_q.staleness", "marl_q.aggregation", "marl_q.backends", "marl_q.bench", "agents",
                  "scenarios", "circuits.heads", "circuits.bench", "circuits.spec"]
# Packages whose every module may export PLOTS / COMMANDS / BENCHES (found without a list to edit).
DISCOVERED_PACKAGES = ["analysis"]
# Out-of-tree plugins: an installed distribution declares, in its pyproject.toml,
#   [project.entry-points."marl_q.plugins"]
#   my_plugin = "my_package.marlq_plugin"
# and that module is imported like the ones above: it registers algorithms and heads on import
# (ALGORITHMS.add / HEADS.add) and may export SCENARIOS, HEADS, BENCHES, PLOTS, COMMANDS.
ENTRY_POINT_GROUP = "marl_q.plugins"
_loaded = False


def load_plugins() -> None:
    """Import every plugin module once; a module that does not exist yet is simply absent."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in PLUGIN_MODULES + _discover():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # that package is not there (yet); nothing to register
            raise
        register_module(module)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken third-party plugin must not stop marl-q: say which
            print(f"marlq: plugin {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        if isinstance(loaded, ModuleType):
            register_module(loaded)


def register_module(module: ModuleType) -> None:
    """Register what a plugin module exports (its own registrations ran when it was imported)."""
    for spec_name, spec in getattr(module, "SCENARIOS", {}).items():
        registry.SCENARIOS.add(spec_name, spec, config=spec.config, help=spec.help)
    for spec_name, spec in getattr(module, "HEADS", {}).items():
        registry.HEADS.add(spec_name, spec.build, config=spec.config, help=spec.help)
    for table in ("ANSATZE", "ENCODINGS", "OBSERVABLES"):  # circuit blocks: objects with .help
        for spec_name, spec in getattr(module, table, {}).items():
            getattr(registry, table).add(spec_name, spec, help=spec.help)
    for spec_name, fn in getattr(module, "BENCHES", {}).items():
        registry.BENCHES.add(spec_name, fn, help=_first_line(fn.__doc__))
    for spec_name, fn in getattr(module, "PLOTS", {}).items():
        registry.PLOTS.add(spec_name, fn, help=_first_line(fn.__doc__))
    for spec_name, fn in getattr(module, "COMMANDS", {}).items():
        registry.COMMANDS.add(spec_name, fn, help=_first_line(fn.__doc__))


def _discover() -> list[str]:
    names = []
    for package in DISCOVERED_PACKAGES:
        try:
            pkg = importlib.import_module(package)
        except ModuleNotFoundError:
            continue
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    return sorted(names)


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""
