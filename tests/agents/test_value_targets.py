"""Value-based targets, losses, mixers and schedules against hand computations, properties and autograd."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import chisquare

from agents.value_targets import (QMixer, VDNMixer, bootstrap_values, double_dqn_target, dqn_target, epsilon_greedy,
                                  exponential_schedule, linear_schedule, masked_argmax, masked_max, q_taken, td_loss,
                                  td_target)


@st.composite
def q_and_mask(draw):
    """Finite Q-values (rows, A) and a mask with at least one legal action per row."""
    rows, actions = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    q = draw(hnp.arrays(np.float64, (rows, actions), elements=st.floats(-1e6, 1e6, allow_nan=False)))
    mask = draw(hnp.arrays(np.bool_, (rows, actions)))
    mask[np.arange(rows), draw(hnp.arrays(np.int64, rows, elements=st.integers(0, actions - 1)))] = True
    return q, mask


# ----------------------------------------------------------------------------- masked greedy actions
@settings(max_examples=60, deadline=None)
@given(q_and_mask())
def test_masked_argmax_never_picks_an_illegal_action(data):
    q, mask = data
    for qq, mm in ((q, mask), (torch.as_tensor(q), torch.as_tensor(mask))):
        best = np.asarray(masked_argmax(qq, mm))
        assert mask[np.arange(len(q)), best].all()
        legal_max = np.array([q[i][mask[i]].max() for i in range(len(q))])
        np.testing.assert_array_equal(q[np.arange(len(q)), best], legal_max)
        np.testing.assert_array_equal(np.asarray(masked_max(qq, mm)), legal_max)


def test_masked_argmax_by_hand_and_all_illegal_rows():
    q = np.array([[1.0, 5.0, 2.0], [3.0, 1.0, 4.0]])
    avail = np.array([[1, 0, 1], [1, 1, 0]])
    np.testing.assert_array_equal(masked_argmax(q, avail), [2, 0])
    np.testing.assert_array_equal(masked_argmax(q), [1, 2])
    np.testing.assert_array_equal(masked_max(torch.tensor(q), torch.tensor(avail)), [2.0, 3.0])
    with pytest.raises(ValueError, match=r"no legal action in 1 row\(s\), the first at index \(1,\)"):
        masked_argmax(q, np.array([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="avail"):
        masked_argmax(q, np.ones((2, 2)))


@settings(max_examples=40, deadline=None)
@given(q_and_mask(), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_epsilon_greedy_never_picks_an_illegal_action(data, epsilon, seed):
    q, mask = data
    actions = epsilon_greedy(q, mask, epsilon, np.random.default_rng(seed))
    assert mask[np.arange(len(q)), actions].all()


def test_epsilon_greedy_extremes():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(20_000, 4))
    avail = np.ones_like(q, dtype=bool)
    avail[:, 1] = False
    np.testing.assert_array_equal(epsilon_greedy(q, avail, 0.0, rng), masked_argmax(q, avail))
    picks = epsilon_greedy(q, avail, 1.0, rng)  # uniform over the three legal actions
    counts = np.bincount(picks, minlength=4)
    assert counts[1] == 0 and chisquare(counts[[0, 2, 3]]).pvalue > 1e-3


# ----------------------------------------------------------------------------- targets
def hand_batch():
    q_online_next = torch.tensor([[1.0, 5.0, 2.0], [3.0, 1.0, 4.0], [0.0, 0.0, 0.0]])
    q_target_next = torch.tensor([[10.0, 20.0, 30.0], [7.0, 8.0, 9.0], [1.0, 2.0, 3.0]])
    avail_next = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])  # row 2 ended: no legal action left
    reward = torch.tensor([1.0, 2.0, 3.0])
    discount = torch.tensor([0.9, 0.81, 0.9])
    terminated = torch.tensor([False, False, True])
    return reward, discount, terminated, q_online_next, q_target_next, avail_next


def test_double_dqn_target_by_hand():
    reward, discount, terminated, q_on, q_tg, avail = hand_batch()
    # row 0: argmax online = 1 -> Q_target 20 -> 1 + .9*20 = 19
    # row 1: legal {0, 1}: argmax online = 0 (not the illegal 2) -> Q_target 7 -> 2 + .81*7 = 7.67
    # row 2: terminated -> 3
    y = double_dqn_target(reward, discount, terminated, q_on, q_tg, avail)
    torch.testing.assert_close(y, torch.tensor([19.0, 7.67, 3.0]))
    # plain DQN: max of the target over legal actions: 1 + .9*30, 2 + .81*8, 3
    torch.testing.assert_close(dqn_target(reward, discount, terminated, q_tg, avail), torch.tensor([28.0, 8.48, 3.0]))
    # a non-terminated row without a legal action has no greedy action
    with pytest.raises(ValueError, match="no legal action"):
        double_dqn_target(reward, discount, torch.zeros(3, dtype=torch.bool), q_on, q_tg, avail)


def test_targets_are_detached_and_broadcast_over_agents():
    q_on = torch.randn(4, 3, 5, requires_grad=True)
    q_tg = torch.randn(4, 3, 5, requires_grad=True)
    reward, discount, terminated = torch.randn(4), torch.full((4,), 0.99), torch.tensor([0, 1, 0, 0])
    y = double_dqn_target(reward, discount, terminated, q_on, q_tg)
    assert y.shape == (4, 3) and not y.requires_grad
    for a in range(3):  # IQL: the target of each agent is its own Double DQN target
        torch.testing.assert_close(y[:, a], double_dqn_target(reward, discount, terminated, q_on[:, a], q_tg[:, a]))
    v = bootstrap_values(q_tg, q_online_next=q_on)
    torch.testing.assert_close(td_target(reward[:, None].expand(4, 3), discount, terminated, v), y)


def test_q_taken_and_td_loss_by_hand():
    q = torch.tensor([[0.0, 1.0], [2.0, 0.0], [5.0, 0.0]], requires_grad=True)
    pred = q_taken(q, torch.tensor([0, 0, 0]))  # 0, 2, 5
    target = torch.tensor([0.5, 4.0, 2.0])  # deltas 0.5, 2, -3
    weights = torch.tensor([1.0, 0.5, 2.0])
    loss, delta = td_loss(pred, target, weights)  # Huber: .125, 1.5, 2.5 -> weighted .125, .75, 5
    assert loss.item() == pytest.approx((0.125 + 0.75 + 5.0) / 3)
    torch.testing.assert_close(delta, torch.tensor([0.5, 2.0, -3.0]))
    assert not delta.requires_grad
    loss.backward()  # d/dQ of w * huber: -w * clip(delta, -1, 1) / 3 on the taken actions
    torch.testing.assert_close(q.grad, torch.tensor([[-0.5, 0.0], [-0.5, 0.0], [2.0, 0.0]]) / 3)
    mse, _ = td_loss(pred, target, weights, loss="mse")  # .25, 4, 9 -> .25, 2, 18
    assert mse.item() == pytest.approx(20.25 / 3)
    masked, _ = td_loss(pred, target, None, loss="mse", mask=torch.tensor([1.0, 1.0, 0.0]))
    assert masked.item() == pytest.approx((0.25 + 4.0) / 2)
    with pytest.raises(ValueError, match="algorithm.loss must be 'huber' or 'mse', got 'l1'"):
        td_loss(pred, target, loss="l1")


# ----------------------------------------------------------------------------- mixers
def test_vdn_is_the_sum_of_the_agents_qs():
    qs = torch.randn(5, 7, 3, requires_grad=True)
    q_tot = VDNMixer()(qs, torch.randn(5, 7, 10))
    torch.testing.assert_close(q_tot, qs[..., 0] + qs[..., 1] + qs[..., 2])
    q_tot.sum().backward()
    torch.testing.assert_close(qs.grad, torch.ones_like(qs))
    assert not list(VDNMixer().parameters())


def mixer_gradients(mixer: QMixer, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """dQ_tot/dQ_a for every sample and agent (samples are independent, so the sum's gradient is theirs)."""
    qs = qs.clone().requires_grad_(True)
    mixer(qs, state).sum().backward()
    return qs.grad


@pytest.mark.parametrize("layers", [1, 2])
def test_qmix_is_monotonic_in_every_agents_q(layers):
    torch.manual_seed(0)
    mixer = QMixer(n_agents=3, state_dim=54, hypernet_layers=layers)
    qs, state = 10 * torch.randn(512, 3), 3 * torch.randn(512, 54)
    grad = mixer_gradients(mixer, qs, state)
    assert (grad >= 0).all() and (grad > 0).any()
    # raising one agent's Q never lowers Q_tot
    for a in range(3):
        bumped = qs.clone()
        bumped[:, a] += torch.rand(512) * 5
        with torch.no_grad():
            assert (mixer(bumped, state) >= mixer(qs, state) - 1e-5).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 20), st.sampled_from([1, 2]), st.floats(0.01, 100.0),
       st.integers(0, 2**31 - 1))
def test_qmix_monotonic_on_random_inputs(n_agents, state_dim, layers, scale, seed):
    torch.manual_seed(seed)
    mixer = QMixer(n_agents, state_dim, embed_dim=8, hypernet_layers=layers, hypernet_embed=16)
    gen = torch.Generator().manual_seed(seed)
    qs = scale * torch.randn(32, n_agents, generator=gen)
    state = scale * torch.randn(32, state_dim, generator=gen)
    assert (mixer_gradients(mixer, qs, state) >= 0).all()


def test_qmix_forward_against_the_formula():
    """Q_tot = |w2(s)|^T elu(|W1(s)|^T q + b1(s)) + V(s), written out from the module's own layers."""
    torch.manual_seed(1)
    mixer = QMixer(n_agents=2, state_dim=4, embed_dim=3, hypernet_layers=1)
    qs, state = torch.randn(6, 5, 2), torch.randn(6, 5, 4)  # (batch, time, agents): leading axes kept
    out = mixer(qs, state)
    assert out.shape == (6, 5)
    lin = lambda layer, x: x @ layer.weight.T + layer.bias  # noqa: E731
    for b in range(6):
        for t in range(5):
            s, q = state[b, t], qs[b, t]
            w1 = lin(mixer.hyper_w1, s).abs().reshape(2, 3)
            hidden = torch.nn.functional.elu(q @ w1 + lin(mixer.hyper_b1, s))
            v = lin(mixer.hyper_v[2], torch.relu(lin(mixer.hyper_v[0], s)))
            torch.testing.assert_close(out[b, t], hidden @ lin(mixer.hyper_w2, s).abs() + v[0])
    with pytest.raises(ValueError, match="QMixer"):
        mixer(qs, state[..., :3])
    with pytest.raises(ValueError, match="mixer.hypernet_layers must be 1 or 2, got 3"):
        QMixer(2, 4, hypernet_layers=3)


# ----------------------------------------------------------------------------- schedules
def test_schedules_by_hand():
    assert [linear_schedule(s, 1.0, 0.05, 100) for s in (0, 50, 100, 1000)] == pytest.approx([1.0, 0.525, 0.05, 0.05])
    assert linear_schedule(7, 0.4, 1.0, 0) == 1.0  # no anneal: the end value
    assert [exponential_schedule(s, 1.0, 0.01, 100) for s in (0, 50, 100, 200)] == pytest.approx([1.0, 0.1, 0.01, 0.01])
    assert exponential_schedule(25, 0.5, 0.5, 100) == 0.5
    with pytest.raises(ValueError, match=r"epsilon_end must lie in \[0, 1\], got 1.5"):
        linear_schedule(0, 1.0, 1.5, 10)
    with pytest.raises(ValueError, match="epsilon_anneal_steps must be an integer >= 0, got -1"):
        linear_schedule(0, 1.0, 0.1, -1)
    with pytest.raises(ValueError, match="epsilon_start and epsilon_end > 0"):
        exponential_schedule(0, 1.0, 0.0, 10)
