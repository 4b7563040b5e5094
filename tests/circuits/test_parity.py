"""Native engine vs its own PennyLane QNode (default.qubit, backprop): outputs and parameter gradients.

The full grid of registered encodings x ansaetze x reupload x observables at n in {2, 4, 6} runs
with one QNode per combination and a batch of 3. The options that do not change the circuit's
structure family (hadamard, rotation, entangler, scaling, output, preprocess, dtype, engine path)
are covered by smaller grids below rather than multiplied into the main one, to keep the suite fast.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from circuits import VQC, gates
from circuits.planner import Plan
from circuits.spec import ANSATZE, ENCODINGS, OBSERVABLES

torch.set_num_threads(1)
TOLERANCE = 1e-5
# circuits/gpu_check.py runs this file with MARLQ_TEST_DEVICE=cuda on a GPU machine.
DEVICE = os.environ.get("MARLQ_TEST_DEVICE", "cpu")


def assert_parity(module: VQC, x: torch.Tensor, device: str = "default.qubit", nonzero_grad: bool = True) -> None:
    """Outputs and gradients of every parameter agree between the native engine and to_qnode()."""
    reference = module.to_qnode(device, diff_method="backprop")
    params = [p for p in module.parameters()]
    native = module(x)
    expected = reference(x)
    assert native.shape == expected.shape == (x.shape[0], module.out_dim)
    torch.testing.assert_close(native.double(), expected.double(), atol=TOLERANCE, rtol=0)
    coefficients = torch.randn(native.shape, dtype=native.dtype, device=native.device)
    native_grads = torch.autograd.grad((native * coefficients).sum(), params)
    expected_grads = torch.autograd.grad((expected * coefficients.to(expected.dtype)).sum(), params)
    for name_param, got, want in zip(module.named_parameters(), native_grads, expected_grads):
        torch.testing.assert_close(got.double(), want.double(), atol=TOLERANCE, rtol=0, msg=lambda m: f"{name_param[0]}: {m}")
    if nonzero_grad:  # guards against comparing two zero gradients
        assert float(native_grads[list(dict(module.named_parameters())).index("weights")].abs().max()) > 1e-4


GRID = list(itertools.product(ENCODINGS, ANSATZE, [False, True], OBSERVABLES, [2, 4, 6]))


@pytest.mark.parametrize("encoding, ansatz, reupload, observable, n", GRID)
def test_parity_registered_grid(encoding, ansatz, reupload, observable, n, param_seed):
    torch.manual_seed(param_seed)
    module = VQC(n, 1 if observable == "zz" and n == 2 else 2, n_qubits=n, layers=2, encoding=encoding,
                 ansatz=ansatz, reupload=reupload, observable=observable, device=DEVICE)
    assert_parity(module, torch.randn(3, n, device=DEVICE))


@pytest.mark.parametrize("encoding, hadamard, rotation, entangler",
                         list(itertools.product(ENCODINGS, [False, True], ["rx", "ry", "rz"], ["cnot", "cz"])))
def test_parity_encoding_and_block_options(encoding, hadamard, rotation, entangler):
    torch.manual_seed(1)
    module = VQC(3, 3, n_qubits=3, layers=2, encoding=encoding, hadamard=hadamard, ansatz="basic_entangler",
                 rotation=rotation, entangler=entangler, reupload=hadamard, device=DEVICE)
    # Some of these (the DiffQAS pool) are degenerate by physics, e.g. RZ blocks with CZ leave
    # every Z-basis probability unchanged, so zero gradients are allowed here; the values still match.
    assert_parity(module, torch.randn(3, 3, device=DEVICE), nonzero_grad=False)


@pytest.mark.parametrize("scaling, output, preprocess, reupload",
                         [("none", "raw", "none", False), ("atan", "sum", "none", False), ("trainable", "scaled", "none", True),
                          ("trainable", "linear", "linear", False), ("atan", "relu_linear", "linear", True),
                          ("bound", "relu_linear", "none", False), ("bound", "sum", "none", True)])
def test_parity_classical_pieces(scaling, output, preprocess, reupload):
    torch.manual_seed(2)
    in_dim = 6 if preprocess == "linear" else 3
    bounds = [4.8, None, 0.418] if scaling == "bound" else []
    module = VQC(in_dim, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", scaling=scaling,
                 bounds=bounds, output=output, preprocess=preprocess, reupload=reupload, device=DEVICE)
    assert_parity(module, torch.randn(4, in_dim, device=DEVICE) * 2)


@pytest.mark.parametrize("engine", ["dense", "gates"])
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_parity_engine_paths_and_dtypes(engine, dtype):
    torch.manual_seed(3)
    module = VQC(5, 2, n_qubits=5, layers=3, ansatz="strongly_entangling", encoding="angle_y", engine=engine, dtype=dtype,
                 device=DEVICE)
    assert module.use_dense == (engine == "dense")
    assert module.weights.dtype == (torch.float32 if dtype == "complex64" else torch.float64)
    assert_parity(module, torch.randn(3, 5, device=DEVICE))


def test_batch_of_one_matches_reference():
    torch.manual_seed(4)
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", device=DEVICE)
    assert_parity(module, torch.randn(1, 4, device=DEVICE))


@pytest.mark.parametrize("n, batch, preprocess, dense_from", [(8, 3, "none", None), (8, 65, "linear", None), (8, 64, "linear", 64),
                                                               (12, 3, "linear", None), (12, 70, "none", None)])
def test_parity_at_8_and_12_qubits_on_every_path_auto_takes(n, batch, preprocess, dense_from, monkeypatch):
    # n = 8: the adjoint state-vector path (small and RL-learner batches) and the dense matrix (large
    # batches, from planner.DENSE_MIN_BATCH rows: lowered here so that float32 sums over thousands of rows
    # stay inside the absolute tolerance); n = 12: the adjoint path. preprocess: linear also checks the
    # input-encoding gradient.
    import circuits.planner

    if dense_from is not None:
        monkeypatch.setattr(circuits.planner, "DENSE_MIN_BATCH", dense_from)
    torch.manual_seed(n + batch)
    in_dim = n + 2 if preprocess == "linear" else n
    module = VQC(in_dim, 2, n_qubits=n, layers=2, ansatz="rzryrz_ring", observable="p0", scaling="atan",
                 output="relu_linear", preprocess=preprocess, device=DEVICE)
    expected_path = "dense" if (n <= 8 and batch >= circuits.planner.DENSE_MIN_BATCH) else "adjoint"
    if DEVICE == "cpu":
        assert module.path(batch, True) == expected_path
    assert_parity(module, torch.randn(batch, in_dim, device=DEVICE) * 2)


@pytest.mark.parametrize("ansatz, encoding, hadamard", [("strongly_entangling", "angle_y", True), ("basic_entangler", "angle_z", False),
                                                        ("ry_cz", "angle_x", False)])
def test_parity_adjoint_path_other_blocks(ansatz, encoding, hadamard):
    # the adjoint path with entangling gates after the rotations, CZ signs, and a non-diagonal encoding map
    torch.manual_seed(7)
    module = VQC(6, 2, n_qubits=6, layers=2, ansatz=ansatz, encoding=encoding, hadamard=hadamard, scaling="atan",
                 preprocess="linear", output="linear", engine="gates", device=DEVICE)
    if DEVICE == "cpu":
        assert module.path(5, True) == "adjoint"
    assert_parity(module, torch.randn(5, 6, device=DEVICE))


def assert_matches_torch_autograd(module: VQC, x: torch.Tensor, tolerance: float) -> None:
    """The head's planned forward and backward against the torch_autograd executor (``forward_gates``,
    gate by gate with torch ops and autograd: no code shared with the numpy sweeps): outputs, every
    parameter's gradient, and the gradient in every encoding angle, (B, L, n) with trainable scaling
    and re-uploading, else (B, n) reused by every block."""
    params = list(module.parameters())
    angles = module.angles(x).detach().requires_grad_()
    coefficients = torch.randn(x.shape[0], module.out_dim, dtype=x.dtype, device=x.device)
    native = module(x)
    by_gates = module.head_output(module.circuit.forward_gates(module.angles(x), module.weights))
    torch.testing.assert_close(native, by_gates, atol=tolerance, rtol=0)
    for got, want in zip(torch.autograd.grad((native * coefficients).sum(), params),
                         torch.autograd.grad((by_gates * coefficients).sum(), params)):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    if x.device.type != "cpu":  # the numpy blocks are a CPU executor: a GPU run checks the planned forward above
        with pytest.raises(ValueError, match="numpy on the CPU"):
            module.circuit.forward_statevector(angles, module.weights)
        return
    native_angles = module.head_output(module.circuit.forward_statevector(angles, module.weights))
    gates_angles = module.head_output(module.circuit.forward_gates(angles, module.weights))
    got, = torch.autograd.grad((native_angles * coefficients).sum(), angles)
    want, = torch.autograd.grad((gates_angles * coefficients).sum(), angles)
    assert got.shape == angles.shape and float(want.abs().max()) > 1e-3
    torch.testing.assert_close(got, want, atol=tolerance, rtol=0)


REUPLOAD_GRID = [  # n, layers, ansatz, encoding, hadamard, scaling, dtype
    (1, 3, "rzryrz_ring", "angle_x", False, "trainable", "complex128"),
    (1, 2, "basic_entangler", "angle_y", True, "atan", "complex64"),  # (PennyLane has no 1-wire StronglyEntanglingLayers)
    (2, 3, "basic_entangler", "angle_z", True, "trainable", "complex64"),
    (2, 2, "ry_cz", "angle_x", False, "none", "complex128"),
    (4, 5, "rzryrz_ring", "angle_x", False, "trainable", "complex64"),  # Skolik et al.'s head
    (4, 5, "rzryrz_ring", "angle_x", False, "trainable", "complex128"),
    (4, 2, "strongly_entangling", "angle_y", True, "atan", "complex128"),
    (5, 3, "basic_entangler", "angle_x", True, "trainable", "complex128"),
    (5, 2, "ry_cz", "angle_z", True, "atan", "complex64"),
    (8, 2, "rzryrz_ring", "angle_y", False, "trainable", "complex64"),
    (8, 3, "strongly_entangling", "angle_x", False, "trainable", "complex128"),
]


@pytest.mark.parametrize("n, layers, ansatz, encoding, hadamard, scaling, dtype", REUPLOAD_GRID)
def test_reuploading_on_the_statevector_executor(n, layers, ansatz, encoding, hadamard, scaling, dtype):
    """Re-uploading heads on the CPU run the statevector executor's numpy blocks (each later encoding
    block applied per row to the state, the adjoint sweep un-applying it): outputs and the gradients of
    the weights, the input and output scales and every encoding angle against PennyLane and against the
    torch_autograd executor, at float32 and float64."""
    torch.manual_seed(n * 10 + layers)
    module = VQC(n, n, n_qubits=n, layers=layers, ansatz=ansatz, encoding=encoding, hadamard=hadamard,
                 scaling=scaling, reupload=True, output="scaled" if scaling == "trainable" else "raw",
                 observable="z", dtype=dtype, device=DEVICE)
    if module.input_scale is not None:  # away from the ones they start at: a scale per block and feature
        with torch.no_grad():
            module.input_scale.uniform_(0.5, 1.5)
            module.output_scale.uniform_(0.5, 2.0)
    if DEVICE == "cpu":
        assert module.plan(5, True) == Plan("statevector", "adjoint", "blocks")
        assert module.plan(1, False) == Plan("statevector", "none", "blocks")
    x = torch.randn(5, n, dtype=module.weights.dtype, device=DEVICE)
    assert_parity(module, x, nonzero_grad=n > 1 or ansatz != "ry_cz")
    assert_matches_torch_autograd(module, x, 1e-5 if dtype == "complex64" else 1e-10)


def test_expectation_gradients_of_a_reuploading_circuit_equal_torch_autograd():
    """The public gradient API outside a head (``circuits.gradients.expectation_gradients``) on a
    re-uploading circuit: the statevector blocks (the compiled kernels take no re-uploading), each row
    its own weights, against the torch_autograd executor of a head with those weights."""
    from circuits.gradients import expectation_gradients
    from circuits.spec import make_config

    torch.manual_seed(11)
    cfg = make_config(n_qubits=3, layers=3, ansatz="rzryrz_ring", reupload=True, observable="z", dtype="complex128")
    module = VQC(3, 3, config=cfg)
    weights = torch.rand((2,) + tuple(module.weights.shape), dtype=torch.float64) * 6.0
    angles = torch.rand(2, 3, dtype=torch.float64) * 3.0
    diagonal = np.prod(1.0 - 2.0 * gates.basis_bits(3), axis=1)  # Z x Z x Z
    values, grads = expectation_gradients(cfg, weights.numpy(), angles.numpy(), diagonal)
    readout = torch.from_numpy(diagonal)[:, None]
    for b in range(2):
        w = weights[b].clone().requires_grad_()
        f = (torch.view_as_real(module.circuit.final_state(angles[b : b + 1], w)).square().sum(-1) @ readout)[0, 0]
        grad, = torch.autograd.grad(f, w)
        assert abs(float(f) - values[b]) < 1e-12
        np.testing.assert_allclose(grads[b], grad.numpy(), atol=1e-12)


def test_the_mappo_actor_on_the_test_device_matches_pennylane():
    """The 8-qubit MAPPO actor (spread's 21 inputs -> 5 actions) at a learner's 1,200 rows on the test
    device, under engine auto (the pauli executor on the CPU, the dense matrix on CUDA, where pauli is
    refused): outputs and gradients against engine gates (torch_autograd) at every row, and against
    PennyLane on 4 rows."""
    torch.manual_seed(3)
    spec = dict(n_qubits=8, layers=2, preprocess="linear", output="linear", scaling="atan", device=DEVICE)
    module = VQC(21, 5, **spec)
    assert module.plan(1200, True).executor == ("pauli" if DEVICE == "cpu" else "dense")  # pauli is CPU-only
    by_gates = VQC(21, 5, engine="gates", **spec)
    by_gates.load_state_dict(module.state_dict())
    x = torch.randn(1200, 21, device=DEVICE) * 2
    coefficients = torch.randn(1200, 5, device=DEVICE)
    got, want = module(x), by_gates(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    got_grads = torch.autograd.grad((got * coefficients).sum(), list(module.parameters()))
    want_grads = torch.autograd.grad((want * coefficients).sum(), list(by_gates.parameters()))
    for (name, _), a, b in zip(module.named_parameters(), got_grads, want_grads):
        assert float(b.abs().max()) > 1e-3
        torch.testing.assert_close(a, b, atol=4e-5 * max(float(b.abs().max()), 1.0), rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert_parity(module, x[:4].clone())
