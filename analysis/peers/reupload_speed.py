"""Per-call cost of a re-uploading head before and after it ran on the statevector executor
(docs/circuits.md, "Re-uploading on the statevector executor"): the torch_autograd executor (what every
re-uploading head ran before, forced here) against what the planner picks now, interleaved in one
process, CPU time.

Cells: Skolik et al.'s head (4 qubits, 5 layers, rzryrz_ring, trainable input and output scales) and an
8-qubit, 2-layer head of the same spec; calls: a one-row act (before: the torch head under no_grad, as a
DQN worker acted; after: the acting twin it acts through now, and the torch head's no-grad forward) and
a 16-row forward and backward through torch (a DQN learner's batch).

    taskset -c 1 python analysis/peers/reupload_speed.py --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import numpy as np
import torch

from circuits.bench_timing import time_per_call
from circuits.planner import Plan
from circuits.twins import acting_twin
from circuits.vqc import VQC


class _Forced:
    """A head's planner that answers torch_autograd for every call (the plan of re-uploading heads before)."""

    def __init__(self, facts):
        self.facts = facts

    def __call__(self, rows, grad, dense_ready=None):
        return Plan("torch_autograd", "autograd")


def head(n: int, layers: int, forced: bool) -> VQC:
    torch.manual_seed(0)
    module = VQC(n, 2, n_qubits=n, layers=layers, encoding="angle_x", scaling="trainable", reupload=True,
                 ansatz="rzryrz_ring", observable="z", output="scaled")
    if forced:
        module.__dict__["_planner"] = _Forced(module.facts())
    return module


def calls(n: int, layers: int) -> dict[str, dict[str, object]]:
    """Per call kind: the before and after callables."""
    before, after = head(n, layers, True), head(n, layers, False)
    rng = np.random.default_rng(0)
    one = rng.normal(size=(1, n)).astype(np.float32)
    one_t = torch.from_numpy(one)
    batch = torch.from_numpy(rng.normal(size=(16, n)).astype(np.float32))
    twin = acting_twin(after)
    assert twin is not None and twin.plan(1).variant == "blocks"
    assert after.plan(16, True).executor == "statevector" and before.plan(16, True).executor == "torch_autograd"

    def act_torch(module):
        def call():
            with torch.no_grad():
                module(one_t)
        return call

    def fwd_bwd(module):
        def call():
            module.zero_grad(set_to_none=True)
            module(batch).sum().backward()
        return call

    return {"act 1 row": {"before (torch_autograd, no_grad)": act_torch(before),
                          "after (acting twin)": lambda: twin.forward(one.astype(np.float64)),
                          "after (torch head, no_grad)": act_torch(after)},
            "fwd+bwd 16 rows": {"before (torch_autograd)": fwd_bwd(before), "after (statevector)": fwd_bwd(after)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.4, help="seconds per (path, round)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    cells = {(4, 5): calls(4, 5), (8, 2): calls(8, 2)}
    samples: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        for cell, kinds in cells.items():
            for kind, paths in kinds.items():
                order = list(paths.items())
                if r % 2:
                    order.reverse()  # alternate which path runs first in a round
                for name, call in order:
                    t = time_per_call(call, torch.device("cpu"), args.min_time, clock=time.process_time)
                    samples.setdefault((cell, kind, name), []).append(t)
    print("uptime after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"CPU time per call, median of {args.rounds} interleaved rounds (ms); ratio before/after: median (range over rounds)")
    for cell, kinds in cells.items():
        for kind, paths in kinds.items():
            names = list(paths)
            base = samples[(cell, kind, names[0])]
            for name in names:
                mine = samples[(cell, kind, name)]
                ratios = [b / a for b, a in zip(base, mine)]
                line = f"n={cell[0]} L={cell[1]} {kind:16s} {name:34s} {1e3 * statistics.median(mine):8.4f} ms"
                if name != names[0]:
                    line += f"   {statistics.median(ratios):5.1f}x ({min(ratios):.1f}-{max(ratios):.1f})"
                print(line)


if __name__ == "__main__":
    main()
