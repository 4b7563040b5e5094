"""The QRL papers' policy read-outs: Jerbi et al.'s softmax with a trainable inverse temperature and
weighted observables, the raw Born-rule policy, and Skolik et al.'s per-observable output scaling;
each against a hand computation and against PennyLane (the same function through a QNode)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from agents.distributions import Categorical
from circuits.blocks import ANSATZE, CircuitConfigError
from circuits.policies import BORN_CLAMP, born_partition
from circuits.vqc import VQC
from marl_q.protocol import gumbel_max
from tests.circuits.test_parity import assert_parity


def test_born_partition_is_b_mod_actions():
    assert born_partition(2, 3).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]
    assert born_partition(3, 2).sum(axis=0).tolist() == [4, 4]


def test_born_policy_by_hand():
    # RX(x0) RX(x1), weights zero (RX(0) = I), then basic_entangler's CNOT(0, 1) for n = 2:
    # bit i is 1 with p_i = sin^2(x_i / 2); after the CNOT, b = (b0, b0 xor b1) with b0 the high bit
    x = torch.tensor([[0.7, -1.9]], dtype=torch.float64)
    p0, p1 = (math.sin(v / 2) ** 2 for v in x[0].tolist())
    joint = {(a, b): (p0 if a else 1 - p0) * (p1 if b else 1 - p1) for a in (0, 1) for b in (0, 1)}
    probs = np.zeros(4)
    for (a, b), p in joint.items():
        probs[2 * a + (a ^ b)] += p
    for actions in (2, 3, 4):
        module = VQC(2, actions, n_qubits=2, layers=1, ansatz="basic_entangler", rotation="rx", output="born",
                     dtype="complex128", engine="gates")
        with torch.no_grad():
            module.weights.zero_()
            got = module(x)
        want = probs @ born_partition(2, actions)
        torch.testing.assert_close(got, torch.log(torch.as_tensor(want)[None]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("ansatz, reupload, n, actions", list(itertools.product(ANSATZE, [False, True], [2, 3], [2, 3])))
def test_born_policy_matches_pennylane_probs(ansatz, reupload, n, actions):
    torch.manual_seed(n * 10 + actions)
    # complex128: d log p / d theta = (dp / d theta) / p magnifies float32 rounding past 1e-5
    module = VQC(n, actions, n_qubits=n, layers=2, ansatz=ansatz, reupload=reupload, output="born",
                 scaling="trainable", dtype="complex128")
    assert_parity(module, torch.randn(4, n))


@pytest.mark.parametrize("output, n", [("born", 6), ("softmax", 6), ("born", 9), ("softmax", 9)])
def test_policies_on_the_adjoint_path_match_pennylane(output, n):
    """From 5 qubits training takes the adjoint state-vector path (above 10 every call does): the
    policies' readouts ride on it unchanged."""
    torch.manual_seed(n)
    module = VQC(n, 3, n_qubits=n, layers=2, ansatz="rzryrz_ring", output=output, scaling="trainable",
                 dtype="complex128")
    assert module.path(4, grad=True) == "adjoint"
    assert_parity(module, torch.randn(4, n))


def test_born_dense_and_gate_paths_agree_with_the_analytic_gradient():
    torch.manual_seed(0)
    dense = VQC(4, 2, n_qubits=4, layers=3, ansatz="rzryrz_ring", output="born")
    gates = VQC(4, 2, n_qubits=4, layers=3, ansatz="rzryrz_ring", output="born", engine="gates")
    gates.load_state_dict(dense.state_dict())
    assert dense.use_dense and dense.analytic_grad and not gates.use_dense
    x = torch.randn(5, 4)
    a, b = dense(x), gates(x)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    ga = torch.autograd.grad(a.sum(), dense.weights)[0]
    gb = torch.autograd.grad(b.sum(), gates.weights)[0]
    torch.testing.assert_close(ga, gb, atol=1e-4, rtol=0)


def test_born_head_output_is_what_the_categorical_samples_and_scores():
    torch.manual_seed(3)
    module = VQC(3, 3, n_qubits=3, layers=2, ansatz="strongly_entangling", output="born", dtype="complex128")
    x = torch.randn(1, 3, dtype=torch.float64)
    with torch.no_grad():
        out = module(x)
    probs = torch.exp(out)[0]
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)  # the partition covers every bitstring once
    dist = Categorical(3)
    logp, entropy = dist.log_prob_entropy(out.float(), torch.tensor([0]))
    assert float(logp[0]) == pytest.approx(math.log(float(probs[0])), abs=1e-5)
    assert float(entropy[0]) == pytest.approx(float(-(probs * probs.log()).sum()), abs=1e-5)
    # sampling: 20000 Gumbel-max draws; each frequency within 5 standard errors of p
    rng = np.random.default_rng(0)
    draws = gumbel_max(np.repeat(out.numpy(), 20000, axis=0), rng)
    freq = np.bincount(draws, minlength=3) / 20000
    se = np.sqrt(probs.numpy() * (1 - probs.numpy()) / 20000)
    assert np.all(np.abs(freq - probs.numpy()) < 5 * se + 1e-12)


def test_born_clamp_keeps_an_impossible_action_finite():
    # one qubit's two bitstrings into two actions, RX(pi) on |0>: P(b = 0) = 0 exactly
    module = VQC(1, 2, n_qubits=1, layers=1, ansatz="basic_entangler", rotation="rx", output="born", dtype="complex128",
                 engine="gates")
    with torch.no_grad():
        module.weights.zero_()
        out = module(torch.tensor([[math.pi]], dtype=torch.float64))
    assert float(out[0, 0]) == pytest.approx(math.log(BORN_CLAMP)) and float(out[0, 1]) == pytest.approx(0.0, abs=1e-12)


def test_born_needs_a_bitstring_per_action():
    with pytest.raises(CircuitConfigError, match="output: 'born' partitions the 4 bitstrings"):
        VQC(2, 5, n_qubits=2, output="born")


def test_softmax_is_beta_times_weighted_observables_by_hand():
    torch.manual_seed(1)
    raw = VQC(4, 4, n_qubits=4, layers=2, observable="z", output="raw", dtype="complex128")
    soft = VQC(4, 2, n_qubits=4, layers=2, observable="z", output="softmax", dtype="complex128")
    # the start: beta = 1 and the sum grouping, readout i into action i mod 2
    assert float(soft.beta) == 1.0 and soft.observable_weights.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    with torch.no_grad():
        soft.weights.copy_(raw.weights)
        soft.beta.fill_(0.37)
        soft.observable_weights.copy_(torch.randn(2, 4, dtype=torch.float64))
    x = torch.randn(3, 4, dtype=torch.float64)
    readouts = raw(x)  # all four <Z_i>
    torch.testing.assert_close(soft(x), 0.37 * readouts @ soft.observable_weights.T)
    # pi(a|s) = exp(beta <O_a>) / sum_b exp(beta <O_b>)
    pi = torch.softmax(soft(x), dim=-1)
    o = readouts @ soft.observable_weights.T
    torch.testing.assert_close(pi, torch.exp(0.37 * o) / torch.exp(0.37 * o).sum(-1, keepdim=True))


@pytest.mark.parametrize("observable, reupload", [("z", False), ("zz", True), ("p0", False)])
def test_softmax_matches_pennylane_with_every_gradient(observable, reupload):
    torch.manual_seed(2)
    module = VQC(3, 2, n_qubits=3, layers=2, observable=observable, output="softmax", reupload=reupload,
                 scaling="trainable")
    with torch.no_grad():
        module.observable_weights.add_(0.3 * torch.randn_like(module.observable_weights))
    assert_parity(module, torch.randn(4, 3))
    grads = torch.autograd.grad(module(torch.randn(4, 3)).pow(2).sum(), [module.beta, module.observable_weights])
    assert all(float(g.abs().max()) > 0 for g in grads)  # both are trained


def test_scaled_output_has_one_trainable_scale_per_observable():
    # Skolik et al.: output a = w_a <O_a>, one weight per output's observable
    torch.manual_seed(4)
    raw = VQC(4, 2, n_qubits=4, layers=2, output="raw", scaling="trainable", reupload=True)
    scaled = VQC(4, 2, n_qubits=4, layers=2, output="scaled", scaling="trainable", reupload=True)
    scaled.load_state_dict(raw.state_dict(), strict=False)
    assert scaled.output_scale.shape == (2,) and scaled.input_scale.shape == (2, 4)  # per block, per feature
    with torch.no_grad():
        scaled.output_scale.copy_(torch.tensor([2.5, -0.5]))
    x = torch.randn(3, 4)
    torch.testing.assert_close(scaled(x), raw(x) * torch.tensor([2.5, -0.5]))
