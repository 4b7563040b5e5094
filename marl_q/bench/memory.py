"""The resident memory of this process, from /proc/self/status (Linux; nothing elsewhere)."""
from __future__ import annotations

import time
from typing import Optional


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

