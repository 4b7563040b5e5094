"""The acting-only numpy twin of a dense-path circuit head against the torch module (float rounding)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.numpy_heads import NumpyVQCActing, numpy_acting_head
from circuits import VQC, kernels
from marl_q.state_format import upgrade



@pytest.mark.parametrize("n, preprocess, output, scaling", [(8, "linear", "linear", "atan"), (4, "none", "relu_linear", "none"),
                                                             (5, "linear", "sum", "atan"), (6, "none", "linear", "atan"),
                                                             (11, "none", "relu_linear", "atan")])
def test_acting_twin_matches_the_torch_forward(n, preprocess, output, scaling, path):
    torch.manual_seed(n)
    in_dim = 21 if preprocess == "linear" else n
    module = VQC(in_dim, 5, n_qubits=n, layers=2, preprocess=preprocess, output=output, scaling=scaling)
    twin = numpy_acting_head(module)
    x = np.random.default_rng(n).normal(size=(3, in_dim))
    got, _ = twin.forward(x)
    with torch.no_grad():
        want = module(torch.from_numpy(x).float()).double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    # every one acts through the acting twin, marked acting only (a weight change rebuilds the matrix or
    # the blocks alone); past the kernels' rows, up to 4 qubits through the dense matrix, from 5 the
    # state vector: its columns kernels up to 8 qubits where the compiled kernels are (planner.COLUMNS_QUBITS),
    # else its blocks
    assert isinstance(twin, NumpyVQCActing) and module.acting_only
    compiled = n <= 8 and twin.plan(1).variant == "kernels"
    assert twin.plan(1000).variant == ("cached" if n < 5 else "columns" if compiled else "blocks")
    assert (twin._dense is None) == (n >= 5 or path == "kernels")
    with torch.no_grad():  # a weight change is seen
        module.weights.add_(0.3)
        want = module(torch.from_numpy(x).float()).double().numpy()
    np.testing.assert_allclose(twin.forward(x)[0], want, atol=1e-5)
    with pytest.raises(TypeError, match="acting only"):
        twin.backward(None, np.zeros_like(got))


def test_acting_twin_choice():
    assert isinstance(numpy_acting_head(VQC(20, 5, n_qubits=8, preprocess="linear")), NumpyVQCActing)
    assert isinstance(numpy_acting_head(VQC(4, 2, n_qubits=4)), NumpyVQCActing)
    # re-uploading, trainable scales included: the statevector executor's blocks at every row count
    reupload = numpy_acting_head(VQC(4, 2, n_qubits=4, layers=5, reupload=True, scaling="trainable", output="scaled"))
    assert isinstance(reupload, NumpyVQCActing) and reupload.plan(1).variant == reupload.plan(1000).variant == "blocks"
    assert isinstance(numpy_acting_head(VQC(12, 2, n_qubits=12, layers=1)), NumpyVQCActing)  # no dense path: the state vector
    assert numpy_acting_head(VQC(12, 2, n_qubits=12, layers=1, shots=100)) is None  # shots: torch draws them


def test_a_twin_pickled_before_the_state_vector_forward_keeps_its_dense_matrix():
    """A sim snapshot's twin from before ``statevector`` existed unpickles and acts through the dense
    matrix, as it did when pickled; a current twin keeps its choice across a round trip."""
    import pickle

    torch.manual_seed(1)
    module = VQC(21, 5, n_qubits=6, layers=2, preprocess="linear", output="linear", scaling="atan")
    twin = numpy_acting_head(module)
    x = np.random.default_rng(1).normal(size=(3, 21))
    old = dict(twin.__dict__)
    for key in ("use_blocks", "_per_weights", "use_kernels"):
        old.pop(key)
    legacy = NumpyVQCActing.__new__(NumpyVQCActing)
    legacy.__dict__.update(old)
    upgrade({"twin": legacy}, 0)  # a version-0 snapshot's migration
    with torch.no_grad():
        want = module(torch.from_numpy(x).float()).double().numpy()
    assert legacy.use_blocks is False
    np.testing.assert_allclose(legacy.forward(x)[0], want, atol=1e-5)
    again = pickle.loads(pickle.dumps(twin))
    assert again.use_blocks is True and again.use_kernels is True
    np.testing.assert_allclose(again.forward(x)[0], want, atol=1e-5)


def test_a_twin_pickled_with_blocks_of_an_earlier_version_rebuilds_them(monkeypatch):
    """Sim snapshots of a 5+ qubit acting twin held its cached adjoint.BlockMatrices (``_blocks``); those
    of an earlier version lack what the forward reads now (the first layer's per-wire matrices, the
    grouping). The blocks are a cache: left out of pickles and rebuilt, with the same outputs."""
    import pickle

    monkeypatch.setattr(kernels, "MAX_ROWS", {})  # the snapshot's twin acted by the state vector
    torch.manual_seed(2)
    module = VQC(6, 3, n_qubits=6, layers=2, output="linear", scaling="atan")
    twin = numpy_acting_head(module)
    x = np.random.default_rng(2).normal(size=(3, 6))
    want = twin.forward(x)[0]
    weights, built = twin._per_weights.weights, twin._per_weights.built
    blocks = built["blocks"]
    del blocks.first_wires, blocks.groups  # what a block object of the earlier version lacks
    old_state = dict(twin.__dict__)  # as an earlier version pickled it: with its blocks
    for key in ("_per_weights", "use_kernels"):
        del old_state[key]
    old_state["statevector"] = old_state.pop("use_blocks")
    old_state["_blocks"] = (weights, blocks)
    legacy = NumpyVQCActing.__new__(NumpyVQCActing)
    legacy.__dict__.update(old_state)
    upgrade({"twin": legacy}, 0)  # a version-0 snapshot's migration
    assert not hasattr(legacy, "_blocks") and legacy.use_kernels is False
    np.testing.assert_array_equal(legacy.forward(x)[0], want)
    assert pickle.loads(pickle.dumps(twin))._per_weights is None


@pytest.mark.parametrize("n, layers, ansatz, scaling, output, dtype", [(4, 5, "rzryrz_ring", "trainable", "scaled", "complex64"),
                                                                       (1, 2, "rzryrz_ring", "trainable", "scaled", "complex128"),
                                                                       (5, 3, "strongly_entangling", "trainable", "linear", "complex64"),
                                                                       (8, 2, "basic_entangler", "atan", "relu_linear", "complex128")])
def test_reuploading_acting_twin_equals_the_torch_forward_and_pennylane(n, layers, ansatz, scaling, output, dtype):
    """A re-uploading head (Skolik et al.'s: a trainable input scale per block and feature, a trainable
    output scale) acts through its acting twin on the statevector executor's blocks: the torch head's
    no-grad forward to the bit where both take that executor's readouts (trainable scales: the angles
    and the scaled outputs are rounded to the head's dtype as torch rounds them), and PennyLane's QNode
    to the parity tests' 1e-5."""
    torch.manual_seed(n + layers)
    module = VQC(n, min(n, 2), n_qubits=n, layers=layers, ansatz=ansatz, scaling=scaling, output=output, reupload=True,
                 dtype=dtype)
    if module.input_scale is not None:
        with torch.no_grad():
            module.input_scale.uniform_(0.5, 1.5)
    if module.output_scale is not None:
        with torch.no_grad():
            module.output_scale.uniform_(0.5, 2.0)
    twin = numpy_acting_head(module)
    assert isinstance(twin, NumpyVQCActing)
    dtype_real = module.weights.dtype
    for rows in (1, 3, 100):
        assert twin.plan(rows).variant == "blocks"
        x = np.random.default_rng(rows).normal(size=(rows, n)).astype(np.float32 if dtype_real == torch.float32 else np.float64)
        got, _ = twin.forward(x.astype(np.float64))
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        if output == "scaled":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, atol=1e-5 if dtype == "complex64" else 1e-12, rtol=0)
        qnode = module.to_qnode("default.qubit", diff_method="backprop")
        with torch.no_grad():
            np.testing.assert_allclose(got, qnode(torch.from_numpy(x)).double().numpy(), atol=1e-5, rtol=0)
