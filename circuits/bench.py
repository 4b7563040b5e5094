"""`marlq bench quantum`: the native engine against PennyLane default.qubit, in the same run.

Modes, for one circuit spec (default: Koelle et al.'s hybrid head, 4 qubits, 2 layers, rzryrz_ring):
  act      forward without autograd, as in rollouts (the native dense path reuses its cached matrix)
  fwd      forward with autograd recording (the native engine rebuilds its matrix every call)
  fwd_bwd  forward + backward to every parameter
PennyLane runs default.qubit with the torch interface, backprop and parameter broadcasting, on the
same device. Each figure is the median over repeats of the per-call time. Run as
``marlq bench quantum`` or ``python -m circuits.bench``.
"""
from __future__ import annotations

import argparse
import copy
import sys
from typing import Any, Callable, Optional, Sequence

import torch

from circuits.bench_timing import parse_ints, time_per_call, write_json
from circuits.blocks import ANSATZE
from circuits.spec import CircuitConfigError
from circuits.vqc import VQC

MODES = ("act", "fwd", "fwd_bwd")


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the quantum benchmark."""
    p = argparse.ArgumentParser(prog="marlq bench quantum", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write one JSON object with a row per measurement to FILE (stdout without FILE)")
    p.add_argument("--n-qubits", type=parse_ints, default=None, help="comma-separated qubit counts (default 4; 4,8,12 with --peers)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ansatz", default="rzryrz_ring", choices=list(ANSATZE), help="a registered ansatz (default rzryrz_ring)")
    p.add_argument("--modes", default=None, help="comma-separated subset of act,fwd,fwd_bwd (default all; act,fwd_bwd with --peers)")
    p.add_argument("--batches", type=parse_ints, default=None, help="comma-separated batch sizes (default 1,64,1024,4096; 1,64,600,1024,4096 with --peers)")
    p.add_argument("--pennylane-max-batch", type=int, default=4096, help="larger batches run natively only")
    p.add_argument("--pennylane-max-qubits", type=int, default=12)
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per measurement")
    p.add_argument("--cuda-graphs", action="store_true", help="native fwd and fwd_bwd on CUDA replayed as CUDA graphs")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--peers", action="store_true",
                   help="time the circuit in every installed peer simulator as well (circuits/peers.py); "
                        "defaults become n 4,8,12, batches 1,64,600,1024,4096, modes act,fwd_bwd")
    p.add_argument("--rounds", type=int, default=3, help="--peers: interleaved rounds per cell (medians over rounds)")
    p.add_argument("--max-call-s", type=float, default=1.0, help="--peers: skip a simulator in a cell where one call takes longer")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="--peers: time by the process's CPU time (default: what other processes on a shared machine take "
                        "is left out) or by wall time")
    p.add_argument("--sims", default=None, help="--peers: only the simulators whose names contain one of these comma-separated words")
    p.add_argument("--cpu", type=int, default=None, help="--peers: pin the process to this CPU (default: the first one allowed)")
    return p


def make_call(function: Callable[[torch.Tensor], torch.Tensor], module: torch.nn.Module, x: torch.Tensor, mode: str) -> Callable[[], Any]:
    """One benchmark call of ``function`` on x in the given mode."""
    params = [p for p in module.parameters() if p.requires_grad]
    if mode == "act":
        def act() -> Any:
            with torch.no_grad():
                return function(x)
        return act
    def fresh() -> None:
        # training differentiates at new weights every call: no cached circuit matrix (or its
        # analytic-gradient pieces) may carry over from the previous call
        if hasattr(module, "_dense_cache"):
            module._dense_cache = None

    if mode == "fwd":
        def fwd() -> Any:
            fresh()
            return function(x)
        return fwd

    def fwd_bwd() -> Any:
        fresh()
        return torch.autograd.grad(function(x).sum(), params)
    return fwd_bwd


def graphed_call(module: torch.nn.Module, x: torch.Tensor, mode: str, error_mode: str = "global") -> Callable[[], Any]:
    """The native fwd or fwd_bwd captured once as a CUDA graph; each call replays it."""
    module = copy.deepcopy(module)  # a fresh autograd history for every capture
    params = [p for p in module.parameters() if p.requires_grad]
    body = make_call(module, module, x, mode)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=error_mode):
        out = module(x)
        if mode == "fwd_bwd":
            torch.autograd.grad(out.sum(), params)
    return graph.replay


def bench_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure every (n_qubits, mode, batch) and return one row each."""
    device = torch.device(args.device)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise CircuitConfigError(f"--modes: unknown mode {m!r}; choices: {', '.join(MODES)}")
    rows = []
    for n in args.n_qubits:
        torch.manual_seed(0)
        module = VQC(n, 2, n_qubits=n, layers=args.layers, ansatz=args.ansatz, observable="p0",
                     output="relu_linear", scaling="atan", device=args.device)
        reference = module.to_qnode("default.qubit", diff_method="backprop")
        for mode in modes:
            for batch in args.batches:
                x = torch.randn(batch, n).to(device)  # CPU generator: independent of any graph capture
                row: dict[str, Any] = {"mode": mode, "batch": batch, "n_qubits": n, "layers": args.layers,
                                       "ansatz": args.ansatz, "device": args.device,
                                       "engine_path": "dense" if module.use_dense else "gates"}
                graphs = args.cuda_graphs and device.type == "cuda" and mode != "act"
                try:
                    call = make_call(module, module, x, mode)
                    notes = []
                    for error_mode in ("global", "relaxed") if graphs else ():
                        try:
                            call = graphed_call(module, x, mode, error_mode)
                            break
                        except RuntimeError as exc:  # capture refused: try the next mode, else run plain
                            notes.append(f"capture ({error_mode}) failed: {str(exc).splitlines()[0][:200]}")
                            torch.cuda.synchronize()
                            torch.cuda.empty_cache()
                    else:
                        graphs = False
                    if notes:
                        row["note"] = "; ".join(notes)
                    native = time_per_call(call, device, args.min_time)
                    row.update(native_ms_per_call=native * 1e3, native_samples_per_s=batch / native, cuda_graphs=graphs)
                except torch.OutOfMemoryError:
                    row.update(native_ms_per_call=None, native_samples_per_s=None, cuda_graphs=graphs, note="native: out of memory")
                    torch.cuda.empty_cache()
                pennylane = None
                if batch <= args.pennylane_max_batch and n <= args.pennylane_max_qubits:
                    try:
                        pennylane = time_per_call(make_call(reference, module, x, mode), device, args.min_time)
                    except torch.OutOfMemoryError:
                        row["note"] = "pennylane: out of memory"
                        torch.cuda.empty_cache()
                row["pennylane_ms_per_call"] = pennylane * 1e3 if pennylane else None
                row["pennylane_samples_per_s"] = batch / pennylane if pennylane else None
                native_rate = row["native_samples_per_s"]
                row["ratio"] = native_rate / row["pennylane_samples_per_s"] if pennylane and native_rate else None
                rows.append(row)
                if args.json != "-":
                    print(format_row(row), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    """One human-readable line of a result row."""
    def rate(v: Optional[float]) -> str:
        return f"{v:12.4g}" if v else f"{'-':>12}"

    def ms(v: Optional[float]) -> str:
        return f"{v:10.4f}" if v else f"{'-':>10}"

    ratio = f"{row['ratio']:8.1f}x" if row["ratio"] else f"{'-':>9}"
    return (f"n={row['n_qubits']:<3d}{row['mode']:<8s}batch={row['batch']:<7d}"
            f"native {ms(row['native_ms_per_call'])} ms {rate(row['native_samples_per_s'])}/s   "
            f"pennylane {ms(row['pennylane_ms_per_call'])} ms {rate(row['pennylane_samples_per_s'])}/s   {ratio}"
            + (f"  [{row['note']}]" if row.get("note") else ""))


def main(argv: Sequence[str] | None = None) -> int:
    """Native VQC engine vs PennyLane default.qubit: act latency, forward and forward+backward throughput."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:  # (the bench also runs inside test processes)
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    peers = args.peers
    args.n_qubits = args.n_qubits or ([4, 8, 12] if peers else [4])
    args.batches = args.batches or ([1, 64, 600, 1024, 4096] if peers else [1, 64, 1024, 4096])
    args.modes = args.modes or ("act,fwd_bwd" if peers else ",".join(MODES))
    if args.peers:
        from circuits.peer_bench import main_peers

        return main_peers(args, argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("marlq bench quantum: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    try:
        if args.json != "-":
            print(f"quantum bench on {args.device} (torch {torch.__version__}, {args.threads} thread(s)); figures are per call")
        rows = bench_rows(args)
    except CircuitConfigError as exc:
        print(f"marlq bench quantum: {exc}", file=sys.stderr)
        return 2
    if args.json:
        meta = {"device": args.device, "torch": torch.__version__, "threads": args.threads,
                "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
        write_json({"meta": meta, "rows": rows}, args.json)
    return 0


def noise_main(argv: Sequence[str] | None = None) -> int:
    """Noisy density path vs PennyLane default.mixed, and shot sampling vs the analytic forward."""
    from circuits.bench_noise import main as noise

    return noise(argv)


BENCHES = {"quantum": main, "noise": noise_main}

if __name__ == "__main__":
    sys.exit(main())
