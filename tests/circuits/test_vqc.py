"""VQC module: hand-computed cases, caching, engine self-consistency, bad input, the heads seam."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from circuits import VQC
from circuits.heads import HEADS
from circuits.spec import CircuitConfigError

torch.set_num_threads(1)


def test_one_qubit_hand_computed():
    # RY(w) RY(x) |0> = RY(x + w)|0>, so <Z> = cos(x + w)
    module = VQC(1, 1, n_qubits=1, layers=1, encoding="angle_y", ansatz="basic_entangler", rotation="ry")
    x = torch.tensor([[0.3], [1.7], [-2.0]])
    w = float(module.weights.detach()[0, 0, 0])
    expected = torch.cos(x + w)
    torch.testing.assert_close(module(x), expected, atol=1e-6, rtol=0)


def test_two_qubit_hand_computed_cnot():
    # RX(a) on qubit 0, RX(b) on qubit 1, then rotation RX(0) and CNOT(0, 1):
    # <Z_0> = cos a, <Z_1> = cos a cos b (CNOT maps Z_1 to Z_0 Z_1)
    module = VQC(2, 2, n_qubits=2, layers=1, encoding="angle_x", ansatz="basic_entangler", rotation="rx")
    with torch.no_grad():
        module.weights.zero_()
    x = torch.tensor([[0.4, 1.1], [2.5, -0.7]])
    a, b = x[:, 0], x[:, 1]
    torch.testing.assert_close(module(x), torch.stack([torch.cos(a), torch.cos(a) * torch.cos(b)], 1), atol=1e-6, rtol=0)


def test_koelle_pure_actor_probability_cap():
    # softmax over two P(0) readouts in [0, 1] can never exceed e / (1 + e) = 0.731
    actor = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="raw",
                scaling="bound", bounds=[4.8, None, 0.418, None])
    probs = torch.softmax(actor(torch.randn(512, 4) * 3).detach(), dim=-1)
    assert float(probs.max()) <= math.e / (1 + math.e) + 1e-6
    assert sum(p.numel() for p in actor.parameters()) == 24


def test_koelle_parameter_counts():
    hybrid = HEADS["hybrid"]
    assert sum(p.numel() for p in hybrid.build(hybrid.config(), 4, 2).parameters()) == 34
    assert sum(p.numel() for p in hybrid.build(hybrid.config(), 4, 1).parameters()) == 29


def test_bound_scaling_maps_bounded_and_unbounded_features():
    module = VQC(2, 2, n_qubits=2, layers=1, scaling="bound", bounds=[2.0, None])
    x = torch.tensor([[1.0, 3.0]])
    torch.testing.assert_close(module.angles(x), torch.tensor([[math.pi / 2, 2 * math.atan(3.0)]]))


def test_dense_matrix_cached_in_rollouts_and_refreshed_after_update():
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring")
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = module.dense_matrix()
        assert module.dense_matrix() is first  # reused while the weights are unchanged
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    module(x).sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = module(x)
        assert module.dense_matrix() is not first
    torch.testing.assert_close(after, module(x).detach())  # cached no-grad == fresh grad-mode result


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.sampled_from(["angle_x", "angle_y", "angle_z"]), st.booleans(),
       st.sampled_from(["strongly_entangling", "basic_entangler", "rzryrz_ring"]), st.integers(0, 10_000))
def test_dense_and_gate_paths_agree_and_stay_physical(n, encoding, hadamard, ansatz, seed):
    torch.manual_seed(seed)
    spec = dict(n_qubits=n, layers=2, encoding=encoding, hadamard=hadamard, ansatz=ansatz, observable="z")
    dense = VQC(n, n, engine="dense", **spec)
    gate = VQC(n, n, engine="gates", **spec)
    gate.load_state_dict(dense.state_dict())
    x = torch.randn(4, n) * 3
    z_dense, z_gate = dense(x).detach(), gate(x).detach()
    torch.testing.assert_close(z_dense, z_gate, atol=1e-5, rtol=0)
    assert float(z_dense.abs().max()) <= 1 + 1e-5
    final = dense.circuit.encoded_state(dense.angles(x).detach())  # encoding is unitary: unit norm
    norms = (final.abs() ** 2).sum(-1)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def test_flat_parameters_reseating_keeps_the_function():
    from agents.heads import FlatParameters as flat_parameters
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", output="relu_linear", observable="p0")
    x = torch.randn(5, 4)
    before = module(x).detach()
    flat = flat_parameters(module)
    torch.testing.assert_close(module(x).detach(), before)
    with torch.no_grad():
        cached = module(x)
    flat.load(flat.numpy() + 0.3)
    with torch.no_grad():
        assert not torch.allclose(module(x), cached)  # the cache saw the new parameters
    module(x).sum().backward()
    assert float(abs(flat.grad_numpy()).max()) > 0


@pytest.mark.parametrize("spec, fragment", [
    (dict(encoding="angle_q"), "choices: angle_x, angle_y, angle_z"),
    (dict(ansatz="hardware_efficient"), "choices: basic_entangler, ry_cz, rzryrz_ring, strongly_entangling"),
    (dict(observable="x"), "choices: z, zz, p0"),
    (dict(n_qubit=4), "did you mean 'n_qubits'"),
    (dict(scaling="bound", bounds=[1.0]), "bounds"),
    (dict(engine="dense", reupload=True), "engine"),
    (dict(n_qubits=2, output="raw"), "out_dim=3"),
])
def test_bad_specs_name_the_key(spec, fragment):
    in_dim = 2 if spec.get("n_qubits") == 2 else 4
    with pytest.raises(CircuitConfigError, match=fragment.replace("(", r"\(")):
        VQC(in_dim, 3, **spec)


def test_more_features_than_qubits_needs_a_pre_layer():
    with pytest.raises(CircuitConfigError, match="preprocess: linear"):
        VQC(6, 2, n_qubits=4)
    assert VQC(6, 2, n_qubits=4, preprocess="linear")(torch.randn(2, 6)).shape == (2, 2)


def test_cuda_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CircuitConfigError, match="cuda"):
        VQC(4, 2, device="cuda")


def test_missing_pennylane_plugin_names_the_pip_package():
    with pytest.raises(CircuitConfigError, match="pip install pennylane-lightning-gpu"):
        VQC(4, 2, backend="pennylane", pennylane_device="lightning.gpu")
    with pytest.raises(CircuitConfigError, match="pennylane-qiskit"):
        VQC(4, 2).to_qnode("qiskit.aer")


def test_pennylane_backend_computes_the_same_function():
    torch.manual_seed(5)
    native = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="linear")
    through_qnode = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="linear",
                        backend="pennylane", diff_method="backprop")
    through_qnode.load_state_dict(native.state_dict())
    x = torch.randn(3, 4)
    torch.testing.assert_close(through_qnode(x), native(x), atol=1e-5, rtol=0)
    assert hasattr(native.to_qnode(), "qnode")
    # a module that has run through its QNode still pickles (sim snapshots, deepcopy): the closure is
    # dropped and rebuilt on the next call
    import copy
    import pickle

    for clone in (pickle.loads(pickle.dumps(through_qnode)), copy.deepcopy(through_qnode)):
        torch.testing.assert_close(clone(x), native(x), atol=1e-5, rtol=0)


def test_config_loader_lists_choices_for_an_unknown_encoding(tmp_path):
    from marl_q import config, errors
    from marl_q.registry import load_plugins

    load_plugins()
    path = tmp_path / "bad.yaml"
    path.write_text("run: {total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a2c}\n"
                    "actor: {head: vqc, encoding: angle_w}\ncritic: {head: hybrid}\n")
    with pytest.raises(errors.ConfigError, match="angle_x"):
        config.load_config(path)
    path.write_text("run: {total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a2c}\n"
                    "actor: {head: vqc, n_qubits: 0}\ncritic: {head: hybrid}\n")
    with pytest.raises(errors.ConfigError, match="n_qubits"):
        config.load_config(path)


def test_head_configs_check_cuda_and_plugins_at_load_time(monkeypatch):
    from circuits.diffqas import DiffQASConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CircuitConfigError, match="no CUDA GPU"):
        HEADS["vqc"].config(device="cuda").validate()
    with pytest.raises(CircuitConfigError, match="no CUDA GPU"):
        DiffQASConfig(device="cuda").validate()
    with pytest.raises(CircuitConfigError, match="pennylane-lightning-kokkos"):
        HEADS["hybrid"].config(backend="pennylane", pennylane_device="lightning.kokkos").validate()
    HEADS["hybrid"].config(backend="pennylane", pennylane_device="default.qubit").validate()


def test_a_vqc_pickled_before_layer_options_existed_still_runs():
    import pickle

    module = VQC(3, 2, n_qubits=3, layers=2, ansatz="basic_entangler", rotation="ry", entangler="cz", engine="gates")
    x = torch.randn(4, 3)
    expected = module(x)
    from marl_q.state_format import upgrade

    del module.circuit.__dict__["options"]  # as a snapshot written before circuits.blocks
    back = upgrade({"head": pickle.loads(pickle.dumps(module))}, 0)["head"]  # a version-0 snapshot's migration
    assert back.circuit.options.rotation == "ry"
    torch.testing.assert_close(back(x), expected, atol=0, rtol=0)
