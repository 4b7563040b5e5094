"""agents/distributions.py against torch.distributions and hand computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from scipy.stats import chisquare

from agents.distributions import Categorical, DiagGaussian, LogStd, distribution_for, head_out_dim

P_THRESHOLD = 1e-3  # chi-square: reject "the draws follow the masked softmax" below this p-value


# ----------------------------------------------------------------------------- DiagGaussian
def test_gaussian_log_prob_and_entropy_equal_torch_normal():
    g = torch.Generator().manual_seed(0)
    dist = DiagGaussian(low=-np.ones(3), high=np.ones(3))
    mu, log_std = torch.randn(7, 3, generator=g, dtype=torch.float64), 0.5 * torch.randn(7, 3, generator=g, dtype=torch.float64)
    actions = torch.randn(7, 3, generator=g, dtype=torch.float64) * 2.0
    logp, entropy = dist.log_prob_entropy(torch.cat([mu, log_std], dim=1), actions)
    ref = torch.distributions.Normal(mu, log_std.exp())
    torch.testing.assert_close(logp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))
    assert logp.shape == entropy.shape == (7,)


def test_gaussian_samples_have_the_heads_mean_and_std():
    dist = DiagGaussian(low=-np.ones(2), high=np.ones(2))
    n = 40_000
    out = np.tile([0.3, -2.0, np.log(0.5), np.log(2.0)], (n, 1)).astype(np.float32)
    draws = dist.sample(out, np.random.default_rng(1))
    assert draws.shape == (n, 2) and draws.dtype == np.float32
    # 5 standard errors of the mean and of the std of a normal sample
    for j, (mean, std) in enumerate([(0.3, 0.5), (-2.0, 2.0)]):
        assert abs(draws[:, j].mean() - mean) < 5 * std / np.sqrt(n)
        assert abs(draws[:, j].std() - std) < 5 * std / np.sqrt(2 * n)
    assert (np.abs(draws[:, 1]) > 1).any()  # samples themselves are unbounded ...
    np.testing.assert_array_equal(dist.mode(out), out[:, :2])


def test_gaussian_to_env_clips_to_the_bounds_and_keeps_inner_actions():
    low, high = np.array([-2.0, -1.0], np.float32), np.array([2.0, 0.5], np.float32)
    dist = DiagGaussian(low, high)
    actions = np.array([[-5.0, 3.0], [1.5, -0.25], [2.0, -7.0]], np.float32)
    env_actions = dist.to_env(actions)
    np.testing.assert_array_equal(env_actions, [[-2.0, 0.5], [1.5, -0.25], [2.0, -1.0]])
    assert np.all(env_actions >= low) and np.all(env_actions <= high)


def test_log_std_head_is_a_trainable_state_independent_vector():
    head = LogStd(torch.nn.Linear(4, 2), act_dim=2, init_log_std=-0.5)
    x = torch.randn(5, 4)
    out = head(x)
    assert out.shape == (5, 4)
    torch.testing.assert_close(out[:, 2:], torch.full((5, 2), -0.5))
    assert head.log_std.requires_grad and "log_std" in dict(head.named_parameters())
    dist = DiagGaussian(-np.ones(2), np.ones(2))
    logp, _ = dist.log_prob_entropy(out, torch.zeros(5, 2))
    logp.sum().backward()
    assert head.log_std.grad is not None and torch.all(head.log_std.grad != 0)


def test_distribution_for_spaces():
    assert isinstance(distribution_for(spaces.Discrete(4)), Categorical)
    gauss = distribution_for(spaces.Box(-1, 1, (3,)))
    assert isinstance(gauss, DiagGaussian) and gauss.dim == 3 and head_out_dim(gauss) == 3
    assert head_out_dim(distribution_for(spaces.Discrete(4))) == 4
    with pytest.raises(ValueError, match="Discrete or a 1-D Box"):
        distribution_for(spaces.Box(-1, 1, (2, 2)))


# ----------------------------------------------------------------------------- Categorical with a mask
LOGITS = np.array([0.5, -1.0, 1.2, 0.0, 2.0])
MASK = np.array([1, 0, 1, 1, 0], np.float32)  # actions 1 and 4 unavailable (4 has the largest logit)


def _masked_softmax() -> np.ndarray:
    """By hand: exp(l_a) / sum over the available actions; 0 for the masked ones."""
    e = np.where(MASK > 0, np.exp(LOGITS), 0.0)
    return e / e.sum()


def test_masked_actions_are_never_sampled_and_frequencies_match_the_softmax():
    n = 30_000
    dist = Categorical(5)
    draws = dist.sample(np.tile(LOGITS, (n, 1)), np.random.default_rng(7), np.tile(MASK, (n, 1)))
    counts = np.bincount(draws, minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    p = _masked_softmax()
    avail = MASK > 0
    stat, pvalue = chisquare(counts[avail], n * p[avail])
    assert pvalue > P_THRESHOLD, (counts, n * p, stat)
    # and without a mask the most likely action (4) dominates: the mask is what removed it
    free = np.bincount(dist.sample(np.tile(LOGITS, (n, 1)), np.random.default_rng(7)), minlength=5)
    e = np.exp(LOGITS) / np.exp(LOGITS).sum()
    assert chisquare(free, n * e).pvalue > P_THRESHOLD
    assert Categorical(5).mode(LOGITS[None], MASK[None])[0] == 2


def test_masked_log_probs_and_entropy_are_renormalised_over_available_actions():
    logits = torch.tensor(np.tile(LOGITS, (3, 1)), requires_grad=True)
    avail = torch.tensor(np.tile(MASK, (3, 1)))
    actions = torch.tensor([0, 2, 3])
    logp, entropy = Categorical(5).log_prob_entropy(logits, actions, avail)
    p = _masked_softmax()
    np.testing.assert_allclose(logp.detach().numpy(), np.log(p[[0, 2, 3]]), rtol=1e-6)
    hand_entropy = -sum(p[a] * np.log(p[a]) for a in (0, 2, 3))
    np.testing.assert_allclose(entropy.detach().numpy(), [hand_entropy] * 3, rtol=1e-6)
    (logp.sum() + entropy.sum()).backward()
    assert torch.all(logits.grad[:, [1, 4]] == 0)  # masked actions carry no gradient
    assert torch.all(logits.grad[:, [0, 2, 3]].abs().sum(1) > 0)
