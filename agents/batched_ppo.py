"""Seeds as a batch dimension for the team actor-critic learners with one worker: MAPPO, IPPO, IA2C, MAA2C.

``marlq sweep FILE --seeds N --batch-seeds`` on a team actor-critic file (``scenarios/spread_mappo.yaml``,
``--set algorithm.name=ippo``) runs its seeds in one process. Each seed is its single run, whole: its own
``run_experiment`` (config.yaml, Runtime, the sim backend's event loop, its server, its worker with the
single run's seeding, initial parameters and env copies, evaluation, checkpoints and snapshots,
summary.json, plots), in a thread of its own. What is shared is the update, where the time of a run
goes (about half of a MAPPO spread run's CPU: ten epochs of forward and backward over 1,200 samples):

- the seeds' threads take turns, one at a time (a baton: no two run at once, so the process-wide
  generators and ``seeded_init``'s fork of torch's are used as in a single process); each runs its
  own sim until its worker calls ``actor_critic_update``;
- there the thread-local hook ``agents.actor_critic.SEED_BATCH`` takes the call: the seed's samples are
  prepared by the single run's code (``update_samples``: the heads at the rollout's parameters, GAE,
  the value normalisation's statistics), and the thread parks;
- when every live seed has parked or finished, the coordinator descends all parked seeds at once
  (``batched_update``): their flat parameters are the rows of one (S, P) tensor; per epoch each seed
  draws its minibatch permutation from its own generator (``minibatches_of``, as alone); the loss is
  ``agents.losses.actor_critic_loss`` itself, evaluated for every seed in one call by
  ``torch.func.vmap`` over ``torch.func.functional_call`` of the seed's heads on its row, every row's
  gradient from one backward of the seeds' summed losses; each row's gradient is clipped to ``max_grad_norm`` on its own norm (as
  ``nn.utils.clip_grad_norm_`` does for one seed); the worker's optimizer (``make_optimizer``: Adam,
  RMSprop or SGD, element-wise) steps all rows in one call, its state (moments, step) taken from and
  given back to each seed's own optimizer. The results go back into each seed's worker (parameters,
  gradient, optimizer state) and each seed's train.csv diagnostics are computed as alone
  (``ratio_stats``, ``update_diagnostics``), and the threads go on.

The batched matmuls (vmap's) and reductions are not the single run's kernels, so a batched seed's
parameters differ from its single run's in the last bits after its first update, and its later rollouts
may then sample other actions: the files have the single run's names, columns and meaning, not its
bytes. The first update equals the single run's to float32 tolerance (tests/marl_q/
test_batched_ppo.py), and the final returns of batched and single seeds are statistically equivalent
(docs/statistics.md, "Batched seeds").

Refused before anything is written (``check_team_batchable``: exit 2 naming the key): a backend other
than sim, more than one worker (asynchronous multi-worker runs may come later), recurrent heads (their
chunked update is agents/recurrent_ac.py's, not batched), heads other than ``mlp``, ``share_params:
false`` (``PerAgent`` routes rows by id), one learner per team (``learners:``), turn-based games and
continuous actions (not tested batched).
"""
from __future__ import annotations

import copy
import sys
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from agents.actor_critic import (SEED_BATCH, UpdateSamples, minibatches_of, log_prob_entropy, make_optimizer,
                                 update_diagnostics, update_samples, update_twins)
from agents.heads import FlatParameters
from agents.losses import LossTerms, actor_critic_loss, ratio_stats
from marl_q.errors import ConfigError
from marl_q.optim import FlatOptimizer
from marl_q.progress import Progress, tap_runs

TEAM_ALGORITHMS = ("mappo", "ippo", "ia2c", "maa2c")


# ----------------------------------------------------------------------------- what can be batched
def check_team_batchable(cfg: Any) -> None:
    """Refuse (ConfigError naming the key) a team actor-critic configuration whose seeds this module
    cannot run side by side."""
    def refuse(key: str, value: Any, why: str) -> None:
        raise ConfigError(f"--batch-seeds: {key}={value!r} cannot be batched ({why})")

    if cfg.algorithm.name not in TEAM_ALGORITHMS:
        refuse("algorithm.name", cfg.algorithm.name, f"batched team learners: {', '.join(TEAM_ALGORITHMS)}")
    if cfg.backend.name != "sim":
        refuse("backend.name", cfg.backend.name, "seeds are batched on the sim backend only")
    if cfg.backend.workers != 1:
        refuse("backend.workers", cfg.backend.workers,
               "one worker per seed; asynchronous multi-worker runs are not batched yet")
    if cfg.learners:
        refuse("learners", sorted(cfg.learners), "one learner per team is not batched")
    if not cfg.algorithm.share_params:
        refuse("algorithm.share_params", False, "per-agent networks route rows by agent id, not batched")
    for role in ("actor", "critic"):
        section = getattr(cfg, role)
        if getattr(section.params, "recurrent", None) is not None:
            refuse(f"{role}.recurrent", section.params.recurrent, "the recurrent update is not batched")
        if section.name != "mlp":
            refuse(f"{role}.head", section.name, "only mlp heads are batched (torch.func.vmap over the heads)")
    if getattr(cfg.scenario.params, "turns", None):
        refuse("scenario.turns", "...", "turn-based games are not batched")
    from gymnasium import spaces

    from agents.mappo import describe_team, make_env

    env = make_env(cfg, cfg.run.seed)
    try:
        space = describe_team(cfg, env).action_space
    finally:
        env.close()
    if not isinstance(space, spaces.Discrete):
        refuse("scenario.name", cfg.scenario.name, "continuous actions are not batched yet")


# ----------------------------------------------------------------------------- the batched update
@dataclass
class UpdateJob:
    """One seed's parked ``actor_critic_update`` call: its worker's objects and prepared samples; ``diag``
    receives its train.csv diagnostics."""

    ac: Any
    actor: nn.Module
    critic: nn.Module
    flat: FlatParameters
    optimizer: Optional[FlatOptimizer]
    rng: np.random.Generator
    prep: UpdateSamples
    dist: Any
    diag: Optional[dict[str, Optional[float]]] = None

    def key(self) -> tuple:
        """Seeds whose updates can share one call: as many samples, the same layout and learning rate."""
        lr = None if self.optimizer is None else self.optimizer.lr
        return (len(self.prep.samples["act"]), self.flat.size, lr)


def _param_spec(flat: FlatParameters, module: nn.Module) -> list[tuple[str, int, int, torch.Size]]:
    """(name, offset, size, shape) of each parameter of ``module`` in ``flat``'s buffer (read off the views)."""
    base = flat.flat.data_ptr()
    size = flat.flat.element_size()
    return [(name, (p.data_ptr() - base) // size, p.numel(), p.shape) for name, p in module.named_parameters()]


def _views(p: torch.Tensor, spec: list) -> dict[str, torch.Tensor]:
    return {name: p[o:o + n].view(shape) for name, o, n, shape in spec}


def clip_rows(grads: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Each row scaled as ``nn.utils.clip_grad_norm_`` scales one seed's gradient: by
    min(1, max_norm / (norm + 1e-6)) with the row's Euclidean norm."""
    norms = torch.linalg.vector_norm(grads, 2.0, dim=1)
    return grads * torch.clamp(max_norm / (norms + 1e-6), max=1.0)[:, None]


def batched_update(jobs: list[UpdateJob]) -> None:
    """Every job's update (seeds with as many samples together, ``UpdateJob.key``); each job's worker
    gets its parameters, gradient and optimizer state back and ``job.diag`` its diagnostics."""
    groups: dict[tuple, list[UpdateJob]] = {}
    for job in jobs:
        groups.setdefault(job.key(), []).append(job)
    for group in groups.values():
        _descend_group(group)


def _descend_group(jobs: list[UpdateJob]) -> None:
    j0 = jobs[0]
    ac, dist, S = j0.ac, j0.dist, len(jobs)
    actor_spec, critic_spec = _param_spec(j0.flat, j0.actor), _param_spec(j0.flat, j0.critic)
    keys = [k for k, v in j0.prep.samples.items() if v is not None]
    X = {k: torch.stack([j.prep.samples[k] for j in jobs]) for k in keys}
    W = torch.stack([j.flat.flat.detach() for j in jobs])  # (S, P): row s is seed s's parameters
    opt = None
    if j0.optimizer is not None:  # the same flat optimizer on the (S, P) rows (element-wise)
        opt = make_optimizer(ac.optimizer, W, ac)
        opt.lr = j0.optimizer.lr
        states = [j.optimizer.state_dict() for j in jobs]
        # rows from each seed's optimizer; scalars (the step count) are every seed's alike
        opt.load_state_dict({k: torch.stack([st[k] for st in states]) if v.dim() else v for k, v in states[0].items()})
    entropy_wanted = ac.ent_coef != 0.0

    def seed_loss(pa: dict[str, torch.Tensor], pc: dict[str, torch.Tensor], x: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, tuple]:
        """One seed's ``actor_critic_loss`` at its heads' parameters ``pa``, ``pc`` on its samples ``x``."""
        logits = functional_call(j0.actor, pa, (x["obs"],))
        logp, entropy = log_prob_entropy(dist, logits, x["act"], x.get("avail"), entropy_wanted)
        values = functional_call(j0.critic, pc, (x["critic_obs"],)).squeeze(-1)
        terms = actor_critic_loss(ac, logp, x["adv"], values, x["ret"], old_logp=x.get("old_logp"),
                                  old_values=x.get("old_v"), entropy=entropy)
        ent = terms.entropy if terms.entropy is not None else torch.zeros(())
        return terms.loss, (terms.policy, terms.value, ent, logp, logits)

    forward = vmap(seed_loss)
    order = sorted(actor_spec + critic_spec, key=lambda spec: spec[1])
    if [o for _, o, _, _ in order] != list(np.cumsum([0] + [n for _, _, n, _ in order])[:-1]) or \
            sum(n for _, _, n, _ in order) != W.shape[1]:
        raise ValueError("batched seeds: the heads' parameters do not tile the flat buffer")

    def step(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple]:
        """Every seed's loss in one vmap'd call on (S, ...) copies of the heads' parameters (contiguous:
        views of the (S, P) rows made bmm 2x slower); one backward of the seeds' summed losses gives each
        seed its own gradient (they share nothing), gathered into (S, P) rows in the buffer's order.
        (``torch.func.grad`` under vmap computed the same 1.5x slower.)"""
        leaves = {id(spec): W[:, o:o + n].reshape(S, *shape).requires_grad_() for spec in order
                  for _, o, n, shape in [spec]}
        pa = {spec[0]: leaves[id(spec)] for spec in actor_spec}
        pc = {spec[0]: leaves[id(spec)] for spec in critic_spec}
        losses, aux = forward(pa, pc, x)
        losses.sum().backward()
        return torch.cat([leaves[id(spec)].grad.reshape(S, -1) for spec in order], dim=1), \
            tuple(a.detach() for a in aux)

    rows = torch.arange(S)[:, None]
    clipfracs: list[list[float]] = [[] for _ in jobs]
    last, grads = None, None
    single_pass = j0.prep.single_pass
    for _ in range(ac.epochs):
        if single_pass:
            epoch = [None]
        else:  # each seed's permutation from its own generator, as alone
            per_seed = [minibatches_of(len(j.prep.samples["act"]), ac.minibatches, j.rng) for j in jobs]
            epoch = [torch.stack(mbs) if mbs[0] is not None else None for mbs in zip(*per_seed)]
        for idx in epoch:
            x = X if idx is None else {k: v[rows, idx] for k, v in X.items()}
            grads, (policy, value, ent, logp, logits) = step(x)
            kls = [None] * S
            if ac.clip is not None:
                kls = [ratio_stats(logp[s], x["old_logp"][s], ac.clip) for s in range(S)]
                for s in range(S):
                    clipfracs[s].append(kls[s]["clipfrac"])
            if ac.max_grad_norm is not None:
                grads = clip_rows(grads, ac.max_grad_norm)
            if opt is not None:
                opt.step(grads)
            last = (policy, value, ent, kls, logits, x)
    with torch.no_grad():
        for s, job in enumerate(jobs):
            job.flat.flat.data.copy_(W[s])
            if grads is not None:
                job.flat.flat.grad.copy_(grads[s])
            if opt is not None:
                job.optimizer.load_state_dict({k: v[s] if v.dim() else v for k, v in opt.state_dict().items()})
            seed_last = None
            if last is not None:
                policy, value, ent, kls, logits, x = last
                terms = LossTerms(None, policy[s], value[s], ent[s] if entropy_wanted or dist is not None else None)
                seed_last = (terms, kls[s], logits[s], {k: None if v is None else (x[k][s] if k in x else None)
                                                         for k, v in job.prep.samples.items()})
            job.diag = update_diagnostics(job.prep, dist, seed_last, clipfracs[s])


# ----------------------------------------------------------------------------- the seeds' threads
@dataclass
class _Seat:
    """One seed's thread: ``go`` lets it run; ``job`` is its parked update (None while it runs)."""

    index: int
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    job: Optional[UpdateJob] = None
    result: Any = None
    error: Optional[BaseException] = None
    done: bool = False


class SeedBatch:
    """Runs one callable per seed, each in its thread, one thread at a time; their
    ``actor_critic_update`` calls are parked and descended together (``batched_update``)."""

    def __init__(self, tick: Optional[Callable[[int, int], None]] = None) -> None:
        """``tick(env_steps, episodes)``: every seed's counted work, as its run counts it (the batch's bar)."""
        self.back = threading.Semaphore(0)  # a seat hands the baton back (parked or finished)
        self.abort = False
        self.tick = tick

    def _park(self, seat: _Seat, ac: Any, actor: nn.Module, critic: nn.Module, flat: FlatParameters,
              optimizer: Optional[FlatOptimizer], rng: np.random.Generator, batch: dict[str, np.ndarray],
              logits: Optional[torch.Tensor], dist: Any, value_norm: Any) -> dict[str, Optional[float]]:
        """``SEED_BATCH.update`` in seed ``seat``'s thread: the samples as alone, then wait for the batch."""
        # the single run's samples, through the heads it would take (``update_twins``), so equal to its bits
        prep = update_samples(ac, actor, critic, batch, logits, dist, value_norm, reuse_forward=False,
                              twins=update_twins(ac, actor, critic, dist))
        seat.job = UpdateJob(ac, actor, critic, flat, optimizer, rng, prep, dist)
        self.back.release()
        seat.go.acquire()
        if self.abort:
            raise RuntimeError("batched seeds: another seed failed; this one stopped with it")
        diag, seat.job = seat.job.diag, None
        return diag

    def _thread(self, seat: _Seat, target: Callable[[], Any]) -> None:
        seat.go.acquire()
        SEED_BATCH.update = partial(self._park, seat)
        tap_runs(self.tick)
        try:
            if not self.abort:
                seat.result = target()
        except BaseException as exc:  # handed to the coordinator, which raises the first
            seat.error = exc
        finally:
            SEED_BATCH.update = None
            tap_runs(None)
            seat.done = True
            self.back.release()

    def run(self, targets: list[Callable[[], Any]]) -> list[Any]:
        """Every target to its end; their results in order (the first error is raised after every thread ended)."""
        seats = [_Seat(i) for i in range(len(targets))]
        threads = [threading.Thread(target=self._thread, args=(seat, t), daemon=True, name=f"seed{seat.index}")
                   for seat, t in zip(seats, targets)]
        for th in threads:
            th.start()
        live = seats
        while live:
            for seat in live:  # each runs until it parks at its update or ends
                seat.go.release()
                self.back.acquire()
            if any(seat.error is not None for seat in live):
                self.abort = True
            elif any(seat.job is not None for seat in live):
                try:
                    batched_update([seat.job for seat in live if seat.job is not None])
                except BaseException:
                    self.abort = True
                    self._release(live)
                    raise
            live = [seat for seat in live if not seat.done]
            if self.abort:
                self._release(live)
                break
        for th in threads:
            th.join()
        for seat in seats:
            if seat.error is not None:
                raise seat.error
        return [seat.result for seat in seats]

    def _release(self, live: list[_Seat]) -> None:
        for seat in live:
            if not seat.done:
                seat.go.release()
                self.back.acquire()


def run_batched_team_seeds(config: str, overrides: list[str], seeds: list[int], outs: list[Path],
                           progress: bool = True) -> list[dict[str, Any]]:
    """Run ``seeds`` of ``config`` in one process, seed ``seeds[i]`` into ``outs[i]`` (each as
    ``marlq run FILE --seed N --quiet --out OUT`` would); refuses (ConfigError) what cannot be batched
    before anything is written."""
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment
    from marl_q.rundir import check_new_run_dir

    base = load_config(config, list(overrides), seed=seeds[0])
    check_team_batchable(base)
    cfgs = []
    for seed in seeds:  # each seed's config: a copy with its run.seed (the file is read once)
        cfg = copy.deepcopy(base)
        cfg.run.seed = seed
        cfg.run.progress = False  # as `marlq run --quiet` (what a sweep runs) writes it
        cfgs.append(cfg)
    for out in outs:
        check_new_run_dir(Path(out))
    # the one progress bar (marl_q.progress) over every seed's env steps (episodes where the budget counts
    # them), fed by each seed's run in its thread (tap_runs); a file (a sweep's batch log): a line a minute
    by_steps = base.run.total_env_steps is not None
    total = len(seeds) * int((base.run.total_env_steps if by_steps else base.run.total_episodes) or 0)
    bar = Progress(total, "step" if by_steps else "ep", f"{len(seeds)} seeds of {base.algorithm.name} on "
                   f"{base.scenario.name}", enabled=progress, unit_scale=True,
                   mininterval=1.0 if sys.stderr.isatty() else 60.0)
    try:
        return SeedBatch(lambda steps, episodes: bar.update(steps if by_steps else episodes)).run(
            [partial(run_experiment, cfg, Path(out)) for cfg, out in zip(cfgs, outs)])
    finally:
        bar.close()
