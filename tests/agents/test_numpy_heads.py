"""The numpy forward/backward of small heads and the numpy one-step A2C gradient, against torch autograd
(for circuits: through the gate-by-gate engine, which shares no code with the dense analytic path)."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from agents.actor_critic import ActorCriticConfig, actor_critic_update
from agents.heads import FlatParameters, MLPConfig, build_mlp
from agents.numpy_heads import NumpyMLP, NumpyVQC, a2c_gradient, numpy_head
from circuits.planner import COLUMNS_QUBITS, Plan
from circuits.vqc import VQC
from marl_q.metrics import DIAGNOSTICS
from marl_q.state_format import upgrade


def _autograd_grads(module, x: np.ndarray, grad_out: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    out = module(torch.from_numpy(x).to(next(module.parameters()).dtype))
    (out * torch.from_numpy(grad_out).to(out.dtype)).sum().backward()
    return out.detach().numpy(), [p.grad.numpy().copy() for p in module.parameters()]


def _numpy_grads(module, x: np.ndarray, grad_out: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    for p in module.parameters():  # the worker's are views of its float32 flat gradient; here float64
        p.grad = torch.zeros_like(p)
    head = numpy_head(module)
    assert head is not None
    out, cache = head.forward(x)
    head.backward(cache, grad_out)
    return out, [p.grad.numpy().copy() for p in module.parameters()]


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_forward_and_parameter_gradients_equal_autograd(activation):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net = build_mlp(MLPConfig(hidden=[7, 5], activation=activation), 4, 3).double()
    x, g = rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    ref_out, ref_grads = _autograd_grads(copy.deepcopy(net), x, g)
    out, grads = _numpy_grads(net, x, g)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    assert len(grads) == 6
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


VQC_CASES = list(itertools.product(["none", "atan", "bound"], ["raw", "sum", "linear", "relu_linear"],
                                   ["z", "p0", "zz"], ["rzryrz_ring", "strongly_entangling"]))


@pytest.mark.parametrize("scaling,output,observable,ansatz", VQC_CASES)
def test_vqc_forward_and_gradients_equal_gate_engine_autograd(scaling, output, observable, ansatz, path):
    """complex128 so that float rounding is far below the tolerance; 3 qubits, 3 features, 2 outputs."""
    rng = np.random.default_rng(len(scaling) * 7 + len(output) + len(observable))
    spec = dict(n_qubits=3, layers=2, scaling=scaling, ansatz=ansatz, observable=observable, output=output,
                dtype="complex128", seed=3, bounds=[2.0, None, 0.5] if scaling == "bound" else [])
    module = VQC(3, 2, **spec)
    ref = VQC(3, 2, engine="gates", **spec)
    ref.load_state_dict(module.state_dict())
    assert isinstance(numpy_head(module), NumpyVQC)
    x, g = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    ref_out, ref_grads = _autograd_grads(ref, x, g)
    out, grads = _numpy_grads(module, x, g)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    assert any(np.abs(gr).max() > 1e-6 for gr in grads)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


ADJOINT_CASES = [(5, "atan", "relu_linear", "p0", "rzryrz_ring", 5), (6, "bound", "sum", "z", "strongly_entangling", 4),
                 (6, "none", "raw", "zz", "ry_cz", 6), (9, "atan", "linear", "z", "rzryrz_ring", 9)]


@pytest.mark.parametrize("n,scaling,output,observable,ansatz,features", ADJOINT_CASES)
def test_vqc_twin_on_the_adjoint_path_equals_gate_engine_autograd(n, scaling, output, observable, ansatz, features, path):
    """From 5 qubits the twin runs circuits.adjoint's numpy sweeps (the torch head's training path there),
    not the dense matrix: outputs and every parameter's gradient against the gate engine's autograd."""
    rng = np.random.default_rng(n)
    spec = dict(n_qubits=n, layers=2, scaling=scaling, ansatz=ansatz, observable=observable, output=output,
                dtype="complex128", seed=3, bounds=[2.0] + [None] * (features - 1) if scaling == "bound" else [])
    module = VQC(features, 2, **spec)
    ref = VQC(features, 2, engine="gates", **spec)
    ref.load_state_dict(module.state_dict())
    head = numpy_head(module)
    # past the compiled kernels' rows: their batch-last variant where the planner gives it (COLUMNS_QUBITS)
    columns = COLUMNS_QUBITS[0] <= n <= COLUMNS_QUBITS[1] and head.plan(1).variant == "kernels"
    assert isinstance(head, NumpyVQC) and head.plan(1000).variant == ("columns" if columns else "blocks")
    assert module.path(1, True) == "adjoint"
    x, g = rng.normal(size=(3, features)), rng.normal(size=(3, 2))
    ref_out, ref_grads = _autograd_grads(ref, x, g)
    out, grads = _numpy_grads(module, x, g)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    assert np.abs(grads[0]).max() > 1e-6  # the circuit weights
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


REUPLOAD_CASES = [(1, 3, "rzryrz_ring", "angle_x", "atan", "linear", "complex128"),
                  (4, 5, "rzryrz_ring", "angle_x", "none", "raw", "complex64"),
                  (5, 2, "strongly_entangling", "angle_y", "bound", "relu_linear", "complex128"),
                  (8, 2, "basic_entangler", "angle_z", "atan", "sum", "complex64")]


@pytest.mark.parametrize("n,layers,ansatz,encoding,scaling,output,dtype", REUPLOAD_CASES)
def test_reuploading_training_twin_equals_pennylane(n, layers, ansatz, encoding, scaling, output, dtype):
    """A re-uploading head with fixed scaling has a training twin on the statevector executor's blocks
    (the compiled kernels take no re-uploading): outputs and every parameter's gradient against the
    head's PennyLane QNode (default.qubit, backprop)."""
    rng = np.random.default_rng(n + layers)
    module = VQC(n, 2 if output != "raw" else min(n, 2), n_qubits=n, layers=layers, ansatz=ansatz, encoding=encoding,
                 scaling=scaling, output=output, reupload=True, hadamard=encoding == "angle_z", dtype=dtype, seed=n,
                 bounds=[2.0] + [None] * (n - 1) if scaling == "bound" else [])
    head = numpy_head(module)
    assert isinstance(head, NumpyVQC) and head.plan(1) == Plan("statevector", "adjoint", "blocks")
    x, g = rng.normal(size=(3, n)), rng.normal(size=(3, module.out_dim))
    reference = module.to_qnode("default.qubit", diff_method="backprop")
    params = list(module.parameters())
    want = reference(torch.from_numpy(x).to(params[0].dtype))
    want_grads = torch.autograd.grad((want * torch.from_numpy(g).to(want.dtype)).sum(), params)
    out, grads = _numpy_grads(module, x, g)
    tolerance = 1e-5 if dtype == "complex64" else 1e-10
    np.testing.assert_allclose(out, want.detach().double().numpy(), atol=tolerance, rtol=0)
    assert np.abs(module.weights.grad.numpy()).max() > 1e-4
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got, expected.double().numpy(), atol=tolerance, rtol=0)


def test_twin_pickled_before_the_adjoint_form_keeps_the_dense_path():
    module = VQC(6, 2, n_qubits=6, layers=1, seed=0)
    head = numpy_head(module)
    state = dict(head.__dict__)
    del state["use_blocks"], state["use_kernels"]  # what a snapshot from before the adjoint twin holds
    old = NumpyVQC.__new__(NumpyVQC)
    old.__dict__.update(state)
    upgrade({"twin": old}, 0)  # a version-0 snapshot's migration
    x = np.random.default_rng(0).normal(size=(2, 6))
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    out_old, cache = old.forward(x)
    assert not old.use_blocks and len(cache.saved) == 3 and cache.saved[0].shape == (2, 64)  # (r, amplitudes, DenseGradient)
    np.testing.assert_allclose(out_old, head.forward(x)[0], atol=1e-5)


def test_heads_without_a_numpy_pass_keep_the_torch_path():
    assert numpy_head(VQC(4, 2, n_qubits=4, scaling="trainable")) is None  # trainable input scale
    assert numpy_head(VQC(4, 2, n_qubits=4, output="scaled")) is None
    assert numpy_head(VQC(4, 2, n_qubits=4, preprocess="linear")) is None
    assert numpy_head(VQC(4, 2, n_qubits=4, dense_grad="autograd")) is None
    assert numpy_head(VQC(4, 2, n_qubits=4, reupload=True, scaling="trainable")) is None  # trainable input scale
    assert numpy_head(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Sigmoid())) is None
    assert isinstance(numpy_head(build_mlp(MLPConfig(hidden=[5]), 4, 2)), NumpyMLP)


def _batch(rng, T, N, all_valid):
    batch = {"obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
             "actions": rng.integers(0, 3, size=(T, N)), "rewards": rng.normal(size=(T, N)),
             "terminated": rng.random((T, N)) < 0.2,
             "valid": np.ones((T, N), dtype=bool) if all_valid else rng.random((T, N)) < 0.7}
    batch["dones"] = batch["terminated"] | (rng.random((T, N)) < 0.1)
    return batch


@pytest.mark.parametrize("T,N,all_valid,ent_coef,adv_norm,max_grad_norm", [
    (1, 1, True, 0.0, False, None),  # Koelle's one-step update
    (4, 3, False, 0.01, False, 0.5),  # masked autoreset steps, entropy, a global-norm clip that binds
    (5, 2, True, 0.02, True, None),  # normalised advantages
])
def test_numpy_a2c_gradient_equals_the_torch_update(T, N, all_valid, ent_coef, adv_norm, max_grad_norm):
    """The whole flat gradient (a hybrid quantum actor, an MLP critic) against actor_critic_update."""
    rng = np.random.default_rng(T * 10 + N)
    batch = _batch(rng, T, N, all_valid)
    ac = ActorCriticConfig(n_steps=T, ent_coef=ent_coef, adv_norm=adv_norm, max_grad_norm=max_grad_norm,
                           vf_coef=0.7, reward_scale=0.5, gae_lambda=0.9)
    grads, diags = [], []
    for path in ("torch", "numpy"):
        torch.manual_seed(4)
        actor = VQC(4, 3, n_qubits=4, layers=2, scaling="bound", bounds=[4.8, None, 0.418, None],
                    ansatz="rzryrz_ring", observable="p0", output="relu_linear", seed=1)
        critic = build_mlp(MLPConfig(hidden=[5], activation="relu"), 4, 1)
        flat = FlatParameters(actor, critic)
        if path == "torch":
            diags.append(actor_critic_update(ac, actor, critic, flat, None, np.random.default_rng(0), batch))
        else:
            np_actor, np_critic = numpy_head(actor), numpy_head(critic)
            obs = batch["obs"][:T].reshape(T * N, -1).astype(np.float64)
            logits, cache = np_actor.forward(obs)
            flat.zero_grad()
            diags.append(a2c_gradient(ac, np_actor, np_critic, batch, logits, cache, flat.grad_view()))
        grads.append(flat.flat.grad.numpy().copy())
    # train.csv's diagnostics: the numpy pass's loss terms equal the torch pass's (no clip: no clipfrac,
    # the one pass at the rollout's parameters: KL 0; explained variance only with two or more samples)
    torch_diag, numpy_diag = diags
    assert torch_diag.keys() == numpy_diag.keys() == set(DIAGNOSTICS)
    for key in ("policy_loss", "value_loss", "entropy", "explained_variance"):
        if torch_diag[key] is None:
            assert numpy_diag[key] is None and key == "explained_variance" and T * N == 1
        else:
            assert numpy_diag[key] == pytest.approx(torch_diag[key], rel=1e-4, abs=1e-6), key
    assert torch_diag["approx_kl"] == numpy_diag["approx_kl"] == 0.0
    assert torch_diag["clipfrac"] is None and numpy_diag["clipfrac"] is None
    torch_grad, numpy_grad = grads
    assert np.abs(torch_grad).max() > 1e-4
    # the worker's heads are float32 (complex64 circuits): the torch path computes in it, numpy in float64
    np.testing.assert_allclose(numpy_grad, torch_grad, rtol=1e-4, atol=1e-6)
    if max_grad_norm is not None:
        assert np.linalg.norm(numpy_grad) == pytest.approx(max_grad_norm, rel=1e-5)
