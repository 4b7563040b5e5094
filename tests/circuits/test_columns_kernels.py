"""The statevector executor's compiled kernels over a batch-last state (``columns``: circuits.kernels
``columns_forward`` / ``columns_weight_grad``) against independent references: the numpy blocks
(the same executor family's other variant), the per-row compiled kernels in complex128, and PennyLane's
default.qubit through the training twin that runs them (outputs and every parameter's gradient) and
the acting twin (outputs), in float32 (complex64 heads) and float64 (complex128)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from circuits import VQC, kernels
from circuits.planner import Facts, Plan, plan
from circuits.program import program_of
from circuits.twins import NumpyVQC, NumpyVQCActing

pytestmark = pytest.mark.skipif(os.environ.get("MARLQ_KERNELS") == "0",
                                reason="MARLQ_KERNELS=0 in the environment turns the compiled kernels off")
TOLERANCE = 1e-5


def _grads(module: VQC, twin: NumpyVQC, x: np.ndarray, coefficients: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], str]:
    """The twin's outputs, every parameter's gradient of sum(outputs * coefficients), and the variant it ran."""
    out, cache = twin.forward(x)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    twin.backward(cache, coefficients)
    return out, [p.grad.double().numpy().copy() for p in module.parameters()], cache.plan.variant


def _module(n: int, ansatz: str, dtype: str, seed: int, **spec) -> VQC:
    torch.manual_seed(seed)
    return VQC(n, 3, n_qubits=n, layers=2, ansatz=ansatz, output="relu_linear", scaling="atan", dtype=dtype, **spec)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("ansatz, rows", [("rzryrz_ring", 64), ("rzryrz_ring", 130), ("strongly_entangling", 37)])
def test_the_training_twin_on_the_columns_kernels_agrees_with_pennylane_and_the_blocks(ansatz, rows, dtype):
    """8 qubits (where the planner gives a twin's training calls of many rows to them): outputs and every
    parameter's gradient against the head's PennyLane QNode, and against the same twin pinned to the numpy
    blocks. 130 rows span two chunks, the second padded; 37 rows a padded single chunk."""
    module = _module(8, ansatz, dtype, seed=rows)
    x = np.random.default_rng(rows).normal(size=(rows, 8))
    coefficients = np.random.default_rng(rows + 1).normal(size=(rows, 3))
    twin = NumpyVQC(module)
    out, grads, variant = _grads(module, twin, x, coefficients)
    assert variant == "columns"

    reference = module.to_qnode("default.qubit", diff_method="backprop")
    params = list(module.parameters())
    expected = reference(torch.from_numpy(x).to(params[0].dtype))
    expected_grads = torch.autograd.grad((expected * torch.from_numpy(coefficients).to(expected.dtype)).sum(), params)
    np.testing.assert_allclose(out, expected.detach().double().numpy(), atol=TOLERANCE, rtol=0)
    for (name, _), got, want in zip(module.named_parameters(), grads, expected_grads):
        np.testing.assert_allclose(got, want.double().numpy(), atol=TOLERANCE, rtol=0, err_msg=name)
    assert np.abs(grads[0]).max() > 1e-4  # not two zero gradients

    blocks = NumpyVQC(module)
    blocks.use_columns = False
    out_blocks, grads_blocks, variant = _grads(module, blocks, x, coefficients)
    assert variant == "blocks"
    tight = 1e-6 if dtype == "complex64" else 1e-12
    np.testing.assert_allclose(out, out_blocks, atol=tight, rtol=0)
    for got, want in zip(grads, grads_blocks):
        np.testing.assert_allclose(got, want, atol=10 * tight * max(1.0, np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("n, ansatz, rows, dtype, preprocess",
                         [(5, "rzryrz_ring", 65, "complex64", "none"), (6, "basic_entangler", 33, "complex128", "linear"),
                          (7, "strongly_entangling", 17, "complex64", "none"), (8, "rzryrz_ring", 130, "complex64", "none"),
                          (8, "strongly_entangling", 37, "complex128", "linear")])
def test_the_acting_twin_on_the_columns_kernels_agrees_with_pennylane_and_the_blocks(n, ansatz, rows, dtype, preprocess):
    """5-8 qubits past the per-row kernels' rows (where the planner gives a call without a gradient to them):
    the acting twin's outputs against the head's PennyLane QNode to 1e-5, against the same twin pinned to the
    numpy blocks (what it ran there before) and against the torch head's no-grad forward (the blocks or the
    dense matrix). 130 rows span two chunks, the second padded; 17-65 rows one padded chunk; a pre-layer
    (``preprocess: linear``) runs before them."""
    torch.manual_seed(n + rows)
    in_dim = n + 3 if preprocess == "linear" else n
    module = VQC(in_dim, 3, n_qubits=n, layers=2, ansatz=ansatz, output="relu_linear", scaling="atan", dtype=dtype,
                 preprocess=preprocess)
    x = np.random.default_rng(rows).normal(size=(rows, in_dim))
    twin = NumpyVQCActing(module)
    assert rows > kernels.max_rows(n) and twin.plan(rows).variant == "columns"
    out = twin.forward(x)[0]

    reference = module.to_qnode("default.qubit", diff_method="backprop")
    with torch.no_grad():
        xt = torch.from_numpy(x).to(module.weights.dtype)
        expected = reference(xt).double().numpy()
        through_torch = module(xt).double().numpy()
    np.testing.assert_allclose(out, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(out, through_torch, atol=TOLERANCE, rtol=0)
    assert np.abs(out - out.mean(axis=0)).max() > 1e-3  # the rows' outputs differ: not a constant

    blocks = NumpyVQCActing(module)
    blocks.use_columns = False
    assert blocks.plan(rows).variant == "blocks"
    tight = 1e-6 if dtype == "complex64" else 1e-12
    np.testing.assert_allclose(out, blocks.forward(x)[0], atol=tight, rtol=0)


@pytest.mark.parametrize("n, ansatz, encoding, hadamard, observable",
                         [(3, "rzryrz_ring", "angle_x", False, "z"), (5, "ry_cz", "angle_y", True, "zz"),
                          (6, "basic_entangler", "angle_z", True, "p0"), (4, "strongly_entangling", "angle_x", True, "z")])
def test_the_columns_kernels_equal_the_per_row_kernels_in_float64(n, ansatz, encoding, hadamard, observable):
    """The kernels themselves, any width, encoding (F diagonal or not) and readout, in float64 against the
    per-row compiled kernels (complex128, an independent loop nest): the same circuit and adjoint method."""
    torch.manual_seed(n)
    module = VQC(n, 2, n_qubits=n, layers=3, ansatz=ansatz, encoding=encoding, hadamard=hadamard,
                 observable=observable, output="linear", dtype="complex128")
    program = program_of(module.circuit)
    rng = np.random.default_rng(n)
    angles = rng.uniform(-3, 3, size=(150, n))
    weights = module.weights.detach().numpy().astype(np.float64)
    rot, gen = kernels.rotations(program, weights, True)
    readouts, states = kernels.columns_forward(program, angles, rot, True)
    want_readouts, want_states = kernels.forward(program, angles, rot, True)
    np.testing.assert_allclose(readouts, want_readouts, atol=1e-12, rtol=0)
    np.testing.assert_allclose(states[0] + 1j * states[1], want_states.T, atol=1e-12, rtol=0)
    grad_readouts = rng.normal(size=readouts.shape)
    got = kernels.columns_weight_grad(program, states, grad_readouts, rot, gen)
    want = kernels.weight_grad(program, want_states, grad_readouts, rot, gen)
    np.testing.assert_allclose(got, want, atol=1e-11 * max(1.0, np.abs(want).max()), rtol=0)


def test_the_columns_kernels_are_deterministic_and_rows_are_independent():
    """Reruns give the same bits, and a row's outputs do not depend on the other rows of its call (the
    lanes never mix: the sums over rows are taken per wire, after the loop)."""
    module = _module(8, "rzryrz_ring", "complex64", seed=5)
    program = program_of(module.circuit)
    angles = np.random.default_rng(5).uniform(-3, 3, size=(200, 8))
    rot, _ = kernels.rotations(program, module.weights.detach().numpy().astype(np.float64), True)
    first = kernels.columns_forward(program, angles, rot, True)
    second = kernels.columns_forward(program, angles, rot, True)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    alone = kernels.columns_forward(program, angles[150:170], rot, False)[0]
    np.testing.assert_array_equal(alone, first[0][150:170])


def test_the_planner_gives_the_columns_kernels_training_calls_of_many_rows_at_8_qubits():
    """The numpy entry's training plan: the per-row kernels up to their rows, then the columns kernels from 5
    to 8 qubits (the blocks past them, and for a twin that never ran them, as one pickled before them)."""
    module = _module(8, "rzryrz_ring", "complex64", seed=1)
    twin = NumpyVQC(module)
    assert twin.plan(kernels.max_rows(8)).variant == "kernels"
    assert twin.plan(kernels.max_rows(8) + 1).variant == "columns"
    assert twin.plan(1024).variant == "columns"
    assert NumpyVQC(_module(5, "rzryrz_ring", "complex64", seed=1)).plan(1024).variant == "columns"
    assert NumpyVQC(_module(9, "rzryrz_ring", "complex64", seed=1)).plan(1024).variant == "blocks"
    pinned = NumpyVQC(module)
    pinned.use_columns = False
    assert pinned.plan(1024).variant == "blocks"
    # the compiled variants take no re-uploading: a re-uploading circuit's calls stay on the blocks
    for n in (5, 8):
        facts = Facts(n, reupload=True)
        for rows in (1, 64, 1024):
            assert plan(facts, rows, True, "numpy", kernel_rows=kernels.max_rows(n)) == Plan("statevector", "adjoint", "blocks")
            assert plan(facts, rows, False, "numpy", kernel_rows=kernels.max_rows(n)) == Plan("statevector", "none", "blocks")


def test_the_planner_gives_the_columns_kernels_acting_calls_of_many_rows_at_5_to_8_qubits():
    """The numpy entry's plan without a gradient: the per-row kernels up to their rows, then the columns kernels
    from 5 to 8 qubits; the blocks from 9 qubits, for an acting twin pickled before this (``use_columns``
    off, state_format's version 4 -> 5) and where the kernels are not here; up to 4 qubits the dense matrix.
    The torch entry keeps the cached dense matrix or the blocks (a torch head's process loads no numba)."""
    for n in range(5, 9):
        twin = NumpyVQCActing(_module(n, "rzryrz_ring", "complex64", seed=n))
        rows = kernels.max_rows(n)
        assert twin.plan(rows).variant == "kernels"
        assert twin.plan(rows + 1).variant == twin.plan(1024).variant == "columns"
        pinned = NumpyVQCActing(_module(n, "rzryrz_ring", "complex64", seed=n))
        pinned.use_columns = False
        assert pinned.plan(rows + 1).variant == "blocks"
        assert plan(Facts(n), rows + 1, False, "numpy", kernel_rows=0) == Plan("statevector", "none", "blocks")
        for ready in (False, True):
            assert plan(Facts(n), 1024, False, "torch", dense_ready=ready).variant in ("blocks", "cached")
    assert NumpyVQCActing(_module(9, "rzryrz_ring", "complex64", seed=9)).plan(1024).variant == "blocks"
    assert NumpyVQCActing(_module(4, "rzryrz_ring", "complex64", seed=4)).plan(1024).variant == "cached"
