"""A team learner's loop split into its rollout and its update, timed without a profiler.

cProfile (``analysis.profile_breakdown``) charges every Python call, so it inflates the Python-heavy parts
of a loop (the env's and the rollout's small calls) against the arithmetic. This times them as they run:
one ``TeamWorker`` (IPPO, MAPPO, IA2C, MAA2C) built from a scenario file rolls out and updates
``--rollouts`` times after ``--warmup`` rounds, and each rollout's and update's seconds are divided by
the env steps the rollout took. Then the calls inside one rollout step, each repeated: the team vector's
step (and, for a batched env, the batch's own ``step`` and ``observations``), filling the rows, the
actor's forward and the sample; and where the update takes PPO's numpy epochs, each step of one of its
minibatches (gathering the rows, the heads' forwards, the loss's gradient, the backwards, the clip and the
optimizer step). Medians over the rollouts; run it pinned to one core
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
            "rollout_s": statistics.median(rollout_s), "update_s": statistics.median(update_s), "calls": calls,
            "minibatch": minibatch_parts(worker, batch, repeats)}


def minibatch_parts(worker: Any, batch: dict[str, np.ndarray], repeats: int) -> dict[str, float]:
    """Seconds of each step of one minibatch of PPO's numpy epochs (``agents.actor_critic.numpy_epochs``,
    in its order) on the worker's last rollout; empty where its update does not take them (one pass,
    ``fast_path: false``, continuous actions, a recurrent head). Only the gradient is formed and stepped
    here, as the update does: the worker's parameters move."""
    from agents.actor_critic import (clip_and_step, minibatch_loss_grad, minibatch_rows, minibatches_of,
                                     numpy_samples, update_samples, update_twins)
    from agents.distributions import masked_logits_np

    ac = worker.ac
    twins = None if worker.memory is not None else update_twins(ac, worker.actor, worker.critic, worker.dist)
    if twins is None:
        return {}
    prep = update_samples(ac, worker.actor, worker.critic, batch, dist=worker.dist, value_norm=worker.value_norm,
                          twins=twins)
    s, same = numpy_samples(prep)
    mb = minibatches_of(len(s["act"]), ac.minibatches, np.random.default_rng(0))[0]
    actor, critic = twins
    x = minibatch_rows(s, mb, same)
    critic_in = x["obs"] if same else x["critic_obs"]
    logits, actor_cache = actor.forward(x["obs"])
    logits = masked_logits_np(logits, x["avail"])
    values, critic_cache = critic.forward(critic_in)

    def grads() -> tuple[np.ndarray, np.ndarray]:
        return minibatch_loss_grad(ac, x, logits, values, {})

    grad_logits, grad_values = grads()
    return {"gathering its rows": _per_call(lambda: minibatch_rows(s, mb, same), repeats),
            "the actor's forward": _per_call(lambda: actor.forward(x["obs"]), repeats),
            "the critic's forward": _per_call(lambda: critic.forward(critic_in), repeats),
            "the loss's gradient (loss_grad)": _per_call(grads, repeats),
            "the critic's backward": _per_call(lambda: critic.backward(critic_cache, grad_values[:, None]), repeats),
            "the actor's backward": _per_call(lambda: actor.backward(actor_cache, grad_logits), repeats),
            "the clip and the optimizer step": _per_call(
                lambda: clip_and_step(worker.flat, worker.optimizer, ac.max_grad_norm), repeats),
            "rows": float(len(x["act"]))}


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
    parts = dict(r["minibatch"])
    if parts:
        rows = int(parts.pop("rows"))
        print(f"one minibatch of PPO's numpy epochs ({rows} rows):")
        for name, seconds in parts.items():
            print(f"  {name}: {seconds * 1e6:.1f} us")
    else:
        print("(its update does not take PPO's numpy epochs: no minibatch split)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
