"""The dense path's analytic weight gradient (CompiledCircuit.dense_with_gradient / DenseGradient) against
autograd through every gate (dense_grad: autograd) and against PennyLane (to_qnode, default.qubit).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from circuits import VQC
from circuits.engine import CompiledCircuit
from circuits.spec import CircuitConfigError, make_config

torch.set_num_threads(1)

STRUCTURES = [  # ansatz, rotation, entangler, encoding, hadamard
    ("rzryrz_ring", "rx", "cnot", "angle_x", False),
    ("strongly_entangling", "rx", "cnot", "angle_y", True),
    ("basic_entangler", "ry", "cz", "angle_z", True),
    ("basic_entangler", "rx", "cnot", "angle_x", False),
]


@pytest.mark.parametrize("structure, n, layers", list(itertools.product(STRUCTURES, [1, 2, 3, 5], [1, 3])))
def test_dense_matrix_and_weight_gradient_match_autograd(structure, n, layers):
    ansatz, rotation, entangler, encoding, hadamard = structure
    torch.manual_seed(n * 10 + layers)
    spec = dict(n_qubits=n, layers=layers, ansatz=ansatz, rotation=rotation, entangler=entangler, encoding=encoding,
                hadamard=hadamard, dtype="complex128", observable="z", output="linear", scaling="trainable")
    analytic, reference = VQC(n, 2, dense_grad="analytic", **spec), VQC(n, 2, dense_grad="autograd", **spec)
    reference.load_state_dict(analytic.state_dict())
    assert analytic.analytic_grad and not reference.analytic_grad
    # the matrix itself, built in numpy, against the torch build
    dense, _ = analytic.circuit.dense_with_gradient(analytic.weights)
    torch.testing.assert_close(dense, analytic.circuit.dense_matrix(analytic.weights.detach()), atol=1e-12, rtol=0)
    x = torch.randn(4, n, dtype=torch.float64) * 2
    got, want = analytic(x), reference(x)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    coefficients = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * coefficients).sum(), list(analytic.parameters()))
    want_grads = torch.autograd.grad((want * coefficients).sum(), list(reference.parameters()))
    for (name, _), g, w in zip(analytic.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0, msg=lambda m: f"{name}: {m}")
    assert float(got_grads[[k for k, _ in analytic.named_parameters()].index("weights")].abs().max()) > 1e-3


@pytest.mark.parametrize("batch", [1, 2, 64])
def test_koelle_hybrid_head_complex64_matches_autograd_and_pennylane(batch):
    torch.manual_seed(batch)
    spec = dict(n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="relu_linear",
                scaling="bound", bounds=[4.8, None, 0.418, None])
    analytic, reference = VQC(4, 2, **spec), VQC(4, 2, dense_grad="autograd", **spec)
    reference.load_state_dict(analytic.state_dict())
    assert analytic.analytic_grad
    x = torch.randn(batch, 4) * torch.tensor([2.4, 2.0, 0.2, 2.0])
    qnode = analytic.to_qnode("default.qubit", diff_method="backprop")
    outputs = {"analytic": analytic(x), "autograd": reference(x), "pennylane": qnode(x)}
    coefficients = torch.randn(batch, 2)
    grads = {}
    for name, out in outputs.items():
        module = reference if name == "autograd" else analytic
        grads[name] = torch.autograd.grad((out.to(coefficients.dtype) * coefficients).sum(), module.weights)[0]
    for name in ("autograd", "pennylane"):
        torch.testing.assert_close(outputs["analytic"].double(), outputs[name].double(), atol=1e-5, rtol=0)
        torch.testing.assert_close(grads["analytic"].double(), grads[name].double(), atol=1e-5, rtol=0)
    assert float(grads["analytic"].abs().max()) > 1e-4


def test_act_then_update_builds_once_and_rebuilds_after_the_weights_change():
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="relu_linear")
    x = torch.randn(1, 4)
    calls = []
    build = module.circuit.dense_with_gradient
    module.circuit.dense_with_gradient = lambda w: calls.append(1) or build(w)
    with torch.no_grad():
        acted = module(x)  # a rollout step builds the matrix and its adjoint
    out = module(x)  # the update's forward at the same weights reuses both
    assert len(calls) == 1
    assert torch.equal(out.detach(), acted)
    out.sum().backward()
    assert module.weights.grad is not None and float(module.weights.grad.abs().max()) > 0
    with torch.no_grad():
        module.weights.add_(0.1)
        module(x)
    assert len(calls) == 2


def test_analytic_path_only_where_it_applies():
    assert VQC(4, 2, n_qubits=4).analytic_grad
    assert not VQC(4, 2, n_qubits=4, dense_grad="autograd").analytic_grad
    assert not VQC(4, 2, n_qubits=4, reupload=True).analytic_grad  # gate path
    assert not VQC(9, 2, n_qubits=9, layers=1).analytic_grad  # too large to keep n + 2 matrices per layer
    with pytest.raises(CircuitConfigError, match="dense_grad"):
        make_config(dense_grad="finite_differences")


def test_adjoint_contraction_equals_the_explicit_jacobian():
    # the contraction in DenseGradient.weight_grad against d dense / d w by central differences
    cfg = make_config(n_qubits=3, layers=2, ansatz="strongly_entangling", dtype="complex128")
    circuit = CompiledCircuit(cfg, torch.complex128)
    rng = np.random.default_rng(0)
    weights = torch.from_numpy(rng.uniform(-np.pi, np.pi, (2, 3, 3)))
    _, adjoint = circuit.dense_with_gradient(weights)
    r, g = rng.normal(size=(2, 8)), rng.normal(size=(2, 16))
    got = adjoint.weight_grad(r, g)
    want = np.zeros(weights.numel())
    eps = 1e-6
    for p in range(weights.numel()):
        step = torch.zeros(weights.numel(), dtype=torch.float64)
        step[p] = eps
        plus = circuit.dense_matrix(weights + step.view_as(weights)).numpy()
        minus = circuit.dense_matrix(weights - step.view_as(weights)).numpy()
        want[p] = float(np.sum((r @ (plus - minus) / (2 * eps)) * g))
    np.testing.assert_allclose(got.reshape(-1), want, atol=1e-7)


def test_large_batches_take_autograd_and_agree():
    from circuits.vqc import ANALYTIC_MAX_BATCH

    torch.manual_seed(5)
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="relu_linear")
    calls = []
    build = module.circuit.dense_with_gradient
    module.circuit.dense_with_gradient = lambda w: calls.append(1) or build(w)
    x = torch.randn(ANALYTIC_MAX_BATCH + 1, 4)
    big = torch.autograd.grad(module(x).sum(), module.weights)[0]
    assert calls == []  # the large batch never built the analytic pieces
    small = sum(torch.autograd.grad(module(part).sum(), module.weights)[0] for part in x.split(ANALYTIC_MAX_BATCH))
    assert calls == [1]
    torch.testing.assert_close(big, small, atol=1e-5, rtol=1e-5)


def test_an_acting_only_copy_skips_the_gradient_build_and_acts_the_same(monkeypatch):
    from circuits.vqc import mark_acting_only

    torch.manual_seed(3)
    full = VQC(6, 3, n_qubits=4, layers=2, preprocess="linear", output="linear")
    acting = VQC(6, 3, n_qubits=4, layers=2, preprocess="linear", output="linear")
    acting.load_state_dict(full.state_dict())
    assert mark_acting_only(torch.nn.Sequential(acting)) == 1 and full.analytic_grad
    x = torch.randn(5, 6)
    with torch.no_grad():
        expected = full(x)  # builds the matrix through dense_with_gradient
        monkeypatch.setattr(acting.circuit, "dense_with_gradient", lambda w: pytest.fail("acting copy built the adjoint"))
        got = acting(x)
    assert torch.allclose(got, expected, atol=1e-5)
    # the unmarked module still serves its no-grad call from the adjoint build (an A2C step reuses it)
    assert full._dense_cache is not None and full._dense_cache[2] is not None
