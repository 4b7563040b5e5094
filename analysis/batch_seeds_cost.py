"""Marginal CPU time per env step of batched seeds against single-seed runs, in one process, interleaved.

A single-seed run (``run_experiment``) and a batched run of S seeds (``agents.batched_a2c``) each run at
two budgets; the difference between the two budgets' CPU times removes the set-up, so the figures are
what a long run pays per step. Repeated ``--rounds`` times, single and batched alternating, with
``uptime`` before and after (the machine is shared: read the ratio within a round, not the microseconds).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m analysis.batch_seeds_cost scenarios/cartpole_qa2c.yaml \
        --seeds 30 --single 500,2500 --batched 500,2500
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence


def _budgets(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two env-step budgets LO,HI, got {text!r}") from None
    if not 0 < lo < hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LO < HI, got {text!r}")
    return lo, hi


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.batch_seeds_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a scenario file that --batch-seeds accepts")
    p.add_argument("--seeds", type=int, default=30, help="seeds in the batched run (default %(default)s)")
    p.add_argument("--single", type=_budgets, default=(500, 2500), metavar="LO,HI")
    p.add_argument("--batched", type=_budgets, default=(500, 2500), metavar="LO,HI")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)

    from agents.batched_a2c import run_batched_seeds
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    root = Path(tempfile.mkdtemp(prefix="marlq_batch_cost_"))
    overrides = ["run.plots=false"]

    def single(steps: int) -> float:
        shutil.rmtree(root / "s", ignore_errors=True)
        cfg = load_config(args.config, [f"run.total_env_steps={steps}", *overrides], seed=0)
        cfg.run.progress = False
        t0 = time.process_time()
        run_experiment(cfg, root / "s")
        return time.process_time() - t0

    def batched(steps: int) -> float:
        for s in range(args.seeds):
            shutil.rmtree(root / f"b{s}", ignore_errors=True)
        t0 = time.process_time()
        run_batched_seeds(args.config, [f"run.total_env_steps={steps}", *overrides], list(range(args.seeds)),
                          [root / f"b{s}" for s in range(args.seeds)], progress=False)
        return time.process_time() - t0

    print("uptime before:", os.popen("uptime").read().strip(), flush=True)
    try:
        single(100)  # imports and numba's cache, outside the figures
        (s_lo, s_hi), (b_lo, b_hi) = args.single, args.batched
        for r in range(args.rounds):
            one = (single(s_hi) - single(s_lo)) / (s_hi - s_lo)
            many = (batched(b_hi) - batched(b_lo)) / (args.seeds * (b_hi - b_lo))
            print(f"round {r}: single {one * 1e6:.0f} us/step, batched {many * 1e6:.0f} us/seed-step "
                  f"({args.seeds} seeds), ratio {one / many:.1f}x", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("uptime after:", os.popen("uptime").read().strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
