"""The floor that a run's matrix products set on its speed: their FLOPs per env step, the rate torch
reaches on them in the run, and the machine's one-thread rate on a large square product.

    python -m analysis.gemm_floor scenarios/spread_qmix.yaml --steps 30000 \\
        --set 'scenario={name: lbf, task: "Foraging-8x8-2p-2f-coop-v3"}'

runs the file (one thread, ``run.plots=false``) under ``torch.profiler`` with FLOP counting and prints,
per env step: the FLOPs of torch's matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``: the
linear layers, forward and backward, and QMIX's mixer), their time and rate in the run, and the time
they would take at the large-product rate. For a learner whose work per env step is fixed by its
recipe (a value-based update of B transitions every 1/ratio env steps), the last two bound how fast
any implementation on this CPU can be: a peer's time per env step divided by them is the most a
speed-up over the peer can be. docs/value_based.md ("Against EPyMARL") has the figures. Numpy work
(the agents' acting through the numpy twins) is not counted: the floor is a lower bound.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def gemm_profile(fn: Callable[[], object]) -> tuple[float, float]:
    """(FLOPs, seconds) of torch's matrix products while ``fn()`` runs (their own time, not their
    callers')."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    flops = seconds = 0.0
    for event in prof.key_averages():
        if event.key in GEMM_OPS:
            flops += event.flops
            seconds += event.self_cpu_time_total / 1e6
    return flops, seconds


def peak_gemm_rate(n: int = 512, repeats: int = 50) -> float:
    """FLOP/s of an n x n by n x n float32 product on the current threads: the best of three timings."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2.0 * n ** 3 / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="a scenario file")
    parser.add_argument("--steps", type=int, default=30000, help="env steps of the profiled run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be positive")
    torch.set_num_threads(1)
    from marl_q.cli import main as marlq
    out = Path(tempfile.mkdtemp(prefix="gemm_floor_")) / "run"
    sets = [x for kv in [*args.set, f"run.total_env_steps={args.steps}", "run.plots=false"] for x in ("--set", kv)]
    code = 0

    def run() -> None:
        nonlocal code
        code = marlq(["run", args.scenario, *sets, "--quiet", "--out", str(out)]) or 0

    flops, seconds = gemm_profile(run)
    if code:
        return int(code)
    peak = peak_gemm_rate()
    per_step = flops / args.steps
    print(f"{args.scenario}, {args.steps} env steps: matrix products {per_step / 1e6:.2f} MFLOP per env step; "
          f"in the run {seconds / args.steps * 1e6:.1f} us per env step ({flops / max(seconds, 1e-12) / 1e9:.1f} GFLOP/s); "
          f"at the large-product rate ({peak / 1e9:.1f} GFLOP/s, 512^3, one thread) {per_step / peak * 1e6:.1f} us per env step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
