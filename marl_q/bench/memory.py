"""The resident memory of this process, from /proc/self/status (Linux; nothing elsewhere), and where its
Python allocations grow (tracemalloc)."""
from __future__ import annotations

import time
from typing import Any, Optional


def proc_status_kb(field_name: str) -> Optional[int]:
    """A kB field of /proc/self/status (VmRSS: resident now, VmHWM: peak resident); None off Linux."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class MemorySampler:
    """(seconds, VmRSS kB) of this process, at most every `every_s` seconds."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self.t0 = time.perf_counter()
        self.next = 0.0
        self.series: list[tuple[float, int]] = []

    def sample(self, force: bool = False) -> None:
        t = time.perf_counter() - self.t0
        if force or t >= self.next:
            self.next = t + self.every_s
            kb = proc_status_kb("VmRSS")
            if kb is not None:
                self.series.append((round(t, 3), kb))

    def peak_kb(self) -> Optional[int]:
        return proc_status_kb("VmHWM")



class HeapTracer:
    """Where this process's Python allocations grow: a tracemalloc snapshot ``after_s`` seconds after
    ``start()`` (the baseline, once start-up allocations are done) against the latest one.

    Memory that grows in RSS but not here is native (an extension's C/C++ heap, or the allocator's
    fragmentation), which tracemalloc cannot see."""

    def __init__(self, after_s: float, every_s: float = 5.0, frames: int = 8) -> None:
        self.after_s, self.every_s, self.frames = after_s, every_s, frames
        self.t0: Optional[float] = None
        self.next = 0.0
        self.base = self.last = None
        self.base_t = self.last_t = 0.0

    def start(self) -> None:
        import tracemalloc

        if self.t0 is None:
            tracemalloc.start(self.frames)
            self.t0 = time.perf_counter()
            self.next = self.after_s

    def sample(self) -> None:
        import tracemalloc

        if self.t0 is None:
            return
        t = time.perf_counter() - self.t0
        if t < self.next:
            return
        self.next = t + self.every_s
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if self.base is None:
            self.base, self.base_t = snap, t
        else:
            self.last, self.last_t = snap, t

    def growth(self, top: int = 12) -> dict[str, Any]:
        """The traced total at the baseline and at the latest snapshot, and the ``top`` lines (their
        allocating stack's innermost frames) that grew most between them."""
        if self.base is None or self.last is None:
            return {"seconds": 0.0, "lines": []}
        stats = self.last.compare_to(self.base, "traceback")
        lines = []
        for st in stats[:top]:
            frames = [f"{fr.filename.rsplit('site-packages/', 1)[-1]}:{fr.lineno}" for fr in st.traceback][-3:]
            lines.append({"grew_kb": round(st.size_diff / 1024, 1), "blocks_grew": st.count_diff,
                          "kb": round(st.size / 1024, 1), "where": " <- ".join(reversed(frames))})
        return {"seconds": round(self.last_t - self.base_t, 1),
                "traced_mb": [round(sum(s.size for s in snap.statistics("filename")) / 2**20, 2)
                              for snap in (self.base, self.last)],
                "lines": lines}
