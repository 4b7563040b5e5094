"""A cProfile of a team actor-critic run (ippo/mappo/ia2c/maa2c) grouped into where its time goes.

    python -m cProfile -o run.prof -m marl_q.cli run scenarios/spread_mappo.yaml \
        --set run.total_env_steps=100000 --set run.eval_every=null --set run.plots=false --quiet
    python -m analysis.profile_breakdown run.prof [more.prof ...]

prints a markdown table per file: env stepping (the env's own step/reset/observation code), acting
forward (the actor's forward in the rollout), sampling, rollout bookkeeping (the rest of the
rollout: the loop, the vector adapter, the batch arrays), GAE and value targets, the update's
forward and loss, its backward, the optimizer (grad-norm clip and Adam), the rest of the worker's
step, and the server side (messages, aggregation, ledger, metrics files), in seconds and as a share
of the training loop (``marl_q.driver``'s run). Categories are cumulative times of named functions,
so a profiler's overhead is counted where it falls (it inflates the Python-heavy parts most);
docs/performance.md has the figures.
"""
from __future__ import annotations

import pstats
import sys

def cum(st: dict, file_part: str, name: str, caller=None) -> float:
    """Cumulative seconds of the functions called ``name`` in files containing ``file_part`` (only
    their calls from callers for which ``caller(file, function)`` holds, when given)."""
    t = 0.0
    for (f, line, fn), (cc, nc, tt, ct, callers) in st.items():
        if fn == name and file_part in f:
            if caller is None:
                t += ct
            else:
                for (cf, cl, cfn), v in callers.items():
                    if caller(cf, cfn):
                        t += v[3]
    return t

def breakdown(path: str) -> tuple[float, float, list[tuple[str, float]]]:
    """(process seconds, training-loop seconds, [(category, seconds)]) of one profile."""
    st = pstats.Stats(path).stats  # (file, line, function) -> (cc, nc, tt, ct, callers)
    total = cum(st, "marl_q/cli.py", "main")
    loop = cum(st, "marl_q/driver.py", "run")
    worker = cum(st, "agents/actor_critic.py", "step")
    roll = cum(st, "agents/mappo.py", "rollout")
    env = (cum(st, "spread_native.py", "step") + cum(st, "spread_native.py", "reset")
           + cum(st, "spread_native.py", "state") + cum(st, "spread_native.py", "observations"))
    def acting(f: str, fn: str) -> bool:  # the team worker's acting functions
        return f.endswith("agents/mappo.py") and fn in ("act", "_act", "act_rows")

    # the actor through torch, or through its float32 numpy twin (agents.mappo.TeamWorker.act_twin)
    act_fwd = (cum(st, "torch/nn/modules/module.py", "_wrapped_call_impl", caller=acting)
               + cum(st, "agents/numpy_heads.py", "forward", caller=acting))
    sampling = cum(st, "agents/distributions.py", "sample")
    learn = cum(st, "agents/actor_critic.py", "actor_critic_update")
    gae = cum(st, "agents/", "rollout_targets")
    # autograd's, and the numpy epochs' (agents.actor_critic.numpy_epochs: the twins' backward)
    backward = cum(st, "torch/_tensor.py", "backward") + cum(
        st, "agents/numpy_heads.py", "backward", caller=lambda f, fn: f.endswith("agents/actor_critic.py"))
    opt = (cum(st, "torch/optim/adam.py", "step") + cum(st, "marl_q/optim.py", "step")
           + cum(st, "torch/nn/utils/clip_grad.py", "clip_grad_norm_", caller=lambda f, fn: "actor_critic" in f))
    fwd = learn - gae - backward - opt
    rows = [("env stepping", env), ("acting forward", act_fwd), ("sampling", sampling),
            ("rollout bookkeeping", roll - env - act_fwd - sampling),
            ("GAE + value targets", gae), ("update forward + loss", fwd), ("update backward", backward),
            ("optimizer (clip + Adam)", opt),
            ("worker step rest (delta, message build)", worker - roll - learn),
            ("server, messages, ledger, metrics", loop - worker)]
    return total, loop, rows

def main(paths: list[str]) -> None:
    for path in paths:
        total, loop, rows = breakdown(path)
        print(f"## {path}: process {total:.1f} s, training loop {loop:.1f} s")
        for name, t in rows:
            print(f"| {name} | {t:.1f} | {100 * t / max(loop, 1e-9):.0f}% |")


if __name__ == "__main__":
    main(sys.argv[1:])
