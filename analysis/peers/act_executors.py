"""Per-call cost of a call without a gradient (acting) on each candidate executor at 5-8 qubits
(docs/circuits.md, "Acting through the columns kernels"): the statevector executor's per-row kernels
(within their rows), numpy blocks and columns kernels, and the dense executor's cached matrix,
interleaved in one process, CPU time, the same head and rows for every candidate; "(planner)" marks
the planner's choice.

Entries: ``numpy`` (the acting twin, ``circuits.twins.acting_twin``: COMA's actor workers) and
``torch`` (``VQC.forward`` under ``torch.no_grad()``: an actor acting through torch), each forced to
one plan through its planner (the torch entry: the cached dense matrix and the blocks; the planner
does not route it to the columns kernels, docs/circuits.md). Every candidate's outputs are checked
against the first one's (1e-5) before it is timed. Each cell: ``--rounds`` interleaved rounds (every
candidate once per round), each a median over repeats (``bench_timing.time_per_call``); printed: the
median over rounds and the spread (max - min over rounds, as a percentage of the median), in
microseconds per call.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 0 python analysis/peers/act_executors.py --rounds 7
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import numpy as np
import torch

from circuits.bench_timing import parse_ints, time_per_call
from circuits.planner import Plan
from circuits.twins import acting_twin
from circuits.vqc import VQC

PLANS = {"blocks": Plan("statevector", "none", "blocks"), "kernels": Plan("statevector", "none", "kernels"),
         "columns": Plan("statevector", "none", "columns"), "dense": Plan("dense", "none", "cached"),
         "cached": Plan("dense", "none", "cached")}


class _Forced:
    """A planner that answers one plan for every call."""

    def __init__(self, facts, fixed: Plan) -> None:
        self.facts, self.fixed = facts, fixed

    def __call__(self, rows, grad, dense_ready=None):
        return self.fixed


def head(n: int, ansatz: str) -> VQC:
    """The peers bench's head (``circuits.peer_bench.bench_module``) with ``ansatz``, 2 layers, seed 0."""
    torch.manual_seed(0)
    return VQC(n, 2, n_qubits=n, layers=2, ansatz=ansatz, observable="p0", output="relu_linear", scaling="atan")


def candidates(n: int, ansatz: str, rows: int, entries: list[str]) -> dict[str, tuple[object, object]]:
    """name -> (call, its outputs as float64 numpy) for this cell; the planner's choice is marked."""
    x = np.random.default_rng(rows).normal(size=(rows, n))
    xt = torch.from_numpy(x.astype(np.float32))
    found: dict[str, tuple[object, object]] = {}
    for entry in entries:
        base = head(n, ansatz)
        if entry == "numpy":
            twin = acting_twin(base)
            picked = twin.plan(rows).variant
            within = twin.plan(rows).variant == "kernels"  # the per-row kernels take this many rows
            names = (["kernels"] if within else []) + ["blocks", "columns", "dense"]
        else:  # what an actor's second call at the same weights takes (the first may build no dense matrix)
            with torch.no_grad():
                base(xt), base(xt)
            picked = base.plan(rows, False).variant
            names = ["cached", "blocks"]
        for name in names:
            module = head(n, ansatz)
            if entry == "numpy":
                twin = acting_twin(module)
                twin.__dict__["_planner"] = _Forced(module.facts(), PLANS[name])
                call = (lambda twin=twin: twin.forward(x)[0])
            else:
                module.__dict__["_planner"] = _Forced(module.facts(), PLANS[name])

                def call(module=module):
                    with torch.no_grad():
                        return module(xt).double().numpy()
            label = f"{entry} {name}" + (" (planner)" if name == picked else "")
            found[label] = (call, call())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qubits", type=parse_ints, default=[5, 6, 7, 8])
    parser.add_argument("--batches", type=parse_ints, default=[1, 8, 24, 64, 256, 1024])
    parser.add_argument("--ansatze", default="rzryrz_ring,strongly_entangling")
    parser.add_argument("--entries", default="numpy,torch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds per candidate per round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    report = []
    for ansatz in args.ansatze.split(","):
        for n in args.qubits:
            for rows in args.batches:
                cell = candidates(n, ansatz, rows, args.entries.split(","))
                reference = next(iter(cell.values()))[1]
                for name, (_, out) in cell.items():
                    np.testing.assert_allclose(out, reference, atol=1e-5, rtol=0, err_msg=name)
                times: dict[str, list[float]] = {name: [] for name in cell}
                for _ in range(args.rounds):
                    for name, (call, _) in cell.items():
                        times[name].append(1e6 * time_per_call(call, torch.device("cpu"), args.min_time,
                                                               clock=time.process_time))
                parts = []
                for name, values in times.items():
                    median = statistics.median(values)
                    spread = 100.0 * (max(values) - min(values)) / median
                    report.append({"ansatz": ansatz, "n": n, "rows": rows, "candidate": name, "median_us": median,
                                   "min_us": min(values), "max_us": max(values), "rounds": values})
                    parts.append(f"{name} {median:.1f} ({spread:.0f}%)")
                print(f"{ansatz} n={n} B={rows}: " + " | ".join(parts), flush=True)
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
