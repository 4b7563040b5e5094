"""Environments of marl-q and their YAML scenario files.

Every module in this package may export ``SCENARIOS = {name: ScenarioSpec(...)}``; they are
collected here into one dict the runtime registers. Modules are found automatically, so adding a
scenario touches only its own file.

``import scenarios`` imports every module, so that each ``marlq/<name>-v0`` environment is
registered with PettingZoo (``pettingzoo.make("parallel", "marlq/spread-v0")``). The one exception
is ``python -m scenarios.<module>``: while the interpreter imports this package on the way to that
module (``sys.argv[0] == "-m"`` then), collecting is left to first use, so that runpy does not find
the module imported before it runs it.
"""
from __future__ import annotations

import sys

from scenarios.spec import ScenarioSpec

_SCENARIOS: dict[str, ScenarioSpec] = {}
_collected = False


def _collect() -> dict[str, ScenarioSpec]:
    global _collected
    if not _collected:
        _collected = True
        from marl_q.plugins import import_package  # how every plugin package's modules are found

        for module in import_package(__name__):
            for name, spec in getattr(module, "SCENARIOS", {}).items():
                if name in _SCENARIOS:
                    raise RuntimeError(f"scenario {name!r} is defined twice ({module.__name__})")
                _SCENARIOS[name] = spec
    return _SCENARIOS


def __getattr__(name: str) -> dict[str, ScenarioSpec]:
    # collected on first use, not on import: `python -m scenarios.<module>` then runs that module
    # without the package having imported it first (runpy's RuntimeWarning)
    if name == "SCENARIOS":
        return _collect()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not (sys.argv and sys.argv[0] == "-m"):
    _collect()
