"""Learning algorithms and classical heads; each module registers itself with marl_q's registries.

Modules are imported automatically, so adding an algorithm touches only its own file.
"""
from __future__ import annotations

import importlib
import pkgutil


def _import_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_all()
