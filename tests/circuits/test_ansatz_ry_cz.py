"""The worked example of docs/circuits.md: the ``ry_cz`` ansatz (circuits/ansatze/ry_cz.py) against
PennyLane. (The registered grid of test_parity.py covers it too, as every registered ansatz.)"""
from __future__ import annotations

import itertools

import numpy as np
import pennylane as qml
import pytest
import torch

from circuits import VQC
from circuits.blocks import ANSATZE, Ansatz, LayerOptions
from circuits.spec import make_config
from tests.circuits.test_gates import circuit_unitary, matrix_of_ops
from tests.circuits.test_parity import DEVICE, assert_parity

torch.set_num_threads(1)


def test_registered_and_listed():
    from marl_q.registry import load_plugins
    from marl_q.registry import ANSATZE as LISTED

    load_plugins()
    assert "ry_cz" in ANSATZE and "ry_cz" in LISTED.names()
    assert make_config(ansatz="ry_cz").ansatz == "ry_cz"


def test_the_config_loader_accepts_it(tmp_path):
    from marl_q import config

    path = tmp_path / "ry_cz.yaml"
    path.write_text("run: {total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a2c}\n"
                    "actor: {head: vqc, ansatz: ry_cz}\ncritic: {head: hybrid, ansatz: ry_cz}\n")
    loaded = config.load_config(path)
    assert loaded.actor.ansatz == "ry_cz" and loaded.critic.ansatz == "ry_cz"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_unitary_matches_hand_listed_gates(n):
    layers = 2
    weights = np.random.default_rng(n).uniform(-3, 3, size=(layers, n, 1))
    ops = []
    for layer in range(layers):
        ops += [qml.RY(weights[layer, q, 0], wires=q) for q in range(n)]
        ops += [qml.CZ(wires=[q, q + 1]) for q in range(n - 1)]
    cfg = make_config(n_qubits=n, layers=layers, ansatz="ry_cz")
    np.testing.assert_allclose(circuit_unitary(cfg, torch.tensor(weights)), matrix_of_ops(ops, n), atol=1e-10)


@pytest.mark.parametrize("engine, reupload, dtype", [("dense", False, "complex64"), ("gates", False, "complex64"),
                                                     ("auto", True, "complex64"), ("dense", False, "complex128")])
@pytest.mark.parametrize("encoding, observable", list(itertools.product(["angle_x", "angle_y"], ["z", "zz", "p0"])))
def test_parity_with_pennylane(engine, reupload, dtype, encoding, observable):
    """Outputs and every parameter's gradient equal the PennyLane QNode's to 1e-5, on both engine paths."""
    torch.manual_seed(5)
    module = VQC(4, 2, n_qubits=4, layers=3, ansatz="ry_cz", encoding=encoding, observable=observable,
                 engine=engine, reupload=reupload, dtype=dtype, device=DEVICE)
    assert_parity(module, torch.randn(5, 4, device=DEVICE))


def test_numpy_matrices_default_to_the_torch_ones():
    """Leaving ``matrices_np`` out is allowed: the torch matrices in complex128 stand in for it."""
    ry_cz = ANSATZE["ry_cz"]
    fallback = Ansatz(name="ry_cz_fallback", help="", weights_per_qubit=1, matrices=ry_cz.matrices,
                      pairs=ry_cz.pairs, pennylane_layer=ry_cz.pennylane_layer)
    weights = np.random.default_rng(0).uniform(-3, 3, size=(2, 3, 4, 1))
    options = LayerOptions("rx", None)
    np.testing.assert_allclose(fallback.matrices_np(weights, options), ry_cz.matrices_np(weights, options), atol=1e-12)
