"""A team learner's loop split into its rollout and its update, timed without a profiler.

cProfile (``analysis.profile_breakdown``) charges every Python call, so it inflates the Python-heavy parts
of a loop (the env's and the rollout's small calls) against the arithmetic. This times them as they run:
one ``TeamWorker`` (IPPO, MAPPO, IA2C, MAA2C) built from a scenario file rolls out and updates
``--rollouts`` times after ``--warmup`` rounds, and each rollout's and update's seconds are divided by
the env steps the rollout took. Then the calls inside one rollout step, each repeated: the team vector's
step (and, for a batched env, the batch's own ``step`` and ``observations``), filling the rows, the
actor's forward and the sample. Medians over the rollouts; run it pinned to one core
(``taskset -c 0``), one thread, the other core idle.

    python -m analysis.loop_split scenarios/spread_ippo_jaxmarl.yaml --rollouts 10
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from marl_q.errors import UserError


def _per_call(f: Callable[[], Any], repeats: int) -> float:
    """Median seconds of one call of ``f`` over 5 blocks of ``repeats`` calls (after one call)."""
    f()
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            f()
        blocks.append((time.perf_counter() - start) / repeats)
    return statistics.median(blocks)


def split(scenario: str, sets: list[str], rollouts: int, warmup: int, repeats: int) -> dict[str, Any]:
    """The rollout's and the update's seconds per env step (medians over ``rollouts``) and one rollout
    step's calls (seconds per call)."""
    from agents.mappo import TeamWorker
    from marl_q.config import load_config
    from marl_q.native import prepare_process
    from marl_q.runtime import algorithm_class

    for name, value, least in (("--rollouts", rollouts, 1), ("--warmup", warmup, 0), ("--repeats", repeats, 1)):
        if value < least:
            raise UserError(f"{name}: must be at least {least}, got {value}")
    cfg = load_config(scenario, sets)
    algorithm = algorithm_class(cfg)(cfg)
    worker = algorithm.make_worker(0)
    if not isinstance(worker, TeamWorker):
        raise UserError(f"{scenario}: algorithm {cfg.algorithm.name!r} has no team worker (this split is for "
                        "ippo, mappo, ia2c and maa2c)")
    prepare_process()
    worker.reset_env()
    for _ in range(warmup):
        batch, _, _ = worker.rollout()
        worker.learn(batch)
    rollout_s, update_s, steps = [], [], 0
    for _ in range(rollouts):
        start = time.perf_counter()
        batch, _, steps = worker.rollout()
        middle = time.perf_counter()
        worker.learn(batch)
        end = time.perf_counter()
        if steps:
            rollout_s.append((middle - start) / steps)
            update_s.append((end - middle) / steps)
    if not rollout_s:
        raise UserError(f"{scenario}: no rollout took an env step")
    vec, part = worker.vec, worker.begin_rollout(1)
    rows = part.rows
    actions = np.zeros(rows, dtype=np.int64)
    calls: dict[str, float] = {}
    batched = getattr(vec, "batch", None)
    if batched is not None:
        E = batched.num_envs
        calls["the batch's step"] = _per_call(lambda: batched.step(actions.reshape(E, -1)), repeats)
        calls["the batch's observations"] = _per_call(batched.observations, repeats)
    calls["the team vector's step"] = _per_call(lambda: vec.step(worker.dist.to_env(actions)), repeats)
    avail = None if part.avail is None else part.avail[0]
    calls["filling the rows"] = _per_call(
        lambda: worker._fill(vec, part.obs[0], None if part.critic is None else part.critic[0], avail), repeats)
    calls["filling the rows, acting and sampling (act_rows)"] = _per_call(lambda: worker.act_rows(_rewound(part), vec), repeats)
    return {"scenario": scenario, "env_steps_per_rollout": steps, "copies": len(worker.envs),
            "rollout_s": statistics.median(rollout_s), "update_s": statistics.median(update_s), "calls": calls}


def _rewound(part: Any) -> Any:
    part.clock = 0  # act_rows writes step 0's rows again on every call
    return part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="a scenario file whose algorithm is ippo, mappo, ia2c or maa2c")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--rollouts", type=int, default=10, help="rollouts (and updates) timed")
    parser.add_argument("--warmup", type=int, default=3, help="rollouts and updates before the timed ones")
    parser.add_argument("--repeats", type=int, default=500, help="calls per block when timing one step's calls")
    args = parser.parse_args(argv)
    try:
        r = split(args.scenario, args.set, args.rollouts, args.warmup, args.repeats)
    except (UserError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = r["rollout_s"] + r["update_s"]
    print(f"{r['scenario']}: {r['copies']} copies, {r['env_steps_per_rollout']} env steps a rollout; per env step: "
          f"rollout {r['rollout_s'] * 1e6:.2f} us, update {r['update_s'] * 1e6:.2f} us "
          f"({r['update_s'] / total:.0%} of the two)")
    for name, seconds in r["calls"].items():
        print(f"  {name}: {seconds * 1e6:.1f} us a call ({seconds / r['copies'] * 1e6:.2f} us per copy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
