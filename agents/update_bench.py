"""`marlq bench update`: the time of one epoch of the team actor-critic update, by what it runs through.
An epoch alone is not a whole run: docs/performance.md has a change that was faster here and slower in runs.

One PPO epoch (forward, loss, backward, grad-norm clip, optimizer step) over ``--rows`` samples of
spread_mappo's shapes (actor 21-64-64-5 on the observation and agent id, critic 57-64-64-1 on the
state, tanh), four ways, interleaved in one process on the same tensors:

- ``torch``: the heads as torch modules with ``nn.Tanh`` (torch's tanh kernel), autograd, torch.optim.Adam;
- ``numpy tanh``: the heads' tanh through numpy (``agents.heads.Tanh``), autograd, torch.optim.Adam;
- ``flat adam``: that, with marl_q.optim's FlatAdam: the torch path of a run (``fast_path: false``);
- ``numpy epochs``: ``agents.actor_critic.numpy_epochs``, the heads' float32 numpy twins and the loss's
  gradient by hand, with the same FlatAdam: what a run does today.

It first checks that ``numpy tanh`` and ``flat adam`` leave the same parameters after ``--check`` epochs from
the same start (they compute the same bits; ``torch`` differs from them in tanh's last bits only), and
reports how far ``numpy epochs`` ends from them (float32 rounding, through Adam). Medians and
ranges of ``--repeats`` blocks of ``--epochs`` epochs each, milliseconds per epoch, one torch thread.
``--json`` prints the figures as one JSON object. Timings are printed, never asserted
(docs/performance.md quotes them).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

VARIANTS = ("torch", "numpy tanh", "flat adam", "numpy epochs")


def _setup(rows: int, seed: int) -> dict[str, Any]:
    from agents.actor_critic import PPOConfig
    from agents.heads import MLPConfig, build_mlp

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    actor, critic = build_mlp(MLPConfig(hidden=[64, 64]), 21, 5), build_mlp(MLPConfig(hidden=[64, 64]), 57, 1)
    data = {"obs": torch.randn(rows, 21, generator=g), "critic_obs": torch.randn(rows, 57, generator=g),
            "act": torch.randint(0, 5, (rows,), generator=g), "adv": torch.randn(rows, generator=g),
            "ret": torch.randn(rows, generator=g), "old_logp": torch.randn(rows, generator=g) - 1.6}
    return {"actor": actor, "critic": critic, "data": data, "ac": PPOConfig(ent_coef=0.01, max_grad_norm=0.5, lr=5e-4)}


class _TorchAdam:
    """torch.optim.Adam behind the flat optimizers' ``step(grad)`` (the gradient is already in ``.grad``)."""

    def __init__(self, param: torch.Tensor, ac: Any) -> None:
        self.optimizer = torch.optim.Adam([param], lr=ac.lr, eps=ac.eps)

    def step(self, grad: torch.Tensor) -> None:
        self.optimizer.step()


def _variant(name: str, base: dict[str, Any]) -> tuple[Callable[[], None], Callable[[], torch.Tensor]]:
    """(one epoch, the parameters now) of a fresh copy of the heads run the ``name`` way."""
    from agents.actor_critic import descend, make_optimizer
    from agents.heads import FlatParameters, Tanh
    from agents.losses import actor_critic_loss, categorical

    from agents.actor_critic import UpdateSamples, float32_twin, numpy_epochs

    actor, critic = copy.deepcopy(base["actor"]), copy.deepcopy(base["critic"])
    if name == "torch":  # torch's own tanh kernel
        actor, critic = (nn.Sequential(*[nn.Tanh() if isinstance(m, Tanh) else m for m in net]) for net in (actor, critic))
    flat = FlatParameters(actor, critic)
    ac, x = base["ac"], base["data"]
    optimizer = make_optimizer("adam", flat.flat, ac) if name in ("flat adam", "numpy epochs") else _TorchAdam(flat.flat, ac)

    if name == "numpy epochs":  # the run's own function, one epoch of one minibatch a call
        one = copy.copy(ac)
        one.epochs, one.minibatches = 1, 1
        twins = float32_twin(actor), float32_twin(critic)  # (update_twins leaves one pass to torch)
        prep = UpdateSamples({**x, "avail": None, "old_v": None}, None, False)
        rng = np.random.default_rng(0)

        def numpy_epoch() -> None:
            numpy_epochs(one, twins, flat, optimizer, rng, prep)

        return numpy_epoch, lambda: flat.flat.detach().clone()

    def epoch() -> None:
        logits, values = actor(x["obs"]), critic(x["critic_obs"]).squeeze(-1)
        logp, entropy = categorical(logits, x["act"], True)
        terms = actor_critic_loss(ac, logp, x["adv"], values, x["ret"], old_logp=x["old_logp"], entropy=entropy)
        descend(terms.loss, flat, optimizer, ac.max_grad_norm)  # what a worker's epoch does after its loss

    return epoch, lambda: flat.flat.detach().clone()


def measure(rows: int = 1200, epochs: int = 100, repeats: int = 3, check: int = 5, seed: int = 0) -> dict[str, Any]:
    """ms per epoch of each variant (medians and ranges over ``repeats`` interleaved blocks) and whether the
    flat-buffer variants agree bit for bit after ``check`` epochs."""
    base = _setup(rows, seed)
    finals = {}
    for name in VARIANTS:
        epoch, params = _variant(name, base)
        for _ in range(check):
            epoch()
        finals[name] = params()
    same = torch.equal(finals["numpy tanh"], finals["flat adam"])
    apart = float((finals["numpy epochs"] - finals["flat adam"]).abs().max())
    runs = {name: _variant(name, base)[0] for name in VARIANTS}
    for epoch in runs.values():  # warm-up: first-call allocations, numpy's dispatch
        for _ in range(3):
            epoch()
    blocks: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, epoch in runs.items():
            start = time.perf_counter()
            for _ in range(epochs):
                epoch()
            blocks[name].append((time.perf_counter() - start) / epochs * 1e3)
    return {"rows": rows, "epochs": epochs, "repeats": repeats, "same_bits": same, "numpy_epochs_apart": apart,
            "ms_per_epoch": {n: {"median": statistics.median(v), "min": min(v), "max": max(v)} for n, v in blocks.items()}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="marlq bench update", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1200, help="samples per epoch (default: spread_mappo's 1,200)")
    p.add_argument("--epochs", type=int, default=100, help="epochs per timed block (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved blocks per variant (default: %(default)s)")
    p.add_argument("--check", type=int, default=5, help="epochs of the bit-for-bit check (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    for key in ("rows", "epochs", "repeats", "check"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    torch.set_num_threads(1)
    out = measure(args.rows, args.epochs, args.repeats, args.check)
    if args.json:
        print(json.dumps(out))
        return 0
    base = out["ms_per_epoch"]["torch"]["median"]
    print(f"one PPO epoch, {args.rows} rows, spread_mappo's heads; ms per epoch over {args.repeats} blocks of "
          f"{args.epochs}; flat-buffer variants bit for bit: {out['same_bits']}; numpy epochs' parameters after "
          f"{args.check} epochs within {out['numpy_epochs_apart']:.2e} of flat adam's (lr {5e-4:g} a step)")
    for name, t in out["ms_per_epoch"].items():
        print(f"  {name:12s} median {t['median']:.3f} (range {t['min']:.3f}-{t['max']:.3f})  "
              f"{base / t['median']:.2f}x torch")
    return 0


BENCHES = {"update": main}  # marlq bench update
