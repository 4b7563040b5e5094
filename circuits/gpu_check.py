"""The one prepared GPU check: CUDA parity tests (and the heads' tanh on CUDA) and the GPU benchmark, results written as files.

    python -m circuits.gpu_check OUT_DIR [--device cuda] [--quick]

Writes OUT_DIR/gpu_check.json (environment, each step's exit code and output tail),
OUT_DIR/bench_graphs.json (native replayed as CUDA graphs vs PennyLane default.qubit on the GPU,
n in {4, 8, 12}, batch up to 65536) and OUT_DIR/bench_plain.json (native without graphs, n = 4).
Each step runs in its own process with a time limit, so one slow step cannot lose the others.
``--device cpu --quick`` runs the same steps small, to test the script without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import torch


def run_step(name: str, command: list[str], out: Path, limit_s: float, env: dict[str, str], stdout_file: Path | None = None) -> dict:
    """Run one step with a time limit; keep its exit code, duration and output tail."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, env=env)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
    if stdout_file is not None:
        stdout_file.write_text(stdout)
    result = {"step": name, "exit": code, "seconds": round(time.perf_counter() - start, 1),
              "stdout_tail": stdout[-3000:] if stdout_file is None else f"(in {stdout_file.name})", "stderr_tail": stderr[-3000:]}
    print(json.dumps({k: result[k] for k in ("step", "exit", "seconds")}), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CUDA parity tests and the GPU benchmark; write JSON files to OUT_DIR."""
    p = argparse.ArgumentParser(prog="python -m circuits.gpu_check")
    p.add_argument("out", type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes (to test this script on a CPU)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MARLQ_TEST_DEVICE=args.device, PYTHONUNBUFFERED="1")
    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import pennylane

        info["pennylane"] = pennylane.__version__
    except ImportError as exc:
        info["pennylane"] = f"missing: {exc}"
    print(json.dumps(info), flush=True)
    python = sys.executable
    if args.quick:
        n_qubits, batches, plain_batches, pl_max, min_time = "2,4", "1,64", "1,64", "64", "0.02"
        parity = [python, "-m", "pytest", "tests/circuits/test_parity.py", "tests/agents/test_activations.py", "-q", "-x",
                  "-p", "no:cacheprovider", "-k", "batch_of_one or engine_paths or cuda"]
    else:
        n_qubits, batches, plain_batches, pl_max, min_time = "4,8,12", "1,64,1024,8192,65536", "1,1024,65536", "8192", "0.25"
        parity = [python, "-m", "pytest", "tests/circuits/test_parity.py", "tests/agents/test_activations.py", "-q",
                  "-p", "no:cacheprovider"]
    bench = [python, "-m", "circuits.bench", "--device", args.device, "--json", "--modes", "act,fwd_bwd",
             "--pennylane-max-batch", pl_max, "--min-time", min_time]
    steps = [
        run_step("parity", parity, args.out, 120, env),
        run_step("bench_graphs", bench + ["--n-qubits", n_qubits, "--batches", batches]
                 + (["--cuda-graphs"] if args.device == "cuda" else []), args.out, 150, env, args.out / "bench_graphs.json"),
        run_step("bench_plain", bench + ["--n-qubits", "4", "--batches", plain_batches, "--modes", "fwd_bwd"],
                 args.out, 45, env, args.out / "bench_plain.json"),
    ]
    (args.out / "gpu_check.json").write_text(json.dumps({"info": info, "steps": steps}, indent=1))
    return 0 if all(s["exit"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
