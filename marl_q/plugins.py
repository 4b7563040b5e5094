"""Fill the registries from the other packages: the one place marl_q reaches outside itself."""
from __future__ import annotations

import importlib

from marl_q import registry

# Modules whose import registers components, or which export plain dicts to register.
PLUGIN_MODULES = ["marl_q.staleness", "marl_q.aggregation", "marl_q.backends", "agents", "scenarios", "circuits.heads", "circuits.bench"]
_loaded = False


def load_plugins() -> None:
    """Import every plugin module once; a module that does not exist yet is simply absent."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # that package is not there (yet); nothing to register
            raise
        for spec_name, spec in getattr(module, "SCENARIOS", {}).items():
            registry.SCENARIOS.add(spec_name, spec, config=spec.config, help=spec.help)
        for spec_name, spec in getattr(module, "HEADS", {}).items():
            registry.HEADS.add(spec_name, spec.build, config=spec.config, help=spec.help)
        for spec_name, fn in getattr(module, "BENCHES", {}).items():
            registry.BENCHES.add(spec_name, fn, help=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
