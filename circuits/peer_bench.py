"""`marlq bench quantum --peers`: marl-q's engine paths against every installed peer simulator.

For each qubit count the bench head (``circuits.peers``) is built once; every peer takes its
parameters and must agree with marl-q (outputs to 1e-5 absolute, gradients to 1e-5 relative to the
largest entry of each parameter's gradient) before it is timed; one that does not is reported and
left out of the ranking. Each cell (n, mode, batch) is timed in ``--rounds`` interleaved rounds
(every simulator once per round, in turn), each a median over repeats (``bench_timing.time_per_call``);
the cell's figure is the median over rounds, its spread the range over rounds. A simulator whose
single call in a cell takes over ``--max-call-s`` is skipped there. The process runs on one CPU
with one thread everywhere (torch, and XLA's flags, set before JAX is imported); `uptime` is
recorded before and after.

marl-q's columns: ``auto`` (the path the engine chooses, what a head gets), ``dense`` and ``gates``
(the two paths forced), all through torch's autograd, and ``numpy``: the numpy twins that COMA's actor
workers act through and the one-step A2C workers train through (``circuits.peers.numpy_twin``; up to 4
qubits also ``numpy gates``, the twins of an ``engine: gates`` head, which past the compiled kernels'
rows run the adjoint sweeps where the auto head's twins use the dense matrix); "best" is the fastest of them, and the ratio is best /
fastest peer.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

import torch

from circuits import peers as peer_mod
from circuits.bench_timing import time_per_call, write_json
from circuits.spec import CircuitConfigError
from circuits.vqc import ADJOINT_MIN_QUBITS, VQC

XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
MARLQ_PATHS = ("auto", "dense", "gates")
MARLQ_ABOUT = {
    "auto": "marl-q's VQC in torch, the path its planner picks for (qubits, batch, gradient or not) (the "
            "'auto path' column of each row), torch autograd for fwd_bwd, float32",
    "dense": "marl-q's VQC forced to the dense 2^n x 2^n circuit matrix, torch, float32",
    "gates": "marl-q's VQC forced to the state vector (adjoint sweeps for the gradient), torch, float32",
}
AGREEMENT_TOLERANCE = 1e-5
REPEAT_S = 0.002  # seconds per timed repeat: under a scheduler slice
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def uptime() -> str:
    """The `uptime` line (load averages), or the load averages alone where `uptime` is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def pin(cpu: int | None) -> int | None:
    """Pin this process to one CPU (the first allowed one by default); the CPU, or None where unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    return cpu


def bench_module(n: int, layers: int, engine: str = "auto") -> VQC:
    """The bench head of ``circuits.peers`` with fixed parameters (seed 0)."""
    torch.manual_seed(0)
    return VQC(n, 2, n_qubits=n, layers=layers, ansatz="rzryrz_ring", observable="p0", output="relu_linear",
               scaling="atan", engine=engine)


def contestants(n: int, layers: int, only: list[str] | None = None) -> tuple[dict[str, peer_mod.Peer], dict[str, str]]:
    """marl-q's paths and the peers for n qubits (those whose names contain a word of ``only``, if
    given; marl-q auto always), and why any peer is absent."""
    base = bench_module(n, layers)
    sims: dict[str, peer_mod.Peer] = {}
    wanted = (lambda name: name == "marl-q auto" or only is None or any(w in name for w in only))
    for path in MARLQ_PATHS:
        if not wanted(f"marl-q {path}"):
            continue
        module = base if path == "auto" else bench_module(n, layers, path)
        module.load_state_dict(base.state_dict())
        sims[f"marl-q {path}"] = peer_mod.torch_peer(f"marl-q {path}", module, module, MARLQ_ABOUT[path])
    # the numpy twins of the auto head and, where it takes another path (up to 4 qubits the auto head's
    # twin is the dense one), of an ``engine: gates`` head: the adjoint sweeps
    for name, engine in (("marl-q numpy", "auto"), ("marl-q numpy gates", "gates")):
        if not wanted(name) or (engine == "gates" and n >= ADJOINT_MIN_QUBITS):
            continue
        twins = [bench_module(n, layers, engine) for _ in range(2)]
        for twin in twins:
            twin.load_state_dict(base.state_dict())
        sims[name] = peer_mod.numpy_twin(*twins, name, "" if engine == "auto" else (
            "the numpy twins of an 'engine: gates' head: as marl-q numpy, but the adjoint sweeps past the "
            "compiled kernels' rows where the auto head's twins take the dense matrix"))
    absent: dict[str, str] = {}
    legacy = only is not None and "legacy" in only  # the old peers run only when asked for by that word
    for name in filter(wanted, peer_mod.PEERS):
        if name in peer_mod.LEGACY and not legacy:
            continue
        peer, why = peer_mod.build_peer(name, base)
        if peer is None:
            absent[name] = why or "not available"
        else:
            sims[name] = peer
    return sims, absent


def auto_path(n: int, layers: int, batch: int, grad: bool) -> str:
    """The path marl-q's planner picks for the bench head at this batch (``VQC.path``)."""
    return bench_module(n, layers).path(batch, grad)


def check_agreement(sims: dict[str, peer_mod.Peer], n: int) -> dict[str, dict[str, Any]]:
    """Every simulator against marl-q auto on one batch of 5; those beyond the tolerance are marked."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, n, generator=generator) * 2.0
    coefficients = torch.randn(5, 2, generator=generator).numpy()
    reference = sims["marl-q auto"]
    result = {}
    for name, sim in sims.items():
        if name == "marl-q auto":
            continue
        diffs = peer_mod.agreement(sim, reference, x, coefficients)
        diffs["agrees"] = diffs["output_max_abs_diff"] <= AGREEMENT_TOLERANCE and diffs["grad_max_rel_diff"] <= AGREEMENT_TOLERANCE
        result[name] = diffs
    return result


def time_cell(sims: dict[str, peer_mod.Peer], mode: str, x: torch.Tensor, args: argparse.Namespace,
              previous: dict[str, tuple[int, float | None]] | None = None) -> dict[str, dict[str, Any]]:
    """Interleaved rounds over the simulators for one cell; per simulator the median, min and max, and
    ``first_call_ms``: the first call at this batch, timed apart (JAX's jit compiles then; marl-q builds
    caches), never part of the median.

    ``previous``: per simulator, (batch, seconds of one call or None if skipped) at the last smaller batch
    of the same qubits and mode, updated here. A simulator skipped there, or whose call would take over
    ``--max-call-s`` scaled linearly to this batch, is skipped without being called: its first call at a
    batch it cannot handle may take minutes or all the memory (PennyLane's backprop at 12 qubits and
    4096 rows was killed by the kernel at 24 GB, ending the bench)."""
    device = torch.device("cpu")
    calls: dict[str, Any] = {}
    first: dict[str, float] = {}
    out: dict[str, dict[str, Any]] = {}
    previous = {} if previous is None else previous
    batch = x.shape[0]
    for name, sim in sims.items():
        before = previous.get(name)
        if before is not None:
            smaller, seconds = before
            if seconds is None:
                out[name] = {"skipped": f"skipped at B={smaller}"}
                continue
            if seconds * batch / smaller > args.max_call_s:
                out[name] = {"skipped": f"one call predicted {seconds * batch / smaller:.2f} s > {args.max_call_s} s "
                                        f"(from B={smaller})"}
                previous[name] = (smaller, None)
                continue
        function = sim.act if mode == "act" else sim.fwd_bwd
        xin = sim.convert(x)
        try:
            clock = CLOCKS[args.clock]
            start = clock()
            function(xin)  # the first call compiles (JAX) or builds caches
            first[name] = clock() - start
            start = clock()
            function(xin)
            once = clock() - start
        except MemoryError:
            out[name] = {"skipped": "out of memory"}
            previous[name] = (batch, None)
            continue
        if once > args.max_call_s:
            out[name] = {"skipped": f"one call {once:.2f} s > {args.max_call_s} s"}
            previous[name] = (batch, None)
            continue
        previous[name] = (batch, once)
        calls[name] = (lambda f=function, v=xin: f(v))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            samples[name].append(time_per_call(call, device, args.min_time, repeat_s=REPEAT_S, clock=CLOCKS[args.clock]))
    for name, values in samples.items():
        median = statistics.median(values)
        out[name] = {"ms_per_call": median * 1e3, "samples_per_s": x.shape[0] / median, "first_call_ms": first[name] * 1e3,
                     "round_ms": [v * 1e3 for v in values], "spread": (max(values) - min(values)) / median}
    return out


def summarise(cell: dict[str, dict[str, Any]], excluded: set[str]) -> dict[str, Any]:
    """marl-q's best path, the fastest agreeing peer and their ratio (> 1: marl-q is faster)."""
    timed = {k: v for k, v in cell.items() if "ms_per_call" in v}
    ours = {k: v for k, v in timed.items() if k.startswith("marl-q")}
    theirs = {k: v for k, v in timed.items() if not k.startswith("marl-q") and k not in excluded}
    best = min(ours, key=lambda k: ours[k]["ms_per_call"]) if ours else None
    fastest = min(theirs, key=lambda k: theirs[k]["ms_per_call"]) if theirs else None
    ratio = ours[best]["samples_per_s"] / theirs[fastest]["samples_per_s"] if best and fastest else None
    auto_ratio = (timed["marl-q auto"]["samples_per_s"] / theirs[fastest]["samples_per_s"]
                  if fastest and "marl-q auto" in timed else None)
    return {"marlq_best": best, "fastest_peer": fastest, "ratio": ratio, "auto_ratio": auto_ratio}


def format_cell(row: dict[str, Any], names: Sequence[str]) -> str:
    """One table line: ms per call (spread over rounds) for every simulator, then the ratio."""
    parts = [f"n={row['n_qubits']:<3d}{row['mode']:<8s}B={row['batch']:<5d}"]
    for name in names:
        result = row["results"].get(name, {})
        if "ms_per_call" in result:
            parts.append(f"{result['ms_per_call']:9.4f} ±{100 * result['spread'] / 2:3.0f}%")
        else:
            parts.append(f"{'-':>15}")
    ratio = f"{row['ratio']:6.2f}x" if row["ratio"] else f"{'-':>7}"
    auto = f"{row['auto_ratio']:6.2f}x" if row["auto_ratio"] else f"{'-':>7}"
    return (" ".join(parts) + f"   best/peer {ratio}  auto/peer {auto}  ({row['marlq_best']} vs {row['fastest_peer']}; "
            f"auto path {row.get('auto_path', '?')})")


def main_peers(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """The --peers bench; prints the table (and writes JSON with --json). The CPU pinning, torch's thread
    count and XLA_FLAGS it sets are put back afterwards (it also runs inside a test process)."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads, xla = torch.get_num_threads(), os.environ.get("XLA_FLAGS")
    try:
        return _run_peers(args, argv)
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
        if xla is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = xla


def _run_peers(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if args.device != "cpu":
        print("marlq bench quantum --peers: only --device cpu is supported (the peers run on the CPU)", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"marlq bench quantum: --rounds: expected >= 1, got {args.rounds}", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("act", "fwd_bwd"):
            print(f"marlq bench quantum: --modes: unknown mode {m!r} with --peers; choices: act, fwd_bwd", file=sys.stderr)
            return 2
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + XLA_SINGLE_THREAD).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    cpu = pin(args.cpu)
    before = uptime()
    quiet = args.json == "-"
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    say(f"marlq bench quantum --peers: torch {torch.__version__}, 1 thread, pinned to CPU {cpu}; "
        f"median ms per call ({args.clock} time) over {args.rounds} interleaved rounds (± half the range over rounds)")
    say(f"uptime before: {before}")
    rows: list[dict[str, Any]] = []
    agreements: dict[int, Any] = {}
    absent: dict[str, str] = {}
    for n in args.n_qubits:
        try:
            sims, missing = contestants(n, args.layers, args.sims.split(",") if args.sims else None)
        except CircuitConfigError as exc:
            print(f"marlq bench quantum: {exc}", file=sys.stderr)
            return 2
        absent.update(missing)
        agreements[n] = check_agreement(sims, n)
        excluded = {name for name, a in agreements[n].items() if not a["agrees"]}
        for name, a in agreements[n].items():
            say(f"n={n} agreement {name}: outputs {a['output_max_abs_diff']:.1e}, gradients (relative) "
                f"{a['grad_max_rel_diff']:.1e}" + ("" if a["agrees"] else "  DISAGREES: not ranked"))
        names = list(sims)
        for name, sim in sims.items():
            say(f"  {name}: {sim.about}")
        say(" " * 19 + " ".join(f"{name[:15]:>15}" for name in names))
        for mode in modes:
            previous: dict[str, tuple[int, float | None]] = {}
            for batch in sorted(args.batches):
                x = torch.randn(batch, n, generator=torch.Generator().manual_seed(batch))
                results = time_cell(sims, mode, x, args, previous)
                row = {"n_qubits": n, "mode": mode, "batch": batch, "results": results,
                       "auto_path": auto_path(n, args.layers, batch, mode == "fwd_bwd")}
                row.update(summarise(results, excluded))
                rows.append(row)
                say(format_cell(row, names))
                compiled = {k: v["first_call_ms"] for k, v in results.items()
                            if "ms_per_call" in v and v["first_call_ms"] > 100 * v["ms_per_call"]}
                if compiled:
                    say(" " * 19 + "first calls (jit compile, timed apart): "
                        + ", ".join(f"{k} {v / 1e3:.2f} s" for k, v in compiled.items()))
                if args.json and args.json != "-":  # every finished cell is kept if the run is stopped
                    write_json({"meta": meta(args, argv, cpu, before, None, absent, agreements), "rows": rows}, args.json)
    after = uptime()
    say(f"uptime after: {after}")
    for name, why in absent.items():
        say(f"{name}: {why}")
    judged = [r["ratio"] for r in rows if r["ratio"]]
    if judged:
        say(f"cells: {len(judged)}; marl-q best >= 1.0x the fastest peer in {sum(r >= 1.0 for r in judged)}, "
            f">= 2x in {sum(r >= 2.0 for r in judged)}; auto >= 1.0x in "
            f"{sum((r['auto_ratio'] or 0) >= 1.0 for r in rows if r['ratio'])}")
    if args.json:
        write_json({"meta": meta(args, argv, cpu, before, after, absent, agreements), "rows": rows}, args.json)
    return 0


def meta(args: argparse.Namespace, argv: Sequence[str] | None, cpu: int | None, before: str, after: str | None,
         absent: dict[str, str], agreements: dict[int, Any]) -> dict[str, Any]:
    """The JSON report's header: the command, the environment, the load, what was not installed."""
    return {"command": "marlq bench quantum " + " ".join(argv if argv is not None else sys.argv[1:]),
            "torch": torch.__version__, "threads": 1, "cpu": cpu, "xla_flags": os.environ["XLA_FLAGS"],
            "python": platform.python_version(), "uptime_before": before, "uptime_after": after, "clock": args.clock,
            "rounds": args.rounds, "min_time_s": args.min_time, "not_installed": absent,
            "agreement": {str(n): a for n, a in agreements.items()}}
