"""marl_q.compiled: the one switch for numba-compiled loops (MARLQ_KERNELS) and its fallback."""
from __future__ import annotations

import numpy as np

from marl_q import compiled


def _total(x):
    s = 0
    for v in x:
        s += v
    return s


def test_marlq_kernels_0_turns_compiling_off_and_the_python_functions_run(monkeypatch):
    monkeypatch.setenv("MARLQ_KERNELS", "0")
    assert compiled.allowed() is False
    (f,) = compiled.njit_or_python(_total)
    assert f is _total and f(np.arange(5)) == 10


def test_allowed_compiles_and_the_compiled_loop_computes_the_same(monkeypatch):
    monkeypatch.delenv("MARLQ_KERNELS", raising=False)
    assert compiled.allowed() is True  # numba is a dependency of the project
    (f,) = compiled.njit_or_python(_total)
    assert f is not _total and f.py_func is _total
    x = np.arange(100, dtype=np.int64)
    assert f(x) == _total(x) == 4950


def test_circuits_kernels_ask_the_same_switch(monkeypatch):
    from circuits import kernels
    monkeypatch.setenv("MARLQ_KERNELS", "0")
    monkeypatch.setattr(kernels, "_NUMBA", None)
    assert kernels.available() is False
