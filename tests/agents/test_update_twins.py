"""PPO's epochs through the float32 numpy twins of the ``mlp`` heads (``agents.actor_critic.numpy_epochs``)
against the torch path they stand in for: the loss's gradient by hand (``agents.losses.loss_grad``) against
autograd through ``categorical`` + ``actor_critic_loss`` in float64, a whole update against
``actor_critic_update`` with ``fast_path`` off, and a team worker acting through the actor's twin."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import agents.actor_critic as actor_critic_module
from agents.actor_critic import AutogradHead, PPOConfig, actor_critic_update, update_twins
from agents.distributions import Categorical, DiagGaussian
from agents.heads import FlatParameters, MLPConfig, build_mlp
from agents.losses import actor_critic_loss, categorical, loss_grad, ratio_stats
from agents.numpy_heads import NumpyMLP
from agents.value_norm import ValueNorm
from circuits.vqc import VQC
from marl_q.metrics import DIAGNOSTICS

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def knobs(**kw):
    base = dict(clip=0.2, value_clip=0.2, ent_coef=0.01, vf_coef=0.5, adv_norm=True)
    return SimpleNamespace(**{**base, **kw})


def _case(seed: int, B: int = 64, A: int = 5):
    """Logits, actions, advantages, values, returns, and rollout-time log-probabilities and values moved
    far enough (+-0.6 in log-ratio, +-0.8 in value) that both clips bind on some samples."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, A))
    actions = rng.integers(0, A, size=B)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = (z - np.log(np.exp(z).sum(axis=1, keepdims=True)))[np.arange(B), actions]
    old_logp = logp + rng.uniform(-0.6, 0.6, size=B)
    values = rng.normal(size=B)
    old_values = values + rng.uniform(-0.8, 0.8, size=B)
    return logits, actions, rng.normal(size=B), values, rng.normal(size=B), old_logp, old_values


def _autograd(k, logits, actions, adv, values, returns, old_logp, old_values):
    """The reference: autograd through the torch loss, float64."""
    z = torch.tensor(logits, requires_grad=True)
    v = torch.tensor(values, requires_grad=True)
    logp, ent = categorical(z, torch.from_numpy(actions), entropy=k.ent_coef != 0.0)
    terms = actor_critic_loss(k, logp, torch.from_numpy(adv), v, torch.from_numpy(returns),
                              old_logp=None if k.clip is None else torch.from_numpy(old_logp),
                              old_values=None if k.value_clip is None else torch.from_numpy(old_values), entropy=ent)
    terms.loss.backward()
    return z.grad.numpy(), v.grad.numpy(), terms, logp.detach()


@pytest.mark.parametrize("clip,value_clip,ent_coef,adv_norm", [
    (0.2, 0.2, 0.01, True),  # MAPPO's knobs
    (0.2, None, 0.0, True),  # PPO without a value clip or an entropy bonus
    (0.1, 0.5, 0.05, False),
    (None, None, 0.01, False),  # A2C's form (no clip), as the one-step path uses it
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loss_grad_equals_autograd(clip, value_clip, ent_coef, adv_norm, dtype):
    k = knobs(clip=clip, value_clip=value_clip, ent_coef=ent_coef, adv_norm=adv_norm, vf_coef=0.7)
    case = _case(3)
    ref_z, ref_v, ref_terms, ref_logp = _autograd(k, *case)
    logits, actions, adv, values, returns, old_logp, old_values = case
    cast = [x.astype(dtype) for x in (logits, adv, values, returns, old_logp, old_values)]
    terms: dict = {}
    grad_z, grad_v = loss_grad(k, cast[0], actions, cast[1], cast[2], cast[3], terms,
                               old_logp=cast[4] if clip is not None else None,
                               old_values=cast[5] if value_clip is not None else None)
    assert grad_z.dtype == dtype and grad_v.dtype == dtype
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(grad_z, ref_z, **tol)
    np.testing.assert_allclose(grad_v, ref_v, **tol)
    rel = 1e-10 if dtype == np.float64 else 1e-4
    entropy = ref_terms.entropy  # without a bonus the loss leaves it out; the terms report it all the same
    if entropy is None:
        entropy = categorical(torch.from_numpy(logits), torch.from_numpy(actions))[1].mean()
    for key, ref in (("policy", ref_terms.policy), ("value", ref_terms.value), ("entropy", entropy)):
        assert terms[key] == pytest.approx(float(ref), rel=rel, abs=1e-6), key
    if clip is not None:  # train.csv's ratio statistics, as ratio_stats computes them
        stats = ratio_stats(ref_logp, torch.from_numpy(old_logp), clip)
        assert terms["approx_kl"] == pytest.approx(stats["approx_kl"], rel=rel, abs=1e-7)
        assert terms["clipfrac"] == stats["clipfrac"]
        assert 0.0 < terms["clipfrac"] < 1.0  # the case exercises both sides of the clip
        # the clip zeroes the policy gradient of some samples, so not every row carries one
        ratio = np.exp(ref_logp.numpy() - old_logp)
        assert np.any(np.abs(ratio - 1.0) > clip)
    if value_clip is not None:
        assert np.any(np.abs(values - old_values) > value_clip)


def test_loss_grad_by_hand():
    """Two samples, two actions, A = 1 for both, no entropy, no normalisation: ratio 2 is past the clip (1.2)
    and the min takes the clipped constant, so its gradient is 0; ratio 0.5 is past 0.8 from below, where the
    min takes the unclipped term r A = 0.5, so dL/dlogp = -(1/2)(0.5)(1) = -0.25 and
    dL/dz = 0.25 (p - onehot) with p = (0.5, 0.5). Values: V = 1, V_old = 0, R = 0 with clip 0.5: the clipped
    error 0.5 is the smaller, so the unclipped one counts: dL/dV = 2 vf (V - R) / B = 0.5 with vf = 0.5,
    B = 2. The policy term -(1.2 + 0.5) / 2; both ratios lie outside the clip."""
    k = knobs(clip=0.2, value_clip=0.5, ent_coef=0.0, adv_norm=False, vf_coef=0.5)
    logits = np.zeros((2, 2))
    actions = np.array([0, 1])
    old_logp = np.log(np.array([0.25, 1.0]))  # p(a) = 0.5: ratios 2 and 0.5
    terms: dict = {}
    grad_z, grad_v = loss_grad(k, logits, actions, np.array([1.0, 1.0]), np.array([1.0, 0.0]), np.zeros(2), terms,
                               old_logp=old_logp, old_values=np.zeros(2))
    np.testing.assert_allclose(grad_z, [[0.0, 0.0], [0.125, -0.125]], atol=1e-15)
    np.testing.assert_allclose(grad_v, [0.5, 0.0], atol=1e-15)
    assert terms["policy"] == pytest.approx(-(1.2 + 0.5) / 2)
    assert terms["clipfrac"] == 1.0
    assert terms["value"] == pytest.approx(0.5)  # mean of max(1, 0.25) and 0


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_float32_twin_forward_and_gradients_equal_autograd(activation):
    """The float32 twin reads the parameters in place; against autograd in float64 from the same values."""
    torch.manual_seed(0)
    net = build_mlp(MLPConfig(hidden=[64, 64], activation=activation), 21, 5)
    flat = FlatParameters(net)  # the parameters and their gradients as views of one buffer, as in a worker
    x = np.random.default_rng(1).normal(size=(300, 21)).astype(np.float32)
    g = np.random.default_rng(2).normal(size=(300, 5)).astype(np.float32)
    ref = copy.deepcopy(net).double()
    out_ref = ref(torch.from_numpy(x).double())
    (out_ref * torch.from_numpy(g).double()).sum().backward()
    twin = NumpyMLP(net, np.float32)
    out, cache = twin.forward(x)
    flat.zero_grad()
    twin.backward(cache, g)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, out_ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    for p, q in zip(net.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-3, atol=1e-4)
    one = build_mlp(MLPConfig(hidden=[8], activation=activation), 3, 1)  # a critic's single output
    FlatParameters(one)
    x1 = x[:, :3].copy()
    ref1 = copy.deepcopy(one).double()
    ref1(torch.from_numpy(x1).double()).sum().backward()
    twin1 = NumpyMLP(one, np.float32)
    _, cache1 = twin1.forward(x1)
    twin1.backward(cache1, np.ones((300, 1), np.float32))
    for p, q in zip(one.parameters(), ref1.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-3, atol=1e-4)


def _batch(rng, T: int, N: int, obs_dim: int, state_dim: int, A: int, masked: bool):
    batch = {"obs": rng.normal(size=(T + 1, N, obs_dim)).astype(np.float32),
             "actions": rng.integers(0, A, size=(T, N)), "rewards": rng.normal(size=(T, N)),
             "terminated": rng.random((T, N)) < 0.1, "valid": rng.random((T, N)) < 0.85}
    batch["dones"] = batch["terminated"] | (rng.random((T, N)) < 0.05)
    if state_dim:
        batch["critic_obs"] = rng.normal(size=(T + 1, N, state_dim)).astype(np.float32)
    if masked:  # every taken action available, one other action masked out per row at random
        avail = np.ones((T, N, A), dtype=np.float32)
        other = (batch["actions"] + rng.integers(1, A, size=(T, N))) % A
        np.put_along_axis(avail, other[..., None], 0.0, axis=2)
        batch["avail"] = avail
    return batch


@pytest.mark.parametrize("minibatches,state_dim,masked,value_norm,quantum", [
    (1, 0, False, False, False),  # IPPO's critic reads the actor's rows
    (1, 9, False, True, False),  # MAPPO: a centralised critic, value normalisation
    (4, 9, True, False, False),  # shuffled minibatches, an availability mask
    (2, 9, False, True, True),  # a circuit actor (through autograd) beside the critic's twin
])
def test_numpy_epochs_equal_the_torch_update(minibatches, state_dim, masked, value_norm, quantum, monkeypatch):
    """A whole update (3 epochs, SGD so that each step is the gradient itself) from the same parameters, batch
    and generator: the torch path (fast_path off) and the numpy epochs end at the same parameters to float32
    rounding and report the same diagnostics."""
    T, N, obs_dim, A = 20, 6, 7, 4
    batch = _batch(np.random.default_rng(minibatches + state_dim), T, N, obs_dim, state_dim, A, masked)
    results = {}
    for fast in (False, True):
        ac = PPOConfig(n_steps=T, epochs=3, minibatches=minibatches, clip=0.2, value_clip=0.2, ent_coef=0.01,
                       vf_coef=0.5, adv_norm=True, max_grad_norm=1.0, optimizer="sgd", lr=0.05, fast_path=fast)
        torch.manual_seed(7)
        actor = (VQC(obs_dim, A, n_qubits=4, layers=2, preprocess="linear", output="linear", scaling="atan", seed=1)
                 if quantum else build_mlp(MLPConfig(hidden=[32, 32]), obs_dim, A))
        critic = build_mlp(MLPConfig(hidden=[32, 32]), state_dim or obs_dim, 1)
        flat = FlatParameters(actor, critic)
        start = flat.numpy()
        optimizer = actor_critic_module.make_optimizer(ac.optimizer, flat.flat, ac)
        if fast:  # the numpy epochs never reach the torch loss
            monkeypatch.setattr(actor_critic_module, "actor_critic_loss", None)
        diag = actor_critic_update(ac, actor, critic, flat, optimizer, np.random.default_rng(11), batch,
                                   dist=Categorical(A), value_norm=ValueNorm(0.99) if value_norm else None)
        results[fast] = (flat.numpy() - start, diag)
    (torch_step, torch_diag), (numpy_step, numpy_diag) = results[False], results[True]
    assert np.abs(torch_step).max() > 1e-3  # the update moved the parameters
    np.testing.assert_allclose(numpy_step, torch_step, rtol=1e-3, atol=2e-6)
    assert torch_diag.keys() == numpy_diag.keys() == set(DIAGNOSTICS)
    for key in DIAGNOSTICS:
        assert numpy_diag[key] == pytest.approx(torch_diag[key], rel=1e-3, abs=1e-5), key


def test_which_updates_take_the_numpy_epochs():
    ac = PPOConfig()
    mlp, critic = build_mlp(MLPConfig(hidden=[8]), 3, 2), build_mlp(MLPConfig(hidden=[8]), 3, 1)
    twins = update_twins(ac, mlp, critic, Categorical(2))
    assert all(isinstance(t, NumpyMLP) and t.dtype == np.float32 for t in twins)
    assert update_twins(ac, mlp, critic, None) is not None  # the softmax over the logits
    assert update_twins(PPOConfig(fast_path=False), mlp, critic, None) is None
    assert update_twins(ac, mlp, critic, DiagGaussian(np.array([-1.0]), np.array([1.0]))) is None  # continuous
    vqc = VQC(3, 2, n_qubits=3, layers=1, seed=0)
    actor, twin = update_twins(ac, vqc, critic, None)  # a head without a twin goes through autograd
    assert isinstance(actor, AutogradHead) and actor.module is vqc and isinstance(twin, NumpyMLP)
    assert update_twins(ac, vqc, VQC(3, 1, n_qubits=3, layers=1, seed=0), None) is None  # no twin at all


def test_team_worker_acts_through_the_twin_and_learns_as_the_torch_path(tmp_path):
    """spread MAPPO, two updates: the default run acts and learns through the twins, ``fast_path: false``
    through torch; the first rollout is the same (its sampled actions do not flip at float32 rounding) and
    the first update's diagnostics agree to float32 rounding."""
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    rows = {}
    for fast in (True, False):
        cfg = load_config(SCENARIOS / "spread_mappo.yaml", [
            "run.total_env_steps=800", "run.eval_every=null", "run.plots=false", f"algorithm.fast_path={str(fast).lower()}"])
        out = tmp_path / str(fast)
        run_experiment(cfg, out, plots=False)
        lines = (out / "train.csv").read_text().splitlines()
        header = lines[0].split(",")
        rows[fast] = [dict(zip(header, line.split(","))) for line in lines[1:]]
        episodes = (out / "metrics.csv").read_text().splitlines()
        rows[fast, "first episode"] = episodes[1]
    assert rows[True, "first episode"] == rows[False, "first episode"]
    first_fast, first_torch = rows[True][0], rows[False][0]
    for key in DIAGNOSTICS:
        assert float(first_fast[key]) == pytest.approx(float(first_torch[key]), rel=1e-3, abs=1e-5), key


def test_the_terms_leave_the_gradient_as_it_was():
    """Asking loss_grad for train.csv's terms computes them beside the gradient: the same bytes either way."""
    k = knobs()
    logits, actions, adv, values, returns, old_logp, old_values = (
        x.astype(np.float32) if x.dtype == np.float64 else x for x in _case(5))
    plain = loss_grad(k, logits, actions, adv, values, returns, old_logp=old_logp, old_values=old_values)
    logged = loss_grad(k, logits, actions, adv, values, returns, {}, old_logp=old_logp, old_values=old_values)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, logged))


def test_the_float32_twin_reads_its_parameters_as_they_are_now():
    """The twin keeps views of the parameters: an optimizer's in-place step and a load show at once; new
    parameter objects (a resumed snapshot's) are read afresh; a pickle holds no views."""
    import pickle

    torch.manual_seed(0)
    net = build_mlp(MLPConfig(hidden=[16]), 3, 2)
    flat = FlatParameters(net)
    twin = NumpyMLP(net, np.float32)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)

    def reference() -> np.ndarray:
        with torch.no_grad():
            return net(torch.from_numpy(x)).numpy()

    np.testing.assert_allclose(twin.forward(x)[0], reference(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        flat.flat.mul_(0.5)  # in place, as an optimizer step
    np.testing.assert_allclose(twin.forward(x)[0], reference(), rtol=1e-5, atol=1e-6)
    flat.load(np.linspace(-1, 1, flat.size).astype(np.float32))  # a pull from the server
    np.testing.assert_allclose(twin.forward(x)[0], reference(), rtol=1e-5, atol=1e-6)
    first = net[0].weight
    FlatParameters(net)  # new parameter objects seated on the same modules
    assert net[0].weight is not first
    np.testing.assert_allclose(twin.forward(x)[0], reference(), rtol=1e-5, atol=1e-6)
    assert "_views" in twin.__dict__ and "_views" not in pickle.loads(pickle.dumps(twin)).__dict__
