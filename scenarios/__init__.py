"""Environments of marl-q and their YAML scenario files.

Every module in this package may export ``SCENARIOS = {name: ScenarioSpec(...)}``; they are
collected here into one dict the runtime registers. Modules are found automatically, so adding a
scenario touches only its own file.
"""
from __future__ import annotations

import importlib
import pkgutil

from scenarios.spec import ScenarioSpec

SCENARIOS: dict[str, ScenarioSpec] = {}


def _collect() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "spec":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, spec in getattr(module, "SCENARIOS", {}).items():
            if name in SCENARIOS:
                raise RuntimeError(f"scenario {name!r} is defined twice ({module.__name__})")
            SCENARIOS[name] = spec


_collect()
