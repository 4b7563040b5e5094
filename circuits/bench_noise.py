"""`marlq bench noise`: the cost of hardware-like execution, in the same run, single-threaded.

(a) density: the noisy density-matrix path (circuits/density.py) against PennyLane default.mixed
    running the same noisy QNode (torch interface, backprop, parameter broadcasting): forward +
    backward to every parameter.
(b) shots: a forward with shots (exact probabilities, then one multinomial per row) against the
    analytic forward of the same head, without autograd (act) and with it (fwd).
Contenders alternate within each round (interleaved rounds, so drifting machine load hits both);
each figure is the median over rounds of the per-call time. Run it pinned to one core for quotable
figures: ``taskset -c 0 marlq bench noise``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch

from circuits.bench_timing import parse_ints
from circuits.blocks import ANSATZE
from circuits.spec import CircuitConfigError
from circuits.vqc import VQC


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marlq bench noise", description=__doc__.splitlines()[0])
    p.add_argument("--n-qubits", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ansatz", default="rzryrz_ring", choices=list(ANSATZE))
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--depolarizing", type=float, default=0.01, help="per-gate depolarizing p of (a)")
    p.add_argument("--shots", type=parse_ints, default=[1024, 128], help="comma-separated shot counts of (b)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over these)")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds of calls per contender per round")
    p.add_argument("--parts", default="density,shots", help="comma-separated subset of density,shots")
    return p


def head(args: argparse.Namespace, **keys: Any) -> VQC:
    """Koelle et al.'s hybrid head (P(0) readouts, ReLU, Linear) with the bench's circuit and extra keys."""
    torch.manual_seed(0)
    n = args.n_qubits
    return VQC(n, 2, n_qubits=n, layers=args.layers, ansatz=args.ansatz, observable="p0", output="relu_linear",
               scaling="atan", seed=0, **keys)


def fwd_bwd(function: Callable[[torch.Tensor], torch.Tensor], module: torch.nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    params = [p for p in module.parameters() if p.requires_grad]
    return lambda: torch.autograd.grad(function(x).sum(), params)


def act(function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], Any]:
    def call() -> Any:
        with torch.no_grad():
            return function(x)
    return call


def fwd(module: VQC, x: torch.Tensor) -> Callable[[], Any]:
    def call() -> Any:
        module._dense_cache = None  # training: a new matrix at new weights every call
        return module(x)
    return call


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int, min_time: float) -> dict[str, float]:
    """Median seconds per call of each contender over ``rounds`` rounds; within a round each runs
    about ``min_time`` seconds of calls, one contender after the other."""
    repeats = {}
    for name, call in calls.items():  # warm up, and size each contender's batch of calls
        call()
        start = time.perf_counter()
        call()
        repeats[name] = max(1, int(min_time / max(time.perf_counter() - start, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                call()
            samples[name].append((time.perf_counter() - start) / repeats[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_density(args: argparse.Namespace) -> str:
    noise = {"depolarizing": args.depolarizing}
    module = head(args, noise=noise)
    reference = module.to_qnode("default.mixed", diff_method="backprop")
    x = torch.randn(args.batch, args.n_qubits)
    times = interleaved({"native": fwd_bwd(module, module, x), "pennylane": fwd_bwd(reference, module, x)},
                        args.rounds, args.min_time)
    return (f"density fwd_bwd n={args.n_qubits} layers={args.layers} {args.ansatz} B={args.batch} depolarizing={args.depolarizing}: "
            f"native {times['native'] * 1e3:.2f} ms  pennylane default.mixed {times['pennylane'] * 1e3:.1f} ms  "
            f"speed-up {times['pennylane'] / times['native']:.1f}x")


def bench_shots(args: argparse.Namespace) -> list[str]:
    x = torch.randn(args.batch, args.n_qubits)
    exact = head(args)
    lines = []
    for shots in args.shots:
        sampled = head(args, shots=shots)
        for mode, make in (("act", lambda m: act(m, x)), ("fwd", lambda m: fwd(m, x))):
            times = interleaved({"analytic": make(exact), "shots": make(sampled)}, args.rounds, args.min_time)
            lines.append(f"shots {mode:<3s} n={args.n_qubits} B={args.batch} shots={shots}: analytic {times['analytic'] * 1e3:.3f} ms  "
                         f"sampled {times['shots'] * 1e3:.3f} ms  cost {times['shots'] / times['analytic']:.2f}x the analytic forward")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Noisy density path vs PennyLane default.mixed, and shot sampling vs the analytic forward."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    torch.set_num_threads(1)
    parts = [p for p in args.parts.split(",") if p]
    for part in parts:
        if part not in ("density", "shots"):
            print(f"marlq bench noise: --parts: unknown part {part!r}; choices: density, shots", file=sys.stderr)
            return 2
    print(f"noise bench (torch {torch.__version__}, 1 thread); medians over {args.rounds} interleaved rounds, per call", flush=True)
    try:
        if "density" in parts:
            print(bench_density(args), flush=True)
        if "shots" in parts:
            for line in bench_shots(args):
                print(line, flush=True)
    except CircuitConfigError as exc:
        print(f"marlq bench noise: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
