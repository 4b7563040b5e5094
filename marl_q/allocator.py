"""glibc's allocator, told to keep the memory a training loop frees and takes again.

A learner's update makes and drops the same few arrays every minibatch: activations and gradients of
(rows, 64) float32, 300 KB each for spread's MAPPO. glibc serves blocks above its mmap threshold (128 KB
at first, raised as they are freed) with fresh mappings, and hands the top of its heap back to the
kernel once more than its trim threshold lies free there. Either way the next minibatch's arrays start
as untouched pages, and the page faults cost more than the arithmetic: ``g * (1 - h * h)`` on two
(1200, 64) float32 blocks took 186 us at glibc's defaults and 16 us with the settings below (AMD EPYC
Zen 5, numpy 2.4), and a 100k-step ``spread_mappo.yaml`` run took 58k minor page faults against
130k-230k, and 4-5% less time (docs/performance.md, "The allocator").

``keep_freed_memory`` raises both thresholds (blocks up to 32 MiB come from the heap, up to 256 MiB of
free heap is kept) and pads each heap growth by 16 MiB. It changes where arrays lie, never what is
computed: the same run writes the same bytes. A no-op where the C library has no ``mallopt`` (not
glibc). Every run calls it (``marl_q.experiment``, ``marlq bench``); the process keeps it.
"""
from __future__ import annotations

import ctypes
import sys

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
