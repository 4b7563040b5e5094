"""marl_q.native: what every run sets for numpy's native libraries (one BLAS thread, glibc's allocator)."""
from __future__ import annotations

import ctypes
import sys

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from marl_q import native


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_single_thread_blas_sets_every_loaded_blas_to_one_thread():
    with threadpool_limits(limits=2, user_api="blas"):
        native.single_thread_blas(loaded=True)  # (loaded: apply again, as after a library was loaded)
        threads = _blas_threads()
        assert threads and all(n == 1 for n in threads)
    native.single_thread_blas(loaded=True)  # the process keeps one thread after the block restored two


def test_prepare_process_leaves_what_numpy_computes_alone():
    """The allocator's settings move where arrays lie, not their values: a product and a tanh before and
    after are the same bytes."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
    native.single_thread_blas(loaded=True)
    before = (a @ b).tobytes(), np.tanh(a).tobytes()
    native.prepare_process()
    assert ((a @ b).tobytes(), np.tanh(a).tobytes()) == before


def test_keep_freed_memory_applies_where_glibc_is_and_once():
    """On glibc (Linux) the settings are applied and stay; where the C library has no ``mallopt`` the call is
    a no-op that says so."""
    glibc = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallopt")
    assert native.keep_freed_memory() is glibc
    assert native.keep_freed_memory() is glibc  # the second call finds it as the first left it
