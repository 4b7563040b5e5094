"""The noisy density-matrix path (circuits/density.py) against PennyLane default.mixed, and its
channels against hand-computed single-qubit cases.

Parity: every channel (and all of them at once) x every registered ansatz at n in {2, 4}: outputs
and every parameter's gradient agree with the QNode ``to_qnode("default.mixed")`` builds (noise
inserted by PennyLane's own ``qml.noise.insert``) to 1e-5, as test_parity does for the exact path.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from circuits import VQC
from circuits.density import channel_superoperator, flip_readout, kraus_operators, noise_superoperator
from circuits.spec import ANSATZE, NoiseConfig
from tests.circuits.test_parity import assert_parity

torch.set_num_threads(1)

CHANNELS = {
    "depolarizing": {"depolarizing": 0.05},
    "amplitude_damping": {"amplitude_damping": 0.1},
    "phase_damping": {"phase_damping": 0.15},
    "readout": {"readout": 0.04},
    "all": {"depolarizing": 0.02, "amplitude_damping": 0.05, "phase_damping": 0.03, "readout": 0.04},
}


@pytest.mark.parametrize("channel, ansatz, n", list(itertools.product(CHANNELS, ANSATZE, [2, 4])))
def test_noisy_parity_with_default_mixed(channel, ansatz, n, param_seed):
    torch.manual_seed(param_seed)
    module = VQC(n, 2, n_qubits=n, layers=2, ansatz=ansatz, observable="z", noise=CHANNELS[channel])
    assert (module.hardware.density is not None) == (channel != "readout")
    assert_parity(module, torch.randn(3, n), device="default.mixed")


@pytest.mark.parametrize("encoding, hadamard, observable", [("angle_y", True, "p0"), ("angle_x", False, "zz"), ("angle_z", True, "z")])
def test_noisy_parity_with_reuploading_and_trainable_pieces(encoding, hadamard, observable):
    """Re-uploading (noise after every encoding block), Hadamards, trainable input scaling and a
    linear post-layer: all parameters' gradients through the density path."""
    torch.manual_seed(5)
    module = VQC(3, 2, n_qubits=3, layers=3, encoding=encoding, hadamard=hadamard, ansatz="rzryrz_ring",
                 observable=observable, reupload=True, scaling="trainable", output="linear",
                 noise=CHANNELS["all"])
    assert_parity(module, torch.randn(4, 3), device="default.mixed")


def test_noise_free_density_path_equals_the_state_vector_engine():
    """With every channel at 0 the density path is the exact circuit: equal to the dense engine."""
    torch.manual_seed(6)
    noisy = VQC(4, 2, n_qubits=4, layers=2, ansatz="strongly_entangling", noise={"depolarizing": 1e-12}, dtype="complex128")
    exact = VQC(4, 2, n_qubits=4, layers=2, ansatz="strongly_entangling", dtype="complex128")
    exact.load_state_dict(noisy.state_dict())
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(noisy(x), exact(x), atol=1e-10, rtol=0)


def test_depolarizing_superoperator_by_hand():
    """D(rho) = (1 - 4p/3) rho + (4p/3) I/2 on every single-qubit rho."""
    p = 0.3
    superop = channel_superoperator(kraus_operators(NoiseConfig(depolarizing=p))[0])
    rho = np.array([[0.7, 0.2 - 0.1j], [0.2 + 0.1j, 0.3]])
    got = (superop @ rho.reshape(-1)).reshape(2, 2)
    want = (1 - 4 * p / 3) * rho + (4 * p / 3) * np.eye(2) / 2
    np.testing.assert_allclose(got, want, atol=1e-14)


def test_damping_superoperators_by_hand():
    """Amplitude damping: |1><1| -> g|0><0| + (1-g)|1><1|, coherences times sqrt(1-g); phase damping
    keeps the populations and multiplies the coherences by sqrt(1-g); composed in that order."""
    g, h = 0.2, 0.5
    rho = np.array([[0.25, 0.4], [0.4, 0.75]], dtype=np.complex128)
    superop = noise_superoperator(NoiseConfig(amplitude_damping=g, phase_damping=h))
    got = (superop @ rho.reshape(-1)).reshape(2, 2)
    coherence = 0.4 * math.sqrt(1 - g) * math.sqrt(1 - h)
    want = np.array([[0.25 + g * 0.75, coherence], [coherence, (1 - g) * 0.75]])
    np.testing.assert_allclose(got, want, atol=1e-14)


def test_readout_flip_by_hand():
    """Two bits flipped independently with p: P(00) = (1-p)^2 P00 + p(1-p)(P01 + P10) + p^2 P11."""
    p = 0.1
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    got = flip_readout(probs, p, 2)[0]
    q = 1 - p
    want = torch.tensor([q * q * 0.1 + p * q * (0.2 + 0.3) + p * p * 0.4,
                         q * q * 0.2 + p * q * (0.1 + 0.4) + p * p * 0.3,
                         q * q * 0.3 + p * q * (0.1 + 0.4) + p * p * 0.2,
                         q * q * 0.4 + p * q * (0.2 + 0.3) + p * p * 0.1], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-15, rtol=0)


def test_readout_error_alone_runs_on_every_engine_path():
    """Readout error is classical: the dense and gate state-vector paths take it, and agree."""
    torch.manual_seed(7)
    dense = VQC(3, 3, n_qubits=3, layers=2, engine="dense", noise={"readout": 0.1}, dtype="complex128")
    gates = VQC(3, 3, n_qubits=3, layers=2, engine="gates", noise={"readout": 0.1}, dtype="complex128")
    gates.load_state_dict(dense.state_dict())
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(dense(x), gates(x), atol=1e-12, rtol=0)
    assert_parity(gates, torch.randn(3, 3), device="default.mixed")


def test_a_head_pickled_with_the_old_density_path_resumes_on_the_current_one():
    """A sim snapshot from before the Pauli-transfer density path (its DensityCircuit has none of the
    new buffers) unpickles with the path rebuilt for its spec, and computes what a fresh head does."""
    import pickle

    torch.manual_seed(8)
    head = VQC(4, 2, n_qubits=4, layers=2, noise={"depolarizing": 0.02, "amplitude_damping": 0.01})
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = head(x)
    old = head.hardware.density
    for name in ("noise_ptm", "z_strings", "walsh", "start"):
        old._buffers.pop(name, None)
    del old.__dict__["diagonal_noise"]
    from marl_q.state_format import upgrade

    again = upgrade({"head": pickle.loads(pickle.dumps(head))}, 0)["head"]  # a version-0 snapshot's migration
    assert again.hardware.density is not old and hasattr(again.hardware.density, "diagonal_noise")
    with torch.no_grad():
        torch.testing.assert_close(again(x), want, atol=1e-6, rtol=0)
