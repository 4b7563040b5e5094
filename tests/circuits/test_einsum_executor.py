"""The worked example of adding an executor (docs/circuits.md, "Adding an executor"): ``engine: einsum``
against the head's own PennyLane QNode (default.qubit), outputs to the parity tests' 1e-5, on every
registered encoding x ansatz x observable, with and without a Hadamard; and what its planner row says."""
from __future__ import annotations

import itertools

import pytest
import torch

from circuits import VQC
from circuits.blocks import CircuitConfigError
from circuits.planner import Plan
from circuits.spec import ANSATZE, ENCODINGS, OBSERVABLES

TOLERANCE = 1e-5


@pytest.mark.parametrize("encoding, ansatz, observable, n, hadamard",
                         list(itertools.product(ENCODINGS, ANSATZE, OBSERVABLES, [2, 5], [False, True])))
def test_einsum_executor_matches_pennylane(encoding, ansatz, observable, n, hadamard, param_seed):
    torch.manual_seed(param_seed)
    module = VQC(n, 3, n_qubits=n, layers=2, encoding=encoding, ansatz=ansatz, observable=observable,
                 hadamard=hadamard, scaling="atan", output="linear", dtype="complex128", engine="einsum")
    x = torch.randn(4, n, dtype=torch.float64) * 2
    assert module.plan(4, False) == Plan("einsum", "none")
    reference = module.to_qnode("default.qubit", diff_method="backprop")
    with torch.no_grad():
        got, want = module(x), reference(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


def test_einsum_executor_agrees_with_the_statevector_executor_and_refuses_a_gradient():
    torch.manual_seed(1)
    einsum = VQC(6, 2, n_qubits=6, layers=3, ansatz="rzryrz_ring", observable="p0", engine="einsum")
    statevector = VQC(6, 2, n_qubits=6, layers=3, ansatz="rzryrz_ring", observable="p0", engine="statevector")
    statevector.load_state_dict(einsum.state_dict())
    x = torch.randn(7, 6)
    with torch.no_grad():
        torch.testing.assert_close(einsum(x), statevector(x), atol=1e-6, rtol=0)
    with pytest.raises(CircuitConfigError, match="einsum.*no backward"):
        einsum(x).sum().backward()
