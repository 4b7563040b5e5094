"""marlq plateau: the adjoint gradients against PennyLane, the variance at n = 2 against a brute-force
PennyLane computation over the same initialisations, the decay fit on synthetic data, bad arguments."""
from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest
import torch

from analysis.plateau import cost_gradients, fit_decay, gradient_variance, initialisations, main, noisy_gradients
from circuits.blocks import ANSATZE, LayerOptions

import pennylane as qml


def pennylane_cost(ansatz: str, n: int, layers: int, observable: str):
    options = LayerOptions("rx", "cnot")  # the spec's defaults, as the tool uses

    @qml.qnode(qml.device("default.qubit", wires=n), interface="torch", diff_method="backprop")
    def cost(weights, x):
        for wire in range(n):
            qml.RX(x[wire], wires=wire)
        for layer in range(layers):
            ANSATZE[ansatz].pennylane_layer(qml, weights, layer, list(range(n)), options)
        op = qml.PauliZ(0)
        if observable == "global":
            for wire in range(1, n):
                op = op @ qml.PauliZ(wire)
        return qml.expval(op)

    return cost


def pennylane_gradients(ansatz, n, layers, observable, weights, inputs):
    cost = pennylane_cost(ansatz, n, layers, observable)
    values, grads = [], []
    for w, x in zip(weights, inputs):
        w = torch.tensor(w, requires_grad=True)
        value = cost(w, torch.tensor(x))
        value.backward()
        values.append(float(value))
        grads.append(w.grad.numpy())
    return np.array(values), np.stack(grads)


@pytest.mark.parametrize("ansatz, observable, n", list(itertools.product(ANSATZE, ["global", "local"], [2, 3])))
def test_adjoint_gradients_match_pennylane(ansatz, observable, n):
    weights, inputs = initialisations(ansatz, n, 3, observable, 3, seed=7)
    f, grad = cost_gradients(ansatz, "angle_x", torch.from_numpy(weights), torch.from_numpy(inputs), observable)
    want_f, want_grad = pennylane_gradients(ansatz, n, 3, observable, weights, inputs)
    np.testing.assert_allclose(f.numpy(), want_f, atol=1e-10)
    np.testing.assert_allclose(grad.numpy(), want_grad, atol=1e-10)
    assert np.abs(want_grad).max() > 1e-3


@pytest.mark.parametrize("observable", ["global", "local"])
def test_variance_at_two_qubits_matches_brute_force_pennylane(observable):
    ansatz, layers, samples = "strongly_entangling", 2, 40
    got = gradient_variance(ansatz, "angle_x", 2, layers, observable, samples, seed=3, dtype=torch.complex128)
    weights, inputs = initialisations(ansatz, 2, layers, observable, samples, seed=3)
    _, grads = pennylane_gradients(ansatz, 2, layers, observable, weights, inputs)
    per_weight = grads.var(axis=0, ddof=1)
    assert got["pooled"] == pytest.approx(per_weight.mean(), rel=1e-9)
    assert got["middle"] == pytest.approx(per_weight[1, 0, 0], rel=1e-9)


@pytest.mark.parametrize("ansatz, observable", [("strongly_entangling", "global"), ("ry_cz", "local"),
                                               ("rzryrz_ring", "global")])
def test_noisy_gradients_match_pennylane_default_mixed(ansatz, observable):
    """Depolarizing p after every gate on every wire it touches (PennyLane's noise.insert, position all)."""
    n, layers, p = 3, 2, 0.05
    weights, inputs = initialisations(ansatz, n, layers, observable, 2, seed=5)
    got = noisy_gradients(ansatz, "angle_x", weights, inputs, observable, p, dtype=torch.complex128)
    options = LayerOptions("rx", "cnot")

    def gates(w, x):
        for wire in range(n):
            qml.RX(x[wire], wires=wire)
        for layer in range(layers):
            ANSATZE[ansatz].pennylane_layer(qml, w, layer, list(range(n)), options)

    noisy_gates = qml.noise.insert(gates, lambda wires: qml.DepolarizingChannel(p, wires=wires), [], position="all")

    def circuit(w, x):
        noisy_gates(w, x)
        op = qml.PauliZ(0)
        if observable == "global":
            for wire in range(1, n):
                op = op @ qml.PauliZ(wire)
        return qml.expval(op)

    cost = qml.QNode(circuit, qml.device("default.mixed", wires=n), interface="torch", diff_method="backprop")
    for i in range(2):
        w = torch.tensor(weights[i], requires_grad=True)
        cost(w, torch.tensor(inputs[i])).backward()
        np.testing.assert_allclose(got[i], w.grad.numpy(), atol=1e-6)  # the project's 1e-5 parity bound, with room
    clean = cost_gradients(ansatz, "angle_x", torch.from_numpy(weights), torch.from_numpy(inputs), observable,
                           torch.complex128)[1].numpy()
    assert np.abs(got - clean).max() > 1e-3  # the noise changed them


def test_noise_shrinks_the_gradient_variance_on_the_same_initialisations():
    clean = gradient_variance("ry_cz", "angle_x", 3, 3, "global", 16, seed=0, dtype=torch.complex128)
    noisy = gradient_variance("ry_cz", "angle_x", 3, 3, "global", 16, seed=0, dtype=torch.complex128, depolarizing=0.1)
    assert noisy["pooled"] < 0.8 * clean["pooled"]


def test_one_qubit_rotation_variance_by_hand():
    # n = 2, one layer of RY on each wire (ry_cz; the CZ is diagonal and leaves <Z_0> alone), input RX(x0):
    # <Z_0> = cos(x0) cos(theta0), d/dtheta0 = -cos(x0) sin(theta0); over x0 ~ U[-pi, pi) and
    # theta0 ~ U[0, 2 pi) the variance is E[cos^2] E[sin^2] = 1/4 (the mean is 0). 4000 samples: the
    # sample variance's standard error is about 0.0035; 5 standard errors allowed.
    got = gradient_variance("ry_cz", "angle_x", 2, 1, "local", 4000, seed=0, dtype=torch.complex128)
    assert got["middle"] == pytest.approx(0.25, abs=0.018)


def test_fit_decay_recovers_a_synthetic_exponential():
    n = np.arange(2, 15)
    rate, prefactor = fit_decay(n, 3.0 * np.exp(-0.7 * n))
    assert rate == pytest.approx(0.7, abs=1e-12) and prefactor == pytest.approx(3.0, rel=1e-12)
    noisy = 0.5 * np.exp(-0.4 * n) * np.exp(np.random.default_rng(0).normal(0, 0.05, n.size))
    assert fit_decay(n, noisy)[0] == pytest.approx(0.4, abs=0.02)


def test_the_command_writes_the_figure_and_the_points(tmp_path, capsys):
    out = tmp_path / "p.png"
    assert main(["--qubits", "2-3", "--depths", "n,1", "--samples", "6", "--out", str(out)]) == 0
    assert out.is_file() and out.stat().st_size > 0
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2  # 2 observables x 2 depths x 2 qubit counts
    assert {(r["observable"], r["depth"], r["n_qubits"], r["layers"]) for r in rows} >= {("global", "n", "3", "3"), ("local", "1", "2", "1")}
    printed = capsys.readouterr().out
    assert printed.count("fit ") == 4 and "per qubit" in printed


@pytest.mark.parametrize("argv, needle", [
    (["--qubits", "1-3"], "--qubits: every qubit count must be at least 2"),
    (["--qubits", "two"], "--qubits: expected a range like 2-14"),
    (["--depths", "deep"], "--depths: each depth is n"),
    (["--observables", "nonlocal"], "--observables: unknown observable 'nonlocal'"),
    (["--ansatz", "nope"], "--ansatz: unknown ansatz 'nope'"),
    (["--samples", "1"], "--samples: at least 2"),
    (["--noise", "1.5"], "--noise: a probability must lie in [0, 1], got 1.5"),
    (["--noise", "lots"], "--noise: expected comma-separated probabilities"),
    (["--noise", "0.01", "--qubits", "2-12"], "--noise: the density-matrix path goes up to 10 qubits"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, needle):
    assert main(argv + ["--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
