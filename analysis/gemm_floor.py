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

Since PPO's epochs on ``mlp`` heads run in numpy (``agents.actor_critic.numpy_epochs``), torch's profiler
no longer sees their products. For them:

    python -m analysis.gemm_floor --numpy-mlp 18-64-64-5,18-64-64-1 --rows 1536 --rows-per-env-step 12

times, with numpy on one thread, exactly the products one minibatch of ``--rows`` rows makes through the
twins of those heads (each linear layer's forward, its weight gradient, and its input gradient but the
first layer's), and prints their FLOPs and time per minibatch and per env step (``--rows-per-env-step``:
the rows an env step puts through the heads over an update, epochs x agents: 4 x 3 for IPPO at JaxMARL's
settings, 10 x 3 for spread's MAPPO).
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


def numpy_mlp_products(rows: int, heads: list[list[int]], repeats: int = 200) -> tuple[float, float]:
    """(FLOPs, seconds) of one minibatch's products through float32 numpy MLPs of the layer widths ``heads``
    (e.g. [[18, 64, 64, 5], [18, 64, 64, 1]]), as ``NumpyMLP`` makes them: per layer the forward h @ W^T, the
    weight gradient g^T @ h and, but at the first layer, the input gradient g @ W (a one-wide output's by
    broadcasting, as the twin does). The best of five timings of ``repeats`` minibatches."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    products, flops = [], 0.0
    for widths in heads:
        for layer, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
            h, w = rng.standard_normal((rows, n_in), dtype=np.float32), rng.standard_normal((n_out, n_in), dtype=np.float32)
            g = rng.standard_normal((rows, n_out), dtype=np.float32)
            products += [(h, w.T), (g.T, h)]
            flops += 2 * 2.0 * rows * n_in * n_out
            if layer > 0:
                products.append((g, w))
                flops += 2.0 * rows * n_in * n_out
    with threadpool_limits(limits=1, user_api="blas"):
        def minibatch() -> None:
            for a, b in products:
                if a.shape[1] == 1:
                    a * b
                else:
                    a @ b
        for _ in range(10):
            minibatch()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                minibatch()
            best = min(best, (time.perf_counter() - start) / repeats)
    return flops, best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", help="a scenario file (the profiled run's floor)")
    parser.add_argument("--steps", type=int, default=30000, help="env steps of the profiled run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--numpy-mlp", metavar="W-W-...,W-W-...",
                        help="instead of a run: each numpy head's layer widths, input first, e.g. 18-64-64-5,18-64-64-1")
    parser.add_argument("--rows", type=int, help="with --numpy-mlp: rows of one minibatch")
    parser.add_argument("--rows-per-env-step", type=float,
                        help="with --numpy-mlp: rows an env step puts through the heads over an update (epochs x agents)")
    args = parser.parse_args(argv)
    if args.numpy_mlp is not None:
        return numpy_products(parser, args)
    if args.scenario is None:
        parser.error("give a scenario file, or --numpy-mlp with --rows and --rows-per-env-step")
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


def numpy_products(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--numpy-mlp``: the products of PPO's numpy epochs on mlp heads, per minibatch and per env step."""
    try:
        heads = [[int(w) for w in head.split("-")] for head in args.numpy_mlp.split(",")]
    except ValueError:
        parser.error(f"--numpy-mlp: widths are integers joined by '-', heads by ',', got {args.numpy_mlp!r}")
    if args.rows is None or args.rows_per_env_step is None:
        parser.error("--numpy-mlp needs --rows and --rows-per-env-step")
    if args.rows < 1 or args.rows_per_env_step <= 0 or any(len(h) < 2 or min(h) < 1 for h in heads):
        parser.error("--rows and --rows-per-env-step must be positive, and each head needs two or more positive widths")
    flops, seconds = numpy_mlp_products(args.rows, heads)
    per_step = seconds / args.rows * args.rows_per_env_step
    print(f"numpy float32 products of heads {args.numpy_mlp}, {args.rows} rows a minibatch: {flops / 1e6:.1f} MFLOP in "
          f"{seconds * 1e6:.0f} us ({flops / seconds / 1e9:.1f} GFLOP/s); at {args.rows_per_env_step:g} rows per env step "
          f"{flops / args.rows * args.rows_per_env_step / 1e6:.2f} MFLOP and {per_step * 1e6:.2f} us per env step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
