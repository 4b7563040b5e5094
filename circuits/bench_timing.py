"""What the circuit benches share: argument parsing, timing per call (wall or CPU clock, GPU work
waited for) and the JSON report. Its own module so that the benches (bench, bench_noise, peer_bench)
import it and not each other."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch


def parse_ints(text: str) -> list[int]:
    """'1,64,1024' -> [1, 64, 1024]."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(call: Callable[[], Any], device: torch.device, min_time: float, min_calls: int = 3,
                  repeat_s: float | None = None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds per call over repeats of about ``repeat_s`` each (min_time/5 by default), after
    two warm-up calls. ``clock`` is wall time by default; ``time.process_time`` (the process's CPU
    time, all threads) leaves out the time a shared machine's other processes take the CPU."""
    for _ in range(2):
        call()
    synchronize(device)
    start = clock()
    call()
    synchronize(device)
    once = max(clock() - start, 1e-7)
    per_repeat = max(1, int((min_time / 5 if repeat_s is None else repeat_s) / once))
    samples: list[float] = []
    deadline = time.perf_counter() + min_time
    while len(samples) < min_calls or time.perf_counter() < deadline:
        start = clock()
        for _ in range(per_repeat):
            call()
        synchronize(device)
        samples.append((clock() - start) / per_repeat)
    return statistics.median(samples)


def write_json(report: dict[str, Any], target: str) -> None:
    """The report as JSON to a file, or to stdout for '-'."""
    text = json.dumps(report, indent=1)
    if target == "-":
        print(text)
    else:
        with open(target, "w") as handle:
            handle.write(text + "\n")
