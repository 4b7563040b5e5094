"""What a run sets in its process for the native libraries under numpy: BLAS threads and glibc's allocator.
``prepare_process`` applies both; every run calls it first (``marl_q.experiment``, ``marlq bench``, and
``agents.actor_critic.numpy_epochs`` for a caller of the update itself).

**numpy's BLAS on one thread** (``single_thread_blas``). OpenBLAS starts as many threads as cores, and some
of its products (the update's (64, 1200) @ (1200, 64) weight gradients among them) split their sums
across threads, so their last bits depend on the thread count. A process's count also changed under a
run: the circuit executors set it to one on their first call (spinning workers cost several times the
CPU time of one thread on a busy machine, far more in a process pinned to one CPU). So a run whose
numpy products came before a quantum run in the same process gave other bytes than in a fresh one
(the golden runner found it: spread_mappo.yaml after cartpole_qdqn_skolik.yaml). Every run now takes
one thread from its start: the bytes no longer depend on what the process ran before. torch's own pool is
left alone (``torch.set_num_threads``, ``backend.threads_per_worker``).

**The allocator** (``keep_freed_memory``). A learner's update makes and drops the same few arrays every
minibatch: activations and gradients of (rows, 64) float32, 300 KB each for spread's MAPPO. glibc serves
blocks above its mmap threshold (128 KB at first, raised as they are freed) with fresh mappings, and
hands the top of its heap back to the kernel once more than its trim threshold lies free there. Either
way the next minibatch's arrays start as untouched pages, and the page faults cost more than the
arithmetic: ``g * (1 - h * h)`` on two (1200, 64) float32 blocks took 186 us at glibc's defaults and 16
us with the settings below (AMD EPYC Zen 5, numpy 2.4), and a 100k-step ``spread_mappo.yaml`` run took
58k minor page faults against 130k-230k, and 4-5% less time (docs/performance.md). ``keep_freed_memory``
raises both thresholds (blocks up to 32 MiB come from the heap, up to 256 MiB of free heap is kept) and
pads each heap growth by 16 MiB. It changes where arrays lie, never what is computed. A no-op where the
C library has no ``mallopt`` (not glibc).
"""
from __future__ import annotations

import ctypes
import sys

_blas_single_thread = False


def prepare_process() -> None:
    """numpy's BLAS on one thread and the allocator keeping freed memory (both once per process)."""
    single_thread_blas()
    keep_freed_memory()


def single_thread_blas(loaded: bool = False) -> None:
    """numpy's BLAS to one thread, once per process. ``loaded``: again, after a library of its own was loaded
    (scipy's BLAS, ``circuits.statevector.conjugating_gemm``): a limit reaches only the libraries loaded
    when it is set."""
    global _blas_single_thread
    if not _blas_single_thread or loaded:
        _blas_single_thread = True
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")


# ----------------------------------------------------------------------------- the allocator
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's <malloc.h>
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 256 << 20), (M_TOP_PAD, 16 << 20))

_applied = False


def keep_freed_memory() -> bool:
    """Apply ``SETTINGS`` through glibc's ``mallopt`` once per process; whether they are in force."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to load, or one without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in SETTINGS)
    return _applied
