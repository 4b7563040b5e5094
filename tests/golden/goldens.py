"""The behaviour contract of every shipped scenario file: a short sim run, compared with what it wrote
when the contract was recorded.

Why two kinds of golden. The same config and seed give byte-identical files on one machine, but not
across machines: the torch CPU wheel links Intel MKL, whose GEMM kernels and vector math (VML:
``torch.tanh`` and ``torch.exp`` on float32 tensors) are chosen at run time by CPU vendor and ISA.
On an AMD EPYC, or with ``MKL_CBWR=AVX2`` on an Intel AVX-512 machine, they give other last bits,
and a continuous env (Pendulum) or a 50-agent critic (the penalty game) carries them into
``metrics.csv`` (docs/runtime.md, "What byte-identical promises").

So a golden is kept two ways:

* **exact hashes per numerics class** (``hashes.json``). A class is named by a fingerprint of the
  arithmetic this machine does: the bytes of a fixed probe (torch GEMMs of the shapes the learners
  use, torch's vector math, numpy's and libm's transcendentals, numpy's BLAS), the LLVM host CPU that
  numba compiles for, and the versions of the numeric packages. On a machine of a recorded class, a
  run must reproduce every byte.
* **a numeric trace** (``traces/``): the first half of each file's rows as recorded, compared with a
  tolerance on every machine. Integer and text cells must be equal; floats within the file's
  tolerance. The horizon is half the run: past it, a last-bit difference can flip a sampled discrete
  action (in the penalty game it first did at row 352 of 400 under MKL's AVX2 branch), and from
  then on two correct runs differ by far more than any tolerance.

``python -m tests.golden.goldens --record NAME ...`` (no names: every scenario file) records this
machine's class for those scenarios, and with ``--trace`` the traces too. A change that cannot keep
the last bits (a reordered float sum) records the class again in the same commit and says why; a
change of behaviour also records the traces, and says why.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.metadata
import io
import json
import math
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = ROOT / "scenarios"
HERE = Path(__file__).resolve().parent
HASHES = HERE / "hashes.json"
TRACES = HERE / "traces"

# a few thousand env steps (episodes for the LSVI family, whose budget is counted in episodes)
BUDGET = {"linear_mdp_regret.yaml": ["run.total_episodes=300"],
          # routing decisions and vehicular steps cost more than a CartPole step
          # (and the end-of-run evaluation over a simulated day would dominate: a twentieth of one)
          "routing_amarl.yaml": ["run.total_env_steps=600", "algorithm.eval_days=0.05"],
          "routing_single_ppo.yaml": ["run.total_env_steps=600", "algorithm.eval_days=0.05"],
          "vehicular_a3c.yaml": ["run.total_env_steps=1500"],
          "penalty_cue_coma.yaml": ["run.total_env_steps=2000"],
          # two rollouts of 4 x 1024 steps: the first update's losses (train.csv) and its returns
          "pendulum_ppo.yaml": ["run.total_env_steps=8192"],
          # eight pursuers on a grid, three walkers in Box2D: one rollout each
          "pursuit_ippo.yaml": ["run.total_env_steps=400", "algorithm.envs_per_worker=2", "algorithm.n_steps=100"],
          "multiwalker_mappo.yaml": ["run.total_env_steps=512", "algorithm.envs_per_worker=2"],
          # 500-step warehouse episodes in 8 copies: the first ones end at 4000 steps
          "rware_mappo.yaml": ["run.total_env_steps=4800"],
          # a 5-layer re-uploading circuit acts gate by gate at every step: 1,200 steps (120 updates, 4
          # target syncs) instead of 3,000 cost 8 CPU-s, not 21; the trace (its first 750 steps) is unchanged
          "cartpole_qdqn_skolik.yaml": ["run.total_env_steps=1200"]}
# scenario files whose env needs an optional extra, and the module that tells it is installed
# (the LBF and RWARE files run marl-q's native envs, scenarios/lbf_native.py and rware_native.py: no package)
NEEDS = {"pursuit_ippo.yaml": "pymunk", "multiwalker_mappo.yaml": "Box2D"}
# the pyproject extra that installs each of those modules
EXTRA_OF = {"pymunk": "sisl", "Box2D": "sisl"}
DEFAULT_BUDGET = ["run.total_env_steps=3000"]
COMMON = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0", "run.seed=0"]

# the files a run writes whose content is its behaviour (the *_wall.csv twins hold wall-clock times)
FILES = ("metrics.csv", "comm.csv", "quantum.csv", "train.csv")
HORIZON = 0.5  # the share of each file's recorded rows the trace compares
# Box2D's contacts amplify a last-bit difference in the walkers' actions within one rollout: under
# MKL's AVX2 and SSE2 branches the second update's losses already differ by 1-15%
# A replay learner's greedy argmax (epsilon-greedy acting, Double DQN's target action) flips where two
# Q-values tie to the last bit, and from there the sampled batches differ: under MKL's AVX2 branch
# spread_vdn's TD loss is 0.4-0.8% apart from row 34 of 38 traced rows (rows 1-33 agree to 1e-3)
VALUE_BASED = ("cartpole_dqn.yaml", "cartpole_qdqn_skolik.yaml", "spread_iql.yaml", "spread_qmix.yaml",
               "spread_vdn.yaml")
SCENARIO_HORIZON = {"multiwalker_mappo.yaml": 0.25, **{name: 0.25 for name in VALUE_BASED}}


@dataclass(frozen=True)
class Tolerance:
    """|got - want| <= atol + scale * max|column| + rtol * max(|got|, |want|) for float cells (the
    column's largest magnitude in the recorded trace); other cells must be equal."""

    rtol: float
    atol: float
    scale: float = 0.0


# returns carry a last-bit difference through the env's dynamics (Pendulum: 1e-5 relative after one
# 4,096-step rollout under MKL's AVX2 branch); the ledger's times are sums of drawn delays; the
# learners' diagnostics are float32 sums that cancel (a COMA policy loss of 1e-3 from terms of 1e-1:
# 0.4% apart under MKL's AVX2 branch after 170 updates), so they are held to their column's scale
TOLERANCE = {"metrics.csv": Tolerance(rtol=1e-4, atol=1e-9),
             "comm.csv": Tolerance(rtol=1e-9, atol=1e-12),
             "quantum.csv": Tolerance(rtol=1e-9, atol=1e-12),
             "train.csv": Tolerance(rtol=1e-3, atol=1e-6, scale=1e-3)}


def scenario_files() -> list[str]:
    return sorted(p.name for p in SCENARIO_DIR.glob("*.yaml"))


def overrides(name: str) -> list[str]:
    return COMMON + BUDGET.get(name, DEFAULT_BUDGET)


def run_golden(name: str, out: Path) -> dict[str, bytes]:
    """Run scenario file ``name`` at the golden budget into ``out``; the bytes of the files it wrote."""
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    cfg = load_config(str(SCENARIO_DIR / name), overrides(name))
    run_experiment(cfg, out)
    return {f: (out / f).read_bytes() for f in FILES if (out / f).exists()}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------------
# the numerics class


def _probe_bytes() -> bytes:
    """The bytes of a fixed set of computations whose last bits depend on the machine's kernels."""
    import numpy as np
    import torch

    buf = io.BytesIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the suite and the sim backend run torch on one thread
    try:
        g = torch.Generator().manual_seed(1234)
        # torch GEMMs through MKL: acting (a few rows) and learning (minibatches) shapes, both passes
        for m, k, n in [(1, 4, 16), (1, 3, 64), (4, 3, 64), (4, 64, 64), (8, 16, 16), (50, 128, 128),
                        (64, 64, 1), (64, 64, 64), (250, 128, 128), (600, 4, 16), (1200, 18, 64)]:
            a = torch.randn(m, k, generator=g, requires_grad=True)
            w = torch.randn(n, k, generator=g, requires_grad=True)
            y = torch.nn.functional.linear(a, w)
            y.backward(torch.randn(m, n, generator=g))
            for t in (y.detach(), a.grad, w.grad):
                buf.write(t.numpy().tobytes())
        # torch's vector math (MKL VML or ATen's vectorised kernels, by size) and float64 GEMM
        for size in (7, 64, 4096):
            x = torch.randn(size, generator=g)
            for f in (torch.tanh, torch.exp, torch.log1p, torch.sigmoid, torch.cos, torch.sin):
                buf.write(f(x).numpy().tobytes())
            buf.write(torch.softmax(x.reshape(-1, 1).expand(-1, 3) * torch.arange(3.0), -1).numpy().tobytes())
        d = torch.randn(64, 64, generator=g, dtype=torch.float64)
        buf.write((d @ d).numpy().tobytes())
        # numpy: SIMD transcendentals, BLAS (float64 and complex128, as the circuit engine uses them)
        rng = np.random.default_rng(1234)
        v = rng.standard_normal(4099)
        for f in (np.sin, np.cos, np.exp, np.tanh, np.arctan):
            buf.write(f(v).tobytes())
        for f in (np.log, np.log1p, np.sqrt):
            buf.write(f(np.abs(v)).tobytes())
        for n in (4, 16, 256):
            a = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
            buf.write((a @ a).tobytes())
            buf.write((a.real @ a.real).tobytes())
        # libm through Python scalars
        buf.write(repr([f(x) for x in (0.1, 1.7, 123.456) for f in (math.sin, math.cos, math.exp, math.log)]).encode())
    finally:
        torch.set_num_threads(threads)
    return buf.getvalue()


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("torch", "numpy", "scipy", "numba", "gymnasium", "pettingzoo", "mpe2", "pennylane"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _llvm_host() -> str:
    """The CPU numba's LLVM compiles for: its vector widths decide the compiled kernels' sums."""
    try:
        import llvmlite.binding as llvm

        return llvm.get_host_cpu_name()
    except Exception:  # numba absent: the kernels are off, and so is this part of the class
        return "absent"


@dataclass(frozen=True)
class NumericsClass:
    """The arithmetic this machine does: its name (a fingerprint) and what went into it."""

    name: str
    torch_cpu_capability: str
    llvm_host: str
    versions: dict[str, str]

    def describe(self) -> str:
        return (f"{self.name} (torch {self.versions['torch']} ATen {self.torch_cpu_capability}, "
                f"numpy {self.versions['numpy']}, LLVM host {self.llvm_host})")


def numerics_class() -> NumericsClass:
    """This machine's numerics class (a fraction of a second; cached per process)."""
    global _CLASS
    if _CLASS is None:
        import torch

        versions = _versions()
        cap = torch.backends.cpu.get_cpu_capability()
        llvm = _llvm_host()
        h = hashlib.sha256(_probe_bytes())
        h.update(json.dumps([versions, cap, llvm], sort_keys=True).encode())
        _CLASS = NumericsClass(h.hexdigest()[:12], cap, llvm, versions)
    return _CLASS


_CLASS: NumericsClass | None = None


def load_hashes() -> dict[str, Any]:
    return json.loads(HASHES.read_text()) if HASHES.exists() else {}


def recorded_hashes(name: str, cls: NumericsClass | None = None) -> dict[str, str] | None:
    """The exact hashes recorded for scenario ``name`` on ``cls`` (default: this machine's), if any."""
    cls = cls or numerics_class()
    return load_hashes().get(cls.name, {}).get("scenarios", {}).get(name)


# ---------------------------------------------------------------------------------------------------
# the numeric trace


def trace_path(name: str, file: str) -> Path:
    return TRACES / name.removesuffix(".yaml") / file


def horizon_rows(n_rows: int, share: float = HORIZON) -> int:
    """How many data rows of a file of ``n_rows`` the trace keeps (at least one where there is one)."""
    return max(min(n_rows, 1), math.floor(share * n_rows))


def trace_of(data: bytes, share: float = HORIZON) -> bytes:
    """The header and the first ``horizon_rows`` data rows of a CSV file, as bytes."""
    lines = data.decode().splitlines(keepends=True)
    return "".join(lines[:1 + horizon_rows(len(lines) - 1, share)]).encode()


def _is_int(cell: str) -> bool:
    return cell.lstrip("-").isdigit()


def _as_float(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def compare_trace(file: str, got: bytes, want: bytes) -> list[str]:
    """Where ``got`` leaves the recorded trace ``want`` of ``file`` (empty: it agrees).

    Integer and text cells must be equal; float cells must agree within the file's tolerance. ``got``
    may run longer than the trace (only the trace's rows are compared); it may not run shorter.
    """
    tol = TOLERANCE[file]
    want_rows = list(csv.reader(io.StringIO(want.decode())))
    got_rows = list(csv.reader(io.StringIO(got.decode())))
    if not want_rows:
        return [f"{file}: the recorded trace is empty"]
    problems: list[str] = []
    if got_rows[:1] != want_rows[:1]:
        return [f"{file}: header {got_rows[:1]} != recorded {want_rows[:1]}"]
    header = want_rows[0]
    scale = [max((abs(v) for r in want_rows[1:] if j < len(r) and (v := _as_float(r[j])) is not None
                  and math.isfinite(v)), default=0.0) for j in range(len(header))]
    if len(got_rows) < len(want_rows):
        problems.append(f"{file}: {len(got_rows) - 1} rows, the trace has {len(want_rows) - 1}")
    for i, (g, w) in enumerate(zip(got_rows[1:], want_rows[1:]), start=1):
        if len(g) != len(w):
            problems.append(f"{file} row {i}: {len(g)} cells, recorded {len(w)}")
            continue
        for col, a, b, col_scale in zip(header, g, w, scale):
            if a == b:
                continue
            fa, fb = _as_float(a), _as_float(b)
            if fa is None or fb is None or _is_int(a) or _is_int(b) or math.isnan(fa) != math.isnan(fb):
                problems.append(f"{file} row {i} {col}: {a!r} != recorded {b!r}")
            elif abs(fa - fb) > tol.atol + tol.scale * col_scale + tol.rtol * max(abs(fa), abs(fb)):
                problems.append(f"{file} row {i} {col}: {a} != recorded {b} "
                                f"(relative {abs(fa - fb) / max(abs(fa), abs(fb)):.2e}, rtol {tol.rtol:g})")
        if len(problems) >= 5:
            problems.append("... (first differences only)")
            break
    return problems


def check(name: str, files: dict[str, bytes]) -> tuple[list[str], str]:
    """Check a golden run's files: the trace on every machine, the bytes on a recorded class.

    Returns the problems found (empty: it passed) and a line saying what was checked.
    """
    cls = numerics_class()
    problems: list[str] = []
    traced = sorted(p.name for p in trace_path(name, "x").parent.glob("*.csv"))
    if not traced:
        problems.append(f"{name}: no trace recorded (python -m tests.golden.goldens --record --trace {name})")
    for file in traced:
        if file not in files:
            problems.append(f"{name}: the run wrote no {file}, and a trace of it is recorded")
            continue
        problems += compare_trace(file, files[file], trace_path(name, file).read_bytes())
    exact = recorded_hashes(name, cls)
    if exact is not None:
        got = {f: sha256(b) for f, b in files.items()}
        for file in sorted(set(exact) | set(got)):
            if exact.get(file) != got.get(file):
                problems.append(f"{name}: {file} is not byte-identical to its golden on numerics class "
                                f"{cls.name} ({got.get(file, 'not written')} != {exact.get(file, 'not recorded')})")
        what = f"trace and bytes, numerics class {cls.describe()}"
    else:
        what = f"trace only: numerics class {cls.describe()} has no recorded bytes"
    return problems, what


def record(names: list[str], traces: bool) -> int:
    """Run ``names`` and record this class's hashes (and with ``traces``, the traces)."""
    import time

    cls = numerics_class()
    table = load_hashes()
    entry = table.setdefault(cls.name, {"torch_cpu_capability": cls.torch_cpu_capability,
                                        "llvm_host": cls.llvm_host, "versions": cls.versions,
                                        "cpu": _cpu_model(), "scenarios": {}})
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            files = run_golden(name, Path(tmp) / name)
            entry["scenarios"][name] = {f: sha256(b) for f, b in sorted(files.items())}
            if traces:
                folder = trace_path(name, "x").parent
                for old in folder.glob("*.csv"):
                    old.unlink()
                folder.mkdir(parents=True, exist_ok=True)
                for f, b in files.items():
                    trace_path(name, f).write_bytes(trace_of(b, SCENARIO_HORIZON.get(name, HORIZON)))
            print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    entry["scenarios"] = dict(sorted(entry["scenarios"].items()))
    HASHES.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"recorded on numerics class {cls.describe()}")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.golden.goldens", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="scenario files (default: all)")
    p.add_argument("--record", action="store_true", help="record this numerics class's exact hashes")
    p.add_argument("--trace", action="store_true", help="with --record: record the numeric traces too")
    p.add_argument("--class", dest="show_class", action="store_true", help="print this machine's numerics class")
    args = p.parse_args(argv)
    # the class is probed before any run, as the test session does (tests/conftest.py): every run sets
    # numpy's BLAS to one thread (``marl_q.native.single_thread_blas``), which moves the probe's complex GEMMs'
    # last bits, so a class probed after one named another class
    cls = numerics_class()
    if args.show_class:
        print(cls.describe())
        return 0
    # a name may leave out ".yaml", or be the file's path (scenarios/NAME.yaml)
    names = [Path(n).name if n.endswith(".yaml") else f"{n}.yaml" for n in args.names] or scenario_files()
    unknown = sorted(set(names) - set(scenario_files()))
    if unknown:
        print(f"unknown scenario files: {unknown}; known: {scenario_files()}", file=sys.stderr)
        return 2
    if args.record:
        return record(names, args.trace)
    # check
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            problems, what = check(name, run_golden(name, Path(tmp) / name))
            print(f"{name}: {'ok' if not problems else 'FAILED'} ({what})")
            for line in problems:
                print("   ", line)
            failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
