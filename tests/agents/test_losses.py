"""The actor-critic loss (agents.losses): hand-computed terms, masks, and the numpy twin's gradient
against torch autograd."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agents.losses import (loss_grad, actor_critic_loss, categorical, diagnostics, explained_variance,
                           policy_loss, ratio_stats, value_loss)
from agents.heads import MLPConfig, build_mlp
from marl_q.metrics import DIAGNOSTICS


def knobs(**kw):
    base = dict(clip=None, value_clip=None, ent_coef=0.0, vf_coef=0.5, adv_norm=False)
    return SimpleNamespace(**{**base, **kw})


def test_clipped_objective_with_one_pass_has_a2c_gradient():
    """Huang et al. 2022: at ratio 1 the clipped loss's gradient is A2C's (the clip never binds)."""
    torch.manual_seed(0)
    net = build_mlp(MLPConfig(hidden=[8]), 3, 4)
    obs, act = torch.randn(32, 3), torch.randint(0, 4, (32,))
    adv = torch.randn(32)
    grads = []
    for clip in (None, 0.2):
        net.zero_grad()
        logp, _ = categorical(net(obs), act, entropy=False)
        policy_loss(logp, logp.detach(), adv, clip).backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_policy_and_value_loss_hand_computed():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    old = torch.log(torch.tensor([0.25, 0.25]))
    adv = torch.tensor([1.0, -2.0])
    # ratios 2 and 1: clipped terms min(2*1, 1.2*1) = 1.2 and min(-2, -2) = -2 -> loss -(1.2 - 2)/2 = 0.4
    assert abs(policy_loss(logp, old, adv, 0.2).item() - 0.4) < 1e-6
    v, v_old, ret = torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([0.0])
    assert value_loss(v, v_old, ret, None).item() == 9.0
    assert value_loss(v, v_old, ret, 0.5).item() == 9.0  # max(9, 1.5^2)
    assert abs(value_loss(torch.tensor([0.2]), v_old, ret, 0.5).item() - 0.25) < 1e-6  # max(0.04, 0.5^2)
    stats = ratio_stats(logp, old, 0.2)
    assert stats["clipfrac"] == 0.5  # ratio 2 lies outside [0.8, 1.2], ratio 1 inside
    assert stats["approx_kl"] == pytest.approx(((2 - 1) - np.log(2)) / 2, rel=1e-6)


def test_categorical_matches_torch_distributions():
    torch.manual_seed(1)
    logits, act = torch.randn(6, 3), torch.randint(0, 3, (6,))
    logp, entropy = categorical(logits, act)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logp, dist.log_prob(act))
    torch.testing.assert_close(entropy, dist.entropy())
    assert categorical(logits, act, entropy=False)[1] is None


def test_actor_critic_loss_is_its_terms():
    torch.manual_seed(2)
    logp, adv, v, ret, ent = torch.randn(5), torch.randn(5), torch.randn(5), torch.randn(5), torch.rand(5)
    k = knobs(ent_coef=0.01, vf_coef=0.7)
    terms = actor_critic_loss(k, logp, adv, v, ret, entropy=ent)
    expected = -(adv * logp).mean() - 0.01 * ent.mean() + 0.7 * ((v - ret) ** 2).mean()
    torch.testing.assert_close(terms.loss, expected)
    assert actor_critic_loss(k, logp, adv, v, ret).entropy is None


@pytest.mark.parametrize("clip,value_clip,adv_norm", [(None, None, False), (0.2, 0.2, True), (0.1, None, True)])
def test_a_mask_weighs_like_leaving_the_masked_samples_out(clip, value_clip, adv_norm):
    """What a multi-agent caller with padded (dead-agent) samples gets: the loss, and its gradient,
    of the unmasked samples alone."""
    torch.manual_seed(3)
    B = 12
    mask = torch.rand(B) < 0.6
    z = torch.randn(B, 3, requires_grad=True)
    v = torch.randn(B, requires_grad=True)
    act, adv, ret = torch.randint(0, 3, (B,)), torch.randn(B), torch.randn(B)
    old_logp, old_v = torch.log_softmax(torch.randn(B, 3), -1).gather(1, act[:, None]).squeeze(1), torch.randn(B)
    k = knobs(clip=clip, value_clip=value_clip, adv_norm=adv_norm, ent_coef=0.02)
    losses, grads = [], []
    for keep, m in ((mask, None), (slice(None), mask.float())):
        logp, ent = categorical(z[keep], act[keep])
        loss = actor_critic_loss(k, logp, adv[keep], v[keep], ret[keep], old_logp=old_logp[keep],
                                 old_values=old_v[keep], entropy=ent, mask=m).loss
        z.grad = v.grad = None
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([z.grad.flatten(), v.grad]))
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("B,ent_coef,adv_norm,vf_coef", [
    (1, 0.0, False, 1.0),  # Koelle's one-step update
    (7, 0.01, False, 0.5),
    (9, 0.05, True, 0.7),
])
def test_numpy_twin_gradient_equals_torch_autograd(B, ent_coef, adv_norm, vf_coef):
    """loss_grad (float64, by hand) against autograd through categorical + actor_critic_loss
    (float32, the heads' dtype): equal to float32 rounding."""
    rng = np.random.default_rng(B)
    logits, values = rng.normal(size=(B, 3)), rng.normal(size=B)
    actions, adv, returns = rng.integers(0, 3, size=B), rng.normal(size=B), rng.normal(size=B)
    k = knobs(ent_coef=ent_coef, adv_norm=adv_norm, vf_coef=vf_coef)
    z = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    v = torch.tensor(values, dtype=torch.float32, requires_grad=True)
    logp, ent = categorical(z, torch.from_numpy(actions), entropy=ent_coef != 0.0)
    actor_critic_loss(k, logp, torch.tensor(adv, dtype=torch.float32), v,
                      torch.tensor(returns, dtype=torch.float32), entropy=ent).loss.backward()
    grad_logits, grad_values = loss_grad(k, logits, actions, adv, values, returns)
    np.testing.assert_allclose(grad_logits, z.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_values, v.grad.numpy(), rtol=1e-5, atol=1e-7)
    # the terms it reports for train.csv are LossTerms', and asking for them leaves the gradient as it was
    terms: dict = {}
    grad_logits_2, grad_values_2 = loss_grad(k, logits, actions, adv, values, returns, terms)
    assert np.array_equal(grad_logits_2, grad_logits) and np.array_equal(grad_values_2, grad_values)
    logp, ent = categorical(z.detach(), torch.from_numpy(actions))
    expected = actor_critic_loss(k, logp, torch.tensor(adv, dtype=torch.float32), v.detach(),
                                 torch.tensor(returns, dtype=torch.float32), entropy=ent)
    for key in ("policy", "value", "entropy"):
        assert terms[key] == pytest.approx(float(getattr(expected, key)), rel=1e-5, abs=1e-7), key


# ----------------------------------------------------------------------------- train.csv's diagnostics
def test_approx_kl_and_clip_fraction_by_hand():
    """Ratios 0.5, 1, 1.1, 1.5 with clip 0.2: two lie outside [0.8, 1.2]; the k3 estimator
    mean((r - 1) - log r) term by term; a mask leaves the masked samples out."""
    ratio = np.array([0.5, 1.0, 1.1, 1.5])
    old = torch.log(torch.tensor([0.4, 0.2, 0.5, 0.3], dtype=torch.float64))
    logp = old + torch.log(torch.from_numpy(ratio))
    k3 = [(-0.5 - np.log(0.5)), 0.0, (0.1 - np.log(1.1)), (0.5 - np.log(1.5))]  # 0.19315, 0, 0.00469, 0.09453
    stats = ratio_stats(logp, old, 0.2)
    assert stats["clipfrac"] == 0.5
    assert stats["approx_kl"] == pytest.approx(np.mean(k3), rel=1e-12)
    assert stats["approx_kl"] == pytest.approx(0.0730932, rel=1e-5)
    masked = ratio_stats(logp, old, 0.2, mask=torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    assert masked["clipfrac"] == pytest.approx(1 / 3) and masked["approx_kl"] == pytest.approx(np.mean(k3[:3]))
    assert "clipfrac" not in ratio_stats(logp, old, None)  # no clip, no clip fraction
    assert ratio_stats(old, old, 0.2) == {"approx_kl": 0.0, "clipfrac": 0.0}  # the first pass: ratio 1


def test_explained_variance_by_hand():
    """Returns 1, 2, 3, 4 (population variance 1.25) and values off by +-0.5 (residual variance 0.25): 0.8."""
    returns, values = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.5, 1.5, 3.5, 3.5])
    assert explained_variance(values, returns) == pytest.approx(0.8, rel=1e-12)
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(np.full(4, 2.5), returns) == pytest.approx(0.0, abs=1e-12)  # the mean
    assert explained_variance(values + 10.0, returns) == pytest.approx(0.8)  # an offset is not penalised (CleanRL's)
    assert explained_variance(values, np.ones(4)) is None  # Var[R] = 0: undefined, an empty cell
    assert explained_variance(values[:1], returns[:1]) is None  # one sample (a one-step update)


def test_diagnostics_name_train_csv_columns_and_keep_none():
    row = diagnostics(torch.tensor(0.5, requires_grad=True), np.float32(2.0), None, 0.0, None, 0.25)
    assert list(row) == list(DIAGNOSTICS)
    assert row == {"policy_loss": 0.5, "value_loss": 2.0, "entropy": None, "approx_kl": 0.0, "clipfrac": None,
                   "explained_variance": 0.25}
    assert all(type(v) is float for v in row.values() if v is not None)
