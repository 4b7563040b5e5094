"""The actor-critic family in one core: A2C and A3C are PPO with particular knobs.

Huang et al. (2022, arXiv 2205.09123): PPO with one epoch, the whole rollout as one minibatch,
GAE lambda = 1, no advantage normalisation and no value clipping computes A2C's update (the ratio is
1 on the only pass, so the clip never binds). So one loss with knobs: `epochs`, `minibatches`,
`clip` (null = A2C), `gae_lambda`, `adv_norm`, `value_clip`, `optimizer`.

How updates reach the server (`update`):
- `grad`: the worker computes one gradient on its rollout and pushes it; the server applies it with
  its shared optimizer (A3C with `server.aggregation: hogwild`, synchronous A2C with `sync`).
- `delta`: the worker runs its local epochs with its own optimizer and pushes the parameter change;
  the server adds it (scaled by the staleness weight; FedAsync/FedBuff with `buffered`).

Read top to bottom: config -> update (the loss: agents.losses) -> worker (rollout, learn) ->
algorithm (service, summary).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
import torch
from torch import nn

from agents.heads import FlatParameters, build_head, count_params, head_report, worker_heads
from agents.distributions import Distribution, LogStd, distribution_for, masked_logits_np
from agents.losses import (actor_critic_loss, categorical, diagnostics, explained_variance, log_softmax, loss_grad,
                           ratio_stats)
from agents.numpy_heads import NumpyMLP, a2c_gradient, numpy_head
from agents.returns import rollout_targets
from agents.rollout import EpisodeBook, GymVector, Step, evaluate, rollout
from agents.value_norm import ValueNorm
from marl_q.aggregation import Aggregator
from marl_q.errors import ConfigError
from marl_q.evaluation import eval_progress
from marl_q.messages import HELLO, SERVER, TRAIN, Message
from marl_q.native import prepare_process
from marl_q.metrics import episode_summary
from marl_q.protocol import ActingPolicy, Algorithm, Work, Worker, gumbel_max, worker_name, worker_names
from marl_q.registry import AGGREGATIONS, ALGORITHMS, SCENARIOS
from marl_q.optim import FlatAdam, FlatOptimizer, FlatRMSprop, FlatSGD, LrSchedule
from marl_q.seeding import seeded_init, worker_seed
from marl_q.services import PARAMS, ParameterService

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig


# ----------------------------------------------------------------------------- config
@dataclass
class ActorCriticConfig:
    """A2C defaults (Stable-Baselines3's): n_steps 5, RMSprop lr 7e-4, vf 0.5, grad clip 0.5."""

    n_steps: int = 5
    gamma: float = 0.99
    gae_lambda: float = 1.0
    epochs: int = 1
    minibatches: int = 1
    clip: Optional[float] = None  # PPO's ratio clip; null = A2C's plain policy gradient
    value_clip: Optional[float] = None
    adv_norm: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: Optional[float] = 0.5
    optimizer: Literal["rmsprop", "adam", "sgd"] = "rmsprop"
    lr: float = 7e-4
    rms_alpha: float = 0.99
    eps: float = 1e-5
    update: Literal["grad", "delta"] = "grad"
    # one-step updates with heads that have a numpy pass (mlp, an exact vqc/hybrid: circuits.twins) run forward
    # and backward in numpy, where torch's per-call overhead would dominate
    fast_path: bool = True
    lr_schedule: LrSchedule = "constant"  # linear: anneal to 0 over the budget (marl_q.optim.lr_factor)
    reward_scale: float = 1.0  # rewards are multiplied by this in the loss (episode returns are not)
    init_log_std: float = 0.0  # Box action spaces: the Gaussian policy's initial log standard deviation

    def validate(self) -> None:
        for key in ("n_steps", "epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1, got {getattr(self, key)}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError("gamma and gae_lambda must lie in [0, 1]")
        if self.lr < 0:  # 0 freezes the parameters (a fixed opponent among learners: agents/team_learners.py)
            raise ValueError(f"lr: must be positive, or 0 to freeze the parameters, got {self.lr}")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale: must be positive, got {self.reward_scale}")
        if self.update == "grad" and self.epochs > 1:
            raise ValueError("epochs > 1 needs update: delta (a pushed gradient is one pass by definition)")


@dataclass
class PPOConfig(ActorCriticConfig):
    """PPO defaults: Stable-Baselines3's update sizes (2,048 samples a rollout with the generic env's 8
    copies, 10 epochs of minibatches of 64, lr 3e-4, no entropy bonus, no value clip); workers push
    parameter deltas. CleanRL's classic-control set (128 steps, 4 x 4, lr 2.5e-4, entropy 0.01, value
    clip 0.2), the defaults until issue 26, stayed at a random policy's level on an env with rewards
    of at most 0.1 a step (docs/actor_critic.md, "Defaults")."""

    n_steps: int = 256
    gae_lambda: float = 0.95
    epochs: int = 10
    minibatches: int = 32
    clip: Optional[float] = 0.2
    value_clip: Optional[float] = None
    adv_norm: bool = True
    ent_coef: float = 0.0
    optimizer: Literal["rmsprop", "adam", "sgd"] = "adam"
    lr: float = 3e-4
    update: Literal["grad", "delta"] = "delta"


def make_optimizer(kind: str, param: torch.Tensor, cfg: ActorCriticConfig) -> FlatOptimizer:
    """The optimizer the config names (RMSprop with SB3's alpha/eps, Adam, SGD) on one flat parameter
    tensor: the server's, a worker's own (``update: delta``) and batched seeds' (S, P) rows alike.
    marl_q.optim's flat optimizers do torch.optim's arithmetic op for op (the same bits, tested) in a
    few in-place ops: a step of spread_mappo's 11k parameters takes 45 us against torch.optim.Adam's 107,
    and a process that steps none of torch.optim's never imports torch._dynamo (its first optimizer
    did, about a second of start-up; docs/performance.md)."""
    if kind == "rmsprop":
        return FlatRMSprop(param, cfg.lr, alpha=cfg.rms_alpha, eps=cfg.eps)
    if kind == "adam":
        return FlatAdam(param, cfg.lr, eps=cfg.eps)
    return FlatSGD(param, cfg.lr)


# ----------------------------------------------------------------------------- update
# The loss itself, and its numpy twin, is agents.losses (one screen); here a rollout feeds it.
@torch.no_grad()
def sample_actions(actor: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sample from softmax(actor(obs)) by Gumbel-max with a seeded numpy generator (cheaper than
    torch.distributions, and reproducible)."""
    return gumbel_max(actor(torch.from_numpy(obs)).numpy(), rng)


def sample_actions_with_logits(actor: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, torch.Tensor]:
    """``sample_actions`` (the same draws) that also returns the logits with their graph."""
    logits = actor(torch.from_numpy(obs))
    return gumbel_max(logits.detach().numpy(), rng), logits


def actor_critic_update(ac: ActorCriticConfig, actor: nn.Module, critic: nn.Module, flat: FlatParameters,
                        optimizer: Optional[FlatOptimizer], rng: np.random.Generator,
                        batch: dict[str, np.ndarray], logits: Optional[torch.Tensor] = None,
                        dist: Optional[Distribution] = None, value_norm: Optional[ValueNorm] = None
                        ) -> dict[str, Optional[float]]:
    """``ac.epochs`` x ``ac.minibatches`` descents of ``actor_critic_loss`` on a rollout; A2C is the
    single pass (1 x 1), whose gradient is left in ``flat.flat.grad`` when there is no optimizer.
    Returns the update's diagnostics for train.csv (``agents.losses.diagnostics``).

    ``batch``: ``obs`` (T+1, N, ...) including the observation after the last step, ``actions``
    (T, N) or (T, N, D) for continuous actions, ``rewards``, ``terminated``, ``dones``, ``valid``
    (T, N); invalid steps are left out of the loss. Optional: ``critic_obs`` (T+1, N, ...), the
    critic's inputs when they are not the actor's (a centralised critic's state), and ``avail``
    (T, N, A), the available actions (1) of a masked discrete policy. The N columns are whatever
    runs side by side: vectorised environments, or every agent of every environment copy.
    ``logits``: optionally actor(obs[:T]) (T N, A) with its graph, computed by the caller at the
    current parameters (the rollout's own forward, reused by a single pass).
    ``dist``: the action distribution (agents.distributions); None is the softmax over the logits.
    ``value_norm``: the critic learns normalised targets (MAPPO's value normalisation): its outputs
    are de-normalised for GAE, the statistics take in this rollout's returns, and the value loss
    compares the outputs with the normalised returns.

    In a thread of batched seeds (agents/batched_ppo.py) ``SEED_BATCH.update`` takes the call instead:
    it prepares the samples as below (``update_samples``) and descends with every seed at once.
    """
    batched = getattr(SEED_BATCH, "update", None)
    if batched is not None:
        return batched(ac, actor, critic, flat, optimizer, rng, batch, logits, dist, value_norm)
    twins = update_twins(ac, actor, critic, dist)
    prep = update_samples(ac, actor, critic, batch, logits, dist, value_norm, twins=twins)
    if twins is not None:
        return numpy_epochs(ac, twins, flat, optimizer, rng, prep)
    samples, single_pass = prep.samples, prep.single_pass
    last, clipfracs = None, []
    for _ in range(ac.epochs):
        # a single pass descends even without samples: a pushed gradient must be this rollout's (zero)
        for mb in [None] if single_pass else minibatches_of(len(samples["act"]), ac.minibatches, rng):
            x = samples if mb is None else {k: None if v is None else v[mb] for k, v in samples.items()}
            logits_mb = x["logits"] if single_pass else actor(x["obs"])
            logp, entropy = log_prob_entropy(dist, logits_mb, x["act"], x["avail"], ac.ent_coef != 0.0)
            values = x["v"] if single_pass else critic(x["critic_obs"]).squeeze(-1)
            terms = actor_critic_loss(ac, logp, x["adv"], values, x["ret"], old_logp=x["old_logp"],
                                      old_values=x["old_v"], entropy=entropy)
            kl = ratio_stats(logp.detach(), x["old_logp"], ac.clip) if ac.clip is not None else None
            if kl is not None:
                clipfracs.append(kl["clipfrac"])
            descend(terms.loss, flat, optimizer, ac.max_grad_norm)
            last = (terms, kl, logits_mb, x)
    return update_diagnostics(prep, dist, last, clipfracs)


class AutogradHead:
    """A head without a float32 numpy twin (a circuit head, say) inside ``numpy_epochs``: its torch forward,
    the graph kept, and its backward from the numpy gradient of its output, autograd accumulating into the
    flat gradient as the torch path's ``loss.backward()`` does."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        out = self.module(torch.from_numpy(x))
        return out.detach().numpy(), out

    def backward(self, cache: torch.Tensor, grad: np.ndarray) -> None:
        cache.backward(torch.from_numpy(np.ascontiguousarray(grad)))


def float32_twin(module: nn.Module) -> Optional[NumpyMLP]:
    """An ``mlp`` head's numpy twin at the parameters' float32, read in place; None for other heads."""
    return NumpyMLP(module, np.float32) if NumpyMLP.supports(module) else None


def one_pass(ac: ActorCriticConfig) -> bool:
    """A2C's single pass (1 epoch of 1 minibatch): at the rollout's parameters, its forward reusable."""
    return ac.epochs == 1 and ac.minibatches == 1


def update_twins(ac: ActorCriticConfig, actor: nn.Module, critic: nn.Module, dist: Optional[Distribution]
                 ) -> Optional[tuple[NumpyMLP | AutogradHead, NumpyMLP | AutogradHead]]:
    """The heads ``numpy_epochs`` descends through, or None (the torch path): for more than one pass with
    ``fast_path`` on and discrete actions, each head's float32 twin where it is an ``mlp`` head, else the
    head through autograd, as long as one of the two has a twin."""
    if one_pass(ac) or not getattr(ac, "fast_path", True) or (dist is not None and dist.continuous):
        return None
    twins = float32_twin(actor), float32_twin(critic)
    if twins == (None, None):
        return None
    return twins[0] or AutogradHead(actor), twins[1] or AutogradHead(critic)


def numpy_log_prob(logits: np.ndarray, actions: np.ndarray, avail: Optional[np.ndarray] = None) -> np.ndarray:
    """log pi(a) per row under the softmax of the logits (masked where ``avail`` is 0), in numpy: the
    rollout's log-probabilities of the numpy epochs' ratio."""
    return log_softmax(masked_logits_np(logits, avail))[np.arange(len(actions)), actions]


def numpy_epochs(ac: ActorCriticConfig, twins: tuple[NumpyMLP | AutogradHead, NumpyMLP | AutogradHead],
                 flat: FlatParameters,
                 optimizer: Optional[FlatOptimizer], rng: np.random.Generator, prep: UpdateSamples
                 ) -> dict[str, Optional[float]]:
    """``actor_critic_update``'s epochs in numpy float32 (``update_twins``: ``mlp`` heads through their twins,
    another head through autograd): per minibatch (the same draws from ``rng``) the heads' forward, the
    loss's gradient by hand (``agents.losses.loss_grad``, masked logits for an availability mask), backward
    into the flat gradient, then the clip and the optimizer step as the torch path takes them
    (``clip_and_step``). The arithmetic is the torch path's to float32 rounding
    (tests/agents/test_update_twins.py), and an epoch takes about half the torch path's time on spread's
    MAPPO (docs/performance.md, "The update in numpy"): no autograd graph, no per-op dispatch, numpy's
    SIMD tanh and BLAS. Returns the update's diagnostics."""
    prepare_process()  # numpy's BLAS on one thread: its bits do not depend on what the process ran before
    actor, critic = twins
    s, same_inputs = numpy_samples(prep)
    terms: dict[str, float] = {}
    clipfracs: list[float] = []
    for _ in range(ac.epochs):
        for mb in minibatches_of(len(s["act"]), ac.minibatches, rng):
            x = minibatch_rows(s, mb, same_inputs)
            logits, actor_cache = actor.forward(x["obs"])
            logits = masked_logits_np(logits, x["avail"])
            values, critic_cache = critic.forward(x["obs"] if same_inputs else x["critic_obs"])
            terms = {}
            grad_logits, grad_values = minibatch_loss_grad(ac, x, logits, values, terms)
            flat.zero_grad()
            critic.backward(critic_cache, grad_values[:, None])
            actor.backward(actor_cache, grad_logits)
            clip_and_step(flat, optimizer, ac.max_grad_norm)
            if "clipfrac" in terms:
                clipfracs.append(terms["clipfrac"])
    if not terms:  # no valid step in the rollout: nothing to say
        return diagnostics(None, None)
    return diagnostics(terms["policy"], terms["value"], terms["entropy"], terms.get("approx_kl"),
                       float(np.mean(clipfracs)) if clipfracs else None, prep.explained)


def numpy_samples(prep: UpdateSamples) -> tuple[dict[str, Optional[np.ndarray]], bool]:
    """``numpy_epochs``' samples: the update's as numpy arrays, and whether the critic reads the actor's rows."""
    samples = {k: None if v is None else v.numpy() for k, v in prep.samples.items()}
    return samples, prep.samples["critic_obs"] is prep.samples["obs"]


def minibatch_rows(samples: dict[str, Optional[np.ndarray]], mb: Optional[torch.Tensor], same_inputs: bool
                   ) -> dict[str, Optional[np.ndarray]]:
    """One minibatch's rows of ``numpy_samples``' arrays (``minibatches_of``' index; None: all of them)."""
    return samples if mb is None else {k: None if v is None else v[mb.numpy()] for k, v in samples.items()
                                       if not (same_inputs and k == "critic_obs")}


def minibatch_loss_grad(ac: ActorCriticConfig, x: dict[str, Optional[np.ndarray]], logits: np.ndarray,
                        values: np.ndarray, terms: dict) -> tuple[np.ndarray, np.ndarray]:
    """The loss's gradient on one minibatch's rows ``x`` from the heads' outputs (the logits masked as
    ``masked_logits_np`` masks them, values (B, 1)): ``loss_grad``, with no gradient to a masked logit
    (masked_fill's); ``terms`` receives the loss's terms."""
    grad_logits, grad_values = loss_grad(ac, logits, x["act"], x["adv"], values[:, 0], x["ret"], terms,
                                         old_logp=x["old_logp"], old_values=x["old_v"])
    if x["avail"] is not None:
        grad_logits = np.where(x["avail"] > 0, grad_logits, np.float32(0.0))
    return grad_logits, grad_values


SEED_BATCH = threading.local()  # .update: set in a batched seed's thread (agents/batched_ppo.py), else absent


@dataclass
class UpdateSamples:
    """What an update descends on, prepared from a rollout (``update_samples``): the samples (the
    valid steps' actions, advantages, returns, the clips' old values and log-probabilities, and the
    heads' inputs, or for a single pass the heads' outputs with their graph), the critic's explained
    variance, and whether the update is the single pass at the rollout's parameters."""

    samples: dict[str, Optional[torch.Tensor]]
    explained: Optional[float]
    single_pass: bool


def log_prob_entropy(dist: Optional[Distribution], out: torch.Tensor, act: torch.Tensor,
                     avail: Optional[torch.Tensor], entropy: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-sample log-probabilities (and entropies) of the actions under the heads' output ``out``."""
    if dist is None:
        return categorical(out, act, entropy)
    return dist.log_prob_entropy(out, act, avail)


def update_samples(ac: ActorCriticConfig, actor: nn.Module, critic: nn.Module, batch: dict[str, np.ndarray],
                   logits: Optional[torch.Tensor] = None, dist: Optional[Distribution] = None,
                   value_norm: Optional[ValueNorm] = None, reuse_forward: bool = True,
                   twins: Optional[tuple[NumpyMLP | AutogradHead, NumpyMLP | AutogradHead]] = None) -> UpdateSamples:
    """The samples of ``actor_critic_update`` (its arguments): the heads at the rollout's parameters, GAE,
    the value normalisation's statistics. ``reuse_forward`` false: a single pass's samples carry the
    heads' inputs, as more passes' do, instead of the outputs with their graph (batched seeds). ``twins``
    (``update_twins``'): the heads' outputs and the rollout's log-probabilities through them, as the
    numpy epochs will compute theirs."""
    T, N = batch["actions"].shape[:2]
    obs_all = torch.from_numpy(batch["obs"].reshape((T + 1) * N, -1))
    critic_all = obs_all if "critic_obs" not in batch else torch.from_numpy(batch["critic_obs"].reshape((T + 1) * N, -1))
    avail_all = torch.from_numpy(batch["avail"].reshape(T * N, -1)) if "avail" in batch else None
    valid = batch["valid"].reshape(-1)
    # the samples are the valid steps; take(x) picks their rows of a (T N, ...) tensor (no copy if all)
    idx = None if valid.all() else torch.from_numpy(np.flatnonzero(valid))
    take = (lambda x: x) if idx is None else (lambda x: x[idx])
    single_pass = one_pass(ac)
    if single_pass and reuse_forward:  # at the rollout's parameters one forward with its graph serves targets and loss
        values_grad = critic(critic_all).squeeze(-1)
        logits_grad = actor(obs_all[: T * N]) if logits is None else logits
        values_all, logits_all = values_grad.detach(), logits_grad.detach()
    elif twins is not None:
        with torch.no_grad():  # (a head through autograd keeps no graph here)
            values_all = torch.from_numpy(twins[1].forward(critic_all.numpy())[0][:, 0])
            logits_all = torch.from_numpy(twins[0].forward(obs_all[: T * N].numpy())[0]) if ac.clip is not None else None
    else:
        with torch.no_grad():
            values_all = critic(critic_all).squeeze(-1)
            logits_all = actor(obs_all[: T * N]) if ac.clip is not None else None
    values_np = values_all.numpy().reshape(T + 1, N).astype(np.float64)
    values_np = values_np if value_norm is None else value_norm.denormalize(values_np)
    adv, returns = rollout_targets(batch, values_np, ac.gamma, ac.gae_lambda, ac.reward_scale)
    explained = explained_variance(values_np[:T].reshape(-1)[valid], returns.reshape(-1)[valid])
    if value_norm is not None:
        value_norm.update(returns.reshape(-1)[valid])
        returns = value_norm.normalize(returns)
    act_all = torch.from_numpy(batch["actions"].reshape((T * N,) + batch["actions"].shape[2:]))
    samples = {"act": take(act_all), "adv": take(torch.from_numpy(adv.reshape(-1))).float(),
               "ret": take(torch.from_numpy(returns.reshape(-1))).float(),
               "avail": None if avail_all is None else take(avail_all),
               # the rollout's values and log-probabilities feed only the clips
               "old_v": take(values_all[: T * N]) if ac.value_clip is not None else None,
               "old_logp": None if ac.clip is None else take(
                   log_prob_entropy(dist, logits_all, act_all, avail_all, False)[0] if twins is None
                   else torch.from_numpy(numpy_log_prob(logits_all.numpy(), act_all.numpy(),
                                                        None if avail_all is None else avail_all.numpy())))}
    if single_pass and reuse_forward:  # the heads' outputs on the samples come from the forward above
        samples["logits"], samples["v"] = take(logits_grad), take(values_grad[: T * N])
    else:
        samples["obs"] = take(obs_all[: T * N])
        samples["critic_obs"] = samples["obs"] if critic_all is obs_all else take(critic_all[: T * N])
    return UpdateSamples(samples, explained, single_pass)


def update_diagnostics(prep: UpdateSamples, dist: Optional[Distribution], last: Optional[tuple],
                       clipfracs: list[float]) -> dict[str, Optional[float]]:
    """An update's train.csv diagnostics from its last minibatch (``last``: its loss terms, ratio
    statistics, heads' output and samples) and every minibatch's clip fraction."""
    if last is None or not len(prep.samples["act"]):  # no valid step in the rollout: nothing to say
        return diagnostics(None, None)
    terms, kl, logits_mb, x = last
    entropy = terms.entropy
    if entropy is None:  # ent_coef 0: the loss left it out; from the last minibatch's outputs
        with torch.no_grad():
            entropy = log_prob_entropy(dist, logits_mb.detach(), x["act"], x["avail"], True)[1].mean()
    # CleanRL's: the last minibatch's losses and KL, the clip fraction over every minibatch. Without a
    # clip the one pass is at the rollout's parameters (ratio 1, KL 0); more passes are not measured
    approx_kl = kl["approx_kl"] if kl is not None else (0.0 if prep.single_pass else None)
    return diagnostics(terms.policy, terms.value, entropy, approx_kl,
                       float(np.mean(clipfracs)) if clipfracs else None, prep.explained)


def minibatches_of(n: int, k: int, rng: np.random.Generator) -> list[Optional[torch.Tensor]]:
    """One epoch's minibatches of n samples: k shuffled index tensors (a permutation drawn from rng),
    or for k = 1 the whole batch in order (None; no draw); empty ones are left out."""
    if k == 1:
        return [None] if n else []
    return [torch.from_numpy(mb) for mb in np.array_split(rng.permutation(n), k) if len(mb)]


def descend(loss: torch.Tensor, flat: FlatParameters, optimizer: Optional[FlatOptimizer],
             max_grad_norm: Optional[float]) -> None:
    """Gradient into flat.grad, clipped by global norm, then an optimizer step if there is one."""
    flat.zero_grad()
    loss.backward()
    clip_and_step(flat, optimizer, max_grad_norm)


def clip_and_step(flat: FlatParameters, optimizer: Optional[FlatOptimizer], max_grad_norm: Optional[float]) -> None:
    """The gradient in flat.grad clipped by global norm, then an optimizer step if there is one."""
    if max_grad_norm is not None:
        nn.utils.clip_grad_norm_([flat.flat], max_grad_norm)
    if optimizer is not None:
        optimizer.step(flat.flat.grad)


# ----------------------------------------------------------------------------- worker
class PullingWorker(Worker):
    """A worker that says hello, then acts with the parameters the server sends (``PARAMS``, loaded into
    ``self.flat``; ``pulled`` takes what else the reply carries) and waits for new ones after each push
    (its ``step`` sets ``waiting``). A worker whose server answers with other kinds names them in
    ``pulls`` (routing's commit replies): any of them ends the wait, at the version it carries."""

    pulls: tuple[str, ...] = (PARAMS,)  # the kinds of message that end a wait

    def start(self) -> list[Message]:
        return [Message(self.name, SERVER, HELLO)]

    def deliver(self, msg: Message) -> None:
        if msg.kind in self.pulls:
            if msg.kind == PARAMS:
                self.flat.load(msg.payload[PARAMS])
            self.version = msg.base_version
            self.pulled(msg)
            self.waiting = False

    def pulled(self, msg: Message) -> None:
        """Read the rest of the message (nothing here)."""

    def ready(self) -> bool:
        return not self.waiting


class SharedModels:
    """One actor, critic and flat buffer for every worker of a process that keeps nothing of its own in
    them: workers that push gradients (no optimizer of their own) through ``mlp`` heads (no shot
    streams, no caches). Each such worker holds only a reference to the parameters it last pulled (the
    server's array of that version, shared by every worker at it and never written) and loads them
    into the shared buffer when its step starts; the step computes what it computed with models of its
    own, bit for bit. In sim, 1,000 workers then hold one copy of the models and build them once
    (docs/runtime.md, "Many workers on sim")."""

    def __init__(self) -> None:
        self.models: Optional[tuple[nn.Module, nn.Module, Distribution, FlatParameters]] = None

    @staticmethod
    def fits(cfg: ExperimentConfig) -> bool:
        return cfg.algorithm.params.update == "grad" and cfg.actor.name == "mlp" and cfg.critic.name == "mlp"


class SharedFlat:
    """A sharing worker's ``flat``: its parameters by reference (``load`` copies nothing), the gradient
    and everything else the shared ``FlatParameters``'. ``activate`` copies the parameters into the
    shared buffer (the worker's step starts with it)."""

    def __init__(self, shared: FlatParameters) -> None:
        self.shared = shared
        self.values: Optional[np.ndarray] = None

    def load(self, values: np.ndarray) -> None:
        self.values = values  # the server's array of one version: every worker at it holds the same one

    def activate(self) -> None:
        if self.values is not None:
            self.shared.load(self.values)

    def numpy(self) -> np.ndarray:
        return self.shared.numpy() if self.values is None else np.array(self.values, dtype=np.float32)

    @property
    def flat(self) -> nn.Parameter:
        return self.shared.flat

    @property
    def size(self) -> int:
        return self.shared.size

    def zero_grad(self) -> None:
        self.shared.zero_grad()

    def grad_view(self) -> np.ndarray:
        return self.shared.grad_view()

    def grad_numpy(self) -> np.ndarray:
        return self.shared.grad_numpy()


class ActorCriticWorker(PullingWorker):
    """Rolls out `n_steps` in `num_envs` vectorised environments with the last pulled parameters,
    then pushes a gradient or a parameter delta and waits for fresh parameters."""

    shares_models = False  # True: actor and critic are a SharedModels', flat a SharedFlat onto its buffer

    def __init__(self, cfg: ExperimentConfig, index: int, shared: Optional[SharedModels] = None) -> None:
        self.cfg = cfg
        self.ac: ActorCriticConfig = cfg.algorithm.params
        self.name = worker_name(index)
        self.index = index
        self.seed = worker_seed(cfg.run.seed, index)
        self.rng = np.random.default_rng(self.seed)  # torch's global stream is left alone: builds are seeded_init's
        self.build_env()
        if shared is not None and shared.models is not None:
            self.actor, self.critic, self.dist, flat = shared.models
        else:
            self.actor, self.critic, self.dist = self.make_models()
        # circuit heads: their own shot/SPSA streams, and their executions counted for the ledger
        self.resources = worker_heads({"actor": self.actor, "critic": self.critic}, cfg.run.seed, index)
        if shared is None or shared.models is None:
            flat = FlatParameters(self.actor, self.critic)
        self.flat = flat
        if shared is not None:
            shared.models = shared.models or (self.actor, self.critic, self.dist, flat)
            self.flat, self.shares_models = SharedFlat(flat), True
        self.optimizer = make_optimizer(self.ac.optimizer, self.flat.flat, self.ac) if self.ac.update == "delta" else None
        self.version = -1
        self.waiting = True
        self.seq = 0
        # one-step A2C with gradients pushed: the rollout's actor forward (at the parameters the
        # update differentiates) runs with its graph and the update reuses it instead of a second one
        self._reuse_act_forward = self._one_step_reuse(self.ac) and not self.dist.continuous
        self._rollout_logits: Optional[torch.Tensor] = None
        self._init_numpy_path()
        self.reset_env()

    def _init_numpy_path(self) -> None:
        """Numpy twins of the heads for the one-step update (agents.numpy_heads), when both have one."""
        self._np_heads = None
        if self._reuse_act_forward and getattr(self.ac, "fast_path", True):
            actor, critic = numpy_head(self.actor), numpy_head(self.critic)
            if actor is not None and critic is not None:
                self._np_heads = (actor, critic)
        self._rollout_np = None

    @staticmethod
    def _one_step_reuse(ac: ActorCriticConfig) -> bool:
        return (ac.n_steps == 1 and ac.update == "grad" and ac.epochs == 1 and ac.minibatches == 1
                and ac.clip is None and ac.value_clip is None)

    def adopt_rollout_state(self, state: dict) -> None:
        """Move an old snapshot's rollout state (its fields on the worker) into the vector and the book
        (a subclass whose loop kept other fields moves its own); the snapshot's migration to state
        format 1 (``marl_q.state_format``) calls it."""
        if "prev_done" not in state:
            return
        self.vec = GymVector.__new__(GymVector)
        self.vec.env, self.vec.num_envs = self.env, self.env.num_envs
        self.vec.obs, self.vec.prev_done = state["obs"], state["prev_done"]
        self.book = EpisodeBook.resumed(state["ep_return"], state["ep_length"])
        for key in ("obs", "prev_done", "ep_return", "ep_length", "n_envs"):
            self.__dict__.pop(key, None)

    # -- the hooks a worker for another kind of environment overrides (with rollout) ----------
    def build_env(self) -> None:
        """The scenario's environment (``self.env``), refused by ``check_scenario`` if it does not fit."""
        spec = SCENARIOS.get(self.cfg.scenario.name).obj
        self.check_scenario(spec)
        self.env = spec.make(self.cfg.scenario.params, seed=self.seed)

    def make_models(self) -> tuple[nn.Module, nn.Module, Distribution]:
        """The actor, the critic and the action distribution (the same initial parameters on every worker)."""
        actor, critic = build_models(self.cfg, self.env.single_observation_space, self.env.single_action_space)
        return actor, critic, distribution_for(self.env.single_action_space)

    def check_scenario(self, spec: Any) -> None:
        """Refuse a scenario this worker cannot drive (a ConfigError naming it)."""
        kind = spec.kind_for(self.cfg.scenario.params)  # gymnasium: single-agent, or multi-agent (Tuple spaces)
        if kind != "gym_vector":
            raise ConfigError(f"algorithm {self.cfg.algorithm.name}: scenario {self.cfg.scenario.name!r} is not a "
                              f"single-agent vector environment (kind {kind!r})")

    def reset_env(self) -> None:
        """Start the environment (``self.vec``, agents.rollout) and the per-episode bookkeeping."""
        self.vec = GymVector(self.env, self.seed)
        self.book = EpisodeBook(self.vec.num_envs)

    def step(self) -> Work:
        if self.shares_models:  # the shared models take this worker's parameters for its step
            self.flat.activate()
        batch, episodes, steps = self.rollout()
        msg = self.update_message(batch)
        return Work([msg], env_steps=steps, episodes=episodes, resources=head_report(self.resources))

    def update_message(self, batch: dict[str, np.ndarray]) -> Message:
        """Learn on a rollout's batch and the push that carries the update (a gradient or a parameter
        delta); the worker then waits for fresh parameters."""
        before = self.flat.numpy() if self.ac.update == "delta" else None
        diag = self.learn(batch)
        self.seq += 1
        if self.ac.update == "grad":
            payload = {"grad": self.flat.grad_numpy()}
        else:
            payload = {"delta": self.flat.numpy() - before}
        self.waiting = True
        # the update's diagnostics ride along for train.csv, outside the counted payload (marl_q.messages.TRAIN)
        return Message(self.name, SERVER, self.ac.update, payload, base_version=self.version, seq=self.seq,
                       info={TRAIN: [diag]})

    def _act(self, obs: np.ndarray) -> np.ndarray:
        if self.dist.continuous:
            with torch.no_grad():
                return self.dist.sample(self.actor(torch.from_numpy(obs)).numpy(), self.rng)
        return sample_actions(self.actor, obs, self.rng)

    def _act_in_rollout(self, obs: np.ndarray) -> np.ndarray:
        """The rollout's action: through the numpy twin or with the forward's graph kept for the
        one-step update, else a plain sample."""
        if self._np_heads is not None:
            logits, cache = self._np_heads[0].forward(obs.astype(np.float64))
            self._rollout_np = (logits, cache)
            return gumbel_max(logits, self.rng)
        if self._reuse_act_forward:
            act, self._rollout_logits = sample_actions_with_logits(self.actor, obs, self.rng)
            return act
        return self._act(obs)

    def rollout(self) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
        """n_steps of every env (agents.rollout). Steps that only reset an env (next-step autoreset)
        are masked out."""
        T, N = self.ac.n_steps, self.vec.num_envs
        batch = {"obs": np.zeros((T + 1, N) + self.vec.obs.shape[1:], dtype=np.float32),
                 "actions": np.zeros((T, N) + self.dist.action_shape(), dtype=self.dist.action_dtype()),
                 "rewards": np.zeros((T, N), dtype=np.float64), "terminated": np.zeros((T, N), dtype=bool),
                 "dones": np.zeros((T, N), dtype=bool), "valid": np.zeros((T, N), dtype=bool)}
        self._rollout_logits = None
        self._rollout_np = None

        def store(t: int, obs: np.ndarray, act: np.ndarray, step: Step) -> None:
            rew, term, done = step.data
            batch["obs"][t], batch["actions"][t], batch["rewards"][t] = obs, act, rew
            batch["terminated"][t], batch["dones"][t], batch["valid"][t] = term, done, step.valid

        episodes, steps = rollout(self.vec, self.book, T, self._act_in_rollout, store,
                                  row=lambda i: {"version": self.version}, to_env=self.dist.to_env)
        batch["obs"][T] = self.vec.obs
        return batch, episodes, steps

    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, Optional[float]]:
        """One update on the rollout (the numpy pass or the torch one); its diagnostics for train.csv."""
        if self._rollout_np is not None:
            (logits, cache), self._rollout_np = self._rollout_np, None
            self.flat.zero_grad()
            return a2c_gradient(self.ac, self._np_heads[0], self._np_heads[1], batch, logits, cache,
                                self.flat.grad_view())
        logits, self._rollout_logits = self._rollout_logits, None
        return actor_critic_update(self.ac, self.actor, self.critic, self.flat, self.optimizer, self.rng, batch,
                                   logits, dist=self.dist if self.dist.continuous else None)

    def close(self) -> None:
        self.env.close()


def build_models(cfg: ExperimentConfig, obs_space: Any, act_space: Any) -> tuple[nn.Module, nn.Module]:
    """The actor (obs -> logits, or a Gaussian's mean and log-std for a Box action space) and the
    critic (obs -> V) the config's heads name."""
    try:
        dist = distribution_for(act_space)
    except ValueError as exc:
        raise ConfigError(f"algorithm {cfg.algorithm.name}: {exc}") from None
    obs_dim = int(np.prod(obs_space.shape))
    with seeded_init(cfg.run.seed):  # every worker starts from the same parameters as the server
        if dist.continuous:
            actor = LogStd(build_head(cfg.actor, obs_dim, dist.dim), dist.dim, cfg.algorithm.init_log_std)
        else:
            actor = build_head(cfg.actor, obs_dim, int(act_space.n))
        critic = build_head(cfg.critic, obs_dim, 1)
    return actor, critic


def shared_actor_policy(actor: nn.Module, critic: nn.Module) -> ActingPolicy:
    """One actor for every agent: the observations of the agents acting now go through it as one
    batch (agents in sorted order)."""

    @torch.no_grad()
    def logits(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = sorted(obs)
        if not names:
            return {}
        out = actor(torch.from_numpy(np.stack([obs[n] for n in names]).astype(np.float32))).numpy()
        return dict(zip(names, out))

    return ActingPolicy(logits, models={"actor": actor, "critic": critic})


# ----------------------------------------------------------------------------- algorithm
class ActorCritic(Algorithm):
    """Workers roll out and push; the server's ParameterService holds the shared parameters."""

    metric_fields = ["return", "length", "version"]

    def build_models(self) -> tuple[nn.Module, nn.Module]:
        """The actor and critic every worker starts from (sized from one environment instance)."""
        cfg = self.cfg
        spec = SCENARIOS.get(cfg.scenario.name).obj
        kind = spec.kind_for(cfg.scenario.params)
        if kind != spec.kind:  # gymnasium: a multi-agent env (Tuple spaces) is not the vector env this family drives
            raise ConfigError(f"algorithm {cfg.algorithm.name}: scenario {cfg.scenario.name!r} is not a "
                              f"single-agent vector environment (kind {kind!r})")
        env = spec.make(cfg.scenario.params, seed=cfg.run.seed)
        try:
            return build_models(cfg, env.single_observation_space, env.single_action_space)
        finally:
            env.close()

    def make_service(self) -> ParameterService:
        cfg = self.cfg
        actor, critic = self.build_models()
        self.param_counts = {"actor_params": count_params(actor), "critic_params": count_params(critic)}
        flat = FlatParameters(actor, critic)
        self._models = (actor, critic)
        workers = worker_names(cfg.backend.workers)
        aggregator: Aggregator = AGGREGATIONS.get(cfg.server.aggregation).obj(workers, cfg.server.buffer_k)
        ac = cfg.algorithm.params
        self.service = ParameterService(flat.numpy(), ac.update, aggregator,
                                        make_optimizer=lambda p: make_optimizer(ac.optimizer, p, ac),
                                        server_lr=cfg.server.server_lr, lr_schedule=ac.lr_schedule)
        return self.service

    _shared: Optional[SharedModels] = None

    def make_worker(self, index: int) -> ActorCriticWorker:
        """A worker; where it keeps nothing of its own in its models (``SharedModels.fits``), the workers of
        this process share one actor and critic (sim: a thousand workers, one copy of the models)."""
        if not SharedModels.fits(self.cfg):
            return ActorCriticWorker(self.cfg, index)
        if self._shared is None:
            self._shared = SharedModels()
        return ActorCriticWorker(self.cfg, index, self._shared)

    def summarize(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        out = dict(getattr(self, "param_counts", {}))
        out.update(episode_summary(metrics, self.cfg.run.solve_return, self.cfg.run.solve_window))
        out.update(self.architectures())
        return out

    def current_models(self) -> tuple[nn.Module, nn.Module]:
        """The actor and critic at the server's current parameters (built once, reloaded per call)."""
        if getattr(self, "_eval_models", None) is None:
            self._eval_models = self.build_models()  # seeded on its own (seeded_init): the run's stream stays
        FlatParameters(*self._eval_models).load(self.service.param.numpy())
        return self._eval_models

    def evaluate_returns(self, episodes: int, seed: int) -> list[float]:
        """``episodes`` greedy episodes (the policy's mode) of the server's current actor, in a fresh
        copy of the scenario's vector env seeded with ``seed`` (marl_q.evaluation)."""
        cfg = self.cfg
        actor, _ = self.current_models()
        env = SCENARIOS.get(cfg.scenario.name).obj.make(cfg.scenario.params, seed=seed)
        dist = distribution_for(env.single_action_space)

        @torch.no_grad()
        def mode(obs: np.ndarray) -> np.ndarray:
            return dist.mode(actor(torch.from_numpy(obs)).numpy())

        try:
            with eval_progress(episodes, cfg.run.progress) as bar:
                return evaluate(GymVector(env, seed), episodes, mode, to_env=dist.to_env, bar=bar)
        finally:
            env.close()

    def acting_policy(self, state: dict[str, np.ndarray]) -> ActingPolicy:
        """The shared actor at the checkpoint's parameters; every agent (environment) acts with it."""
        actor, critic = self.build_models()
        FlatParameters(actor, critic).load(state[PARAMS])
        return shared_actor_policy(actor, critic)

    def architectures(self) -> dict[str, Any]:
        """What heads that choose their own structure (DiffQAS) selected, read at the final parameters."""
        if not hasattr(self, "_models"):
            return {}
        actor, critic = self._models
        flat = FlatParameters(actor, critic)
        flat.load(self.service.param.numpy())
        out = {}
        for role, head in (("actor", actor), ("critic", critic)):
            select = getattr(head, "selected_architecture", None)
            if callable(select):
                out[f"{role}_architecture"] = select()
        return out


ALGORITHMS.add("a2c", ActorCritic, config=ActorCriticConfig,
               help="A2C: one gradient per rollout; synchronous with server.aggregation=sync")
ALGORITHMS.add("a3c", ActorCritic, config=ActorCriticConfig,
               help="A3C: workers push gradients, applied on arrival by the server's shared optimizer")
ALGORITHMS.add("ppo", ActorCritic, config=PPOConfig,
               help="PPO: workers run clipped epochs locally and push parameter deltas")
