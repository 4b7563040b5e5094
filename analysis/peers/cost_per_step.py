"""CPU time per env step of a scenario in two checkouts of marl-q, interleaved: the before/after figure of
an engine change. Each run is its own process, pinned to one CPU, with PYTHONPATH on the checkout.

    git worktree add --detach ../before <commit>
    python analysis/peers/cost_per_step.py scenarios/spread_coma.yaml --steps 24608 --rounds 3 \\
        --trees before=../before,after=. --variant quantum="actor={head: vqc, n_qubits: 8, layers: 2, \\
        preprocess: linear, output: linear, scaling: atan}" --variant mlp=

prints every run, then per (variant, tree) the median and range, and per tree and round the ratio of the
first variant to the second (the per-round ratio is the figure on a shared machine).

``--short N`` also runs each variant and tree at N env steps in every round, and reports the marginal cost
(T(steps) - T(N)) / (steps - N): a run's one-off costs (numba's start-up and cached-code load, first
compiles, building the env) cancel, leaving what a longer run pays per env step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(scenario: str, steps: int, override: str) -> None:
    """One run in this process: print its CPU ms per env step as JSON (with where marl_q came from)."""
    import marl_q
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    overrides = [f"run.total_env_steps={steps}", "run.plots=false", "run.progress=false", "run.checkpoint_every=0"]
    if "coma" in scenario:
        overrides.append("algorithm.eval_episodes=0")  # the end-of-run evaluation is not a training step
    cfg = load_config(scenario, overrides + ([override] if override else []))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.process_time()
        run_experiment(cfg, Path(tmp) / "r")
        seconds = time.process_time() - start
        env_steps = json.loads((Path(tmp) / "r" / "summary.json").read_text())["env_steps"]
    print(json.dumps({"marl_q": marl_q.__file__, "ms_per_step": seconds / env_steps * 1e3, "seconds": seconds,
                      "env_steps": env_steps}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--steps", type=int, default=24608)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trees", default="after=.", help="name=path,... (checkouts of marl-q)")
    parser.add_argument("--variant", action="append", default=[], help="name=override (repeatable; empty: none)")
    parser.add_argument("--short", type=int, default=0, help="also run at this many steps: the marginal cost per step")
    parser.add_argument("--cpu", default="0")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return 0
    try:
        trees = dict(item.split("=", 1) for item in args.trees.split(","))
        variants = dict(item.split("=", 1) for item in (args.variant or ["base="]))
    except ValueError:
        print("cost_per_step: --trees and --variant take name=value", file=sys.stderr)
        return 2
    for name, tree in trees.items():
        if not (Path(tree) / "marl_q" / "__init__.py").is_file():
            print(f"cost_per_step: --trees {name}={tree}: not a marl-q checkout", file=sys.stderr)
            return 2
    if args.short and not 0 < args.short < args.steps:
        print(f"cost_per_step: --short {args.short} must lie in (0, --steps {args.steps})", file=sys.stderr)
        return 2
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    results: dict[tuple[str, str], list[float]] = {}
    marginal: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for variant, override in variants.items():
            for name, tree in trees.items():
                runs = []
                for steps in ([args.short] if args.short else []) + [args.steps]:
                    got = run_child(args, name, str(Path(tree).resolve()), variant, override, steps)
                    if got is None:
                        return 1
                    runs.append(got)
                    print(f"round {r} {variant} {name} {steps} steps: {got['ms_per_step']:.4f} ms/step", flush=True)
                results.setdefault((variant, name), []).append(runs[-1]["ms_per_step"])
                if args.short:
                    short, long = runs
                    cost = (long["seconds"] - short["seconds"]) / (long["env_steps"] - short["env_steps"]) * 1e3
                    marginal.setdefault((variant, name), []).append(cost)
                    print(f"round {r} {variant} {name} marginal: {cost:.4f} ms/step", flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for label, table in (("", results), (" marginal", marginal)):
        for (variant, name), values in table.items():
            print(f"{variant} {name}{label}: median {statistics.median(values):.4f} ms/step, "
                  f"range {min(values):.4f}-{max(values):.4f}")
        if len(variants) >= 2 and table:
            first, second = list(variants)[:2]
            for name in trees:
                ratios = [a / b for a, b in zip(table[(first, name)], table[(second, name)])]
                print(f"{name}{label}: {first}/{second} per round {[round(x, 2) for x in ratios]}, "
                      f"median {statistics.median(ratios):.2f}")
    return 0


def run_child(args: argparse.Namespace, name: str, tree: str, variant: str, override: str, steps: int) -> dict | None:
    """One pinned run of ``variant`` in checkout ``tree``: the child's JSON, or None (said on stderr)."""
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(["taskset", "-c", args.cpu, sys.executable, str(Path(__file__).resolve()), "x",
                           "--child", args.scenario, str(steps), override],
                          cwd=tree, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        print(f"cost_per_step: the {variant} run in {name} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    got = json.loads(lines[-1])
    if not got["marl_q"].startswith(tree):
        print(f"cost_per_step: {name} imported marl_q from {got['marl_q']}", file=sys.stderr)
        return None
    return got


if __name__ == "__main__":
    sys.exit(main())
