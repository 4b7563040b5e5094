"""DiffQAS: the ensemble against per-candidate PennyLane QNodes, pruning, the reported architecture."""
from __future__ import annotations

import torch

from circuits import VQC
from circuits.diffqas import DiffQAS, DiffQASConfig
from tests.circuits.test_parity import TOLERANCE

torch.set_num_threads(1)


def small_pool(**extra) -> DiffQASConfig:
    return DiffQASConfig(n_qubits=3, layers=2, encodings=["angle_x", "angle_z"], hadamard=[False, True],
                         rotations=["rx", "ry"], entanglers=["cnot", "cz"], **extra)


def reference_output(model: DiffQAS, x: torch.Tensor) -> torch.Tensor:
    """sum_j w_j f_j(x) with each f_j a separate VQC evaluated by its own PennyLane QNode."""
    angles = 2.0 * torch.atan(model.pre(x))
    mixed = 0.0
    for j, cand in enumerate(model.candidates):
        single = VQC(3, 3, n_qubits=3, layers=2, ansatz="basic_entangler", observable=model.cfg.observable, **cand)
        qnode = single.to_qnode(diff_method="backprop").qnode
        results = qnode(angles, model.weights[j][..., None])  # the ensemble's own weights, differentiably
        readouts = torch.stack([torch.as_tensor(r) for r in results], -1)
        mixed = mixed + model.structure[j] * readouts
    return model.post(mixed.to(angles.dtype))


def test_ensemble_matches_per_candidate_qnodes_with_gradients():
    torch.manual_seed(0)
    model = DiffQAS(small_pool(), in_dim=5, out_dim=2)
    assert len(model.candidates) == 16
    x = torch.randn(3, 5)
    got, want = model(x), reference_output(model, x)
    torch.testing.assert_close(got.double(), want.double(), atol=TOLERANCE, rtol=0)
    params = [model.structure, model.weights, model.pre.weight]
    got_grads = torch.autograd.grad(got.sum(), params)
    want_grads = torch.autograd.grad(want.sum(), params)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.double(), w.double(), atol=TOLERANCE, rtol=0)
    assert float(got_grads[0].abs().max()) > 1e-4


def test_top_k_pruning_evaluates_only_the_largest_weights():
    torch.manual_seed(1)
    model = DiffQAS(small_pool(top_k=3, prune_after=2), in_dim=4, out_dim=2)
    with torch.no_grad():
        model.structure.copy_(torch.linspace(-0.5, 1.0, 16))  # |w| largest at 15, 14, 13 (0 has 0.5)
    x = torch.randn(4, 4)
    for _ in range(2):
        assert len(model.active()) == 16
        model(x).sum().backward()
    assert model.active().tolist() == [13, 14, 15]
    model.zero_grad()
    model(x).sum().backward()
    grads = model.structure.grad
    assert float(grads[:13].abs().max()) == 0.0 and float(grads[13:].abs().min()) > 0
    report = model.selected_architecture()
    assert report["pruning_active"] and [c["weight"] for c in report["selected"]] == [1.0, 0.9, 0.8]
    assert set(report["selected"][0]) == {"encoding", "hadamard", "rotation", "entangler", "weight"}


def test_no_grad_cache_matches_grad_mode():
    torch.manual_seed(2)
    model = DiffQAS(small_pool(), in_dim=4, out_dim=2)
    x = torch.randn(6, 4)
    with torch.no_grad():
        cached = model(x)
        again = model(x)
    torch.testing.assert_close(cached, again)
    torch.testing.assert_close(cached, model(x).detach(), atol=1e-6, rtol=0)
    with torch.no_grad():
        model.weights.add_(0.1)
        assert not torch.allclose(model(x), cached)
