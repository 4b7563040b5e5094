"""agents/value_norm.py (MAPPO's ValueNorm) against a hand computation."""
from __future__ import annotations

import numpy as np
import pytest

from agents.value_norm import ValueNorm

BATCHES = [np.array([1.0, 2.0, 3.0]), np.array([4.0]), np.array([-2.0, 0.0])]


def test_first_update_is_the_batch_mean_and_variance():
    vn = ValueNorm(beta=0.9)
    vn.update(BATCHES[0])
    # m = 0.1 * 2, s = 0.1 * 14/3, d = 0.1 -> mu = 2, var = 14/3 - 4 = 2/3
    mu, var = vn.mean_var()
    assert mu == pytest.approx(2.0) and var == pytest.approx(2.0 / 3.0)


def test_three_updates_by_hand_with_beta_0_9():
    vn = ValueNorm(beta=0.9)
    for x in BATCHES:
        vn.update(x)
    # by hand, step by step: m, s, d after each update
    m = s = d = 0.0
    for mean_x, mean_x2 in ((2.0, 14.0 / 3.0), (4.0, 16.0), (-1.0, 2.0)):
        m, s, d = 0.9 * m + 0.1 * mean_x, 0.9 * s + 0.1 * mean_x2, 0.9 * d + 0.1
    assert d == pytest.approx(0.271)
    # a second reference: the debiased EMA is the beta^(K-k)-weighted average of the batch moments
    w = np.array([0.81, 0.9, 1.0])
    mu_w = (w * [2.0, 4.0, -1.0]).sum() / w.sum()
    var_w = (w * [14.0 / 3.0, 16.0, 2.0]).sum() / w.sum() - mu_w ** 2
    mu, var = vn.mean_var()
    assert mu == pytest.approx(m / d) == pytest.approx(mu_w)
    assert var == pytest.approx(s / d - (m / d) ** 2) == pytest.approx(var_w)
    x = np.array([-3.0, 0.5, 10.0])
    np.testing.assert_allclose(vn.normalize(x), (x - mu_w) / np.sqrt(var_w))


def test_normalize_and_denormalize_are_inverse_and_variance_is_floored():
    vn = ValueNorm(beta=0.9)
    x = np.linspace(-50, 50, 11)
    np.testing.assert_allclose(vn.denormalize(vn.normalize(x)), x)  # before any update too
    for b in BATCHES:
        vn.update(b * 10)
    np.testing.assert_allclose(vn.denormalize(vn.normalize(x)), x, atol=1e-12)
    np.testing.assert_allclose(vn.normalize(vn.denormalize(x)), x, atol=1e-12)
    const = ValueNorm(beta=0.9)
    const.update(np.full(4, 7.0))
    assert const.mean_var() == pytest.approx((7.0, 1e-2))  # zero variance floored at min_var
    const.update(np.array([]))  # an empty batch changes nothing
    assert const.mean_var() == pytest.approx((7.0, 1e-2))


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.1])
def test_beta_outside_the_open_unit_interval_is_refused(beta):
    with pytest.raises(ValueError, match="value_norm_beta"):
        ValueNorm(beta=beta)


# ----------------------------------------------------------------------------- RunningMeanStd
def _pooled(batches, prior=1e-4):
    """Brute force: the mean and population variance of the prior pseudo-sample (count ``prior``, mean 0,
    variance 1) pooled with every value seen, from the raw values at once."""
    x = np.concatenate(batches)
    n = prior + x.size
    mean = x.sum() / n
    return mean, (prior * (1.0 + mean ** 2) + ((x - mean) ** 2).sum()) / n


def test_running_mean_std_merges_batches_into_the_pooled_moments():
    from agents.value_norm import RunningMeanStd

    rng = np.random.default_rng(3)
    batches = [rng.normal(-2.0, 3.0, size=k) for k in (1, 7, 32, 5, 100)]
    rms = RunningMeanStd()
    assert (rms.mean, rms.var) == (0.0, 1.0)
    for i, b in enumerate(batches):
        rms.update(b)
        mean, var = _pooled(batches[: i + 1])
        assert rms.mean == pytest.approx(mean, rel=1e-12) and rms.var == pytest.approx(var, rel=1e-12)
        assert rms.count == pytest.approx(1e-4 + sum(len(x) for x in batches[: i + 1]))
    rms.update(np.array([]))  # an empty batch changes nothing
    assert rms.mean == pytest.approx(mean, rel=1e-12)
    x = np.array([-5.0, 0.0, 4.5])
    out = rms.standardise(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var), rtol=1e-6)
    back = RunningMeanStd()
    back.load_state_dict(rms.state_dict())
    assert (back.mean, back.var, back.count) == (rms.mean, rms.var, rms.count)
    with pytest.raises(ValueError, match="count"):
        back.load_state_dict({"mean": np.array(0.0), "var": np.array(1.0)})
