"""Whether numba-compiled loops run here, in one place: numba importable and ``MARLQ_KERNELS`` not "0".

``circuits.kernels`` (the circuits' compiled kernels) and the native envs' loops (``scenarios.lbf_native``,
``scenarios.rware_native``) ask ``allowed()``; where it is false they run their numpy or plain
Python paths, which compute the same thing. ``MARLQ_KERNELS=0`` turns every compiled loop off, for a
comparison or on a machine where numba misbehaves.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Callable


def allowed() -> bool:
    """numba can be imported and ``MARLQ_KERNELS`` is not "0"."""
    return os.environ.get("MARLQ_KERNELS", "1") != "0" and importlib.util.find_spec("numba") is not None


def njit_or_python(*funcs: Callable) -> tuple[Callable, ...]:
    """Each function compiled by ``numba.njit(cache=True)`` (machine code cached on disk beside the module)
    where ``allowed()``, else the functions themselves."""
    if not allowed():
        return funcs
    from numba import njit
    return tuple(njit(cache=True)(f) for f in funcs)
