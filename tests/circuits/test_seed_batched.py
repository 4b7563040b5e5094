"""The seed-batched entry point (``circuits.twins.SeedBatchedVQC``: one weight set per seed, a leading
seed axis) against each seed's own twin (``NumpyVQC``, bit for bit: what batched seeds promise) and
against each seed's PennyLane QNode (outputs and every parameter's gradient to 1e-5), on random
weights, inputs and output gradients; and the circuits it counts against the twin's counts."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from circuits import VQC, kernels
from circuits.resources import attach, head_totals
from circuits.spec import ANSATZE
from circuits.twins import NumpyVQC, SeedBatchedVQC, seed_batched_twin

pytestmark = pytest.mark.skipif(os.environ.get("MARLQ_KERNELS") == "0",
                                reason="MARLQ_KERNELS=0 in the environment turns the compiled kernels off")
KOELLE = dict(n_qubits=4, layers=2, encoding="angle_x", scaling="bound", bounds=[4.8, None, 0.418, None],
              ansatz="rzryrz_ring", observable="p0", output="relu_linear")  # the Kölle heads' spec


def heads(seeds: int, in_dim: int, out_dim: int, **spec) -> list[VQC]:
    out = []
    for s in range(seeds):
        torch.manual_seed(100 + s)
        out.append(VQC(in_dim, out_dim, **spec))
    return out


def random_rows(modules: list[VQC], seed: int) -> np.ndarray:
    """Each seed's parameters (S, P) float32, drawn fresh (not the modules' initial ones)."""
    size = sum(p.numel() for p in modules[0].parameters())
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=(len(modules), size)).astype(np.float32)


def load(module: VQC, row: np.ndarray) -> None:
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(row[offset:offset + p.numel()].reshape(p.shape)))
            offset += p.numel()


def twin_reference(module: VQC, row: np.ndarray, x: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """The seed alone: its own twin at its row's parameters; outputs, the flat gradient and the plan's variant."""
    load(module, row)
    twin = NumpyVQC(module)
    out, cache = twin.forward(x)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    twin.backward(cache, grad)
    return out, np.concatenate([p.grad.numpy().reshape(-1) for p in module.parameters()]), cache.plan.variant


def batched_against_twins(spec: dict, in_dim: int, out_dim: int, rows: int, seeds: int = 5, seed: int = 0) -> str:
    """Forward and backward of the seed-batched entry against every seed's own twin, bit for bit."""
    batched_modules, alone = heads(seeds, in_dim, out_dim, **spec), heads(seeds, in_dim, out_dim, **spec)
    params = random_rows(batched_modules, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.normal(size=(seeds, rows, in_dim))
    grad = rng.normal(size=(seeds, rows, out_dim))
    grad[0, 0] = 0.0  # a row without a gradient (an env step that only reset)
    entry = seed_batched_twin(batched_modules)
    assert entry is not None and entry.size == params.shape[1]
    out, cache = entry.forward(params, x)
    got = np.full(params.shape, np.nan, dtype=np.float32)
    entry.backward(cache, grad, got)
    for s in range(seeds):
        want_out, want_grad, variant = twin_reference(alone[s], params[s], x[s], grad[s])
        assert variant == cache.plan.variant  # the one planner's answer for one seed's call
        np.testing.assert_array_equal(out[s], want_out)
        np.testing.assert_array_equal(got[s], want_grad.astype(np.float32))
    offset, size, _ = entry.layout["weights"]
    assert np.abs(got[:, offset:offset + size]).max() > 1e-3  # the circuit's weight gradients are not all zero
    return cache.plan.variant


@pytest.mark.parametrize("ansatz", list(ANSATZE))
@pytest.mark.parametrize("output, scaling", [("relu_linear", "bound"), ("linear", "atan"), ("raw", "none"),
                                             ("sum", "atan")])
def test_seed_batched_kernels_give_each_seeds_twin_bits(ansatz, output, scaling):
    spec = dict(KOELLE, ansatz=ansatz, output=output, scaling=scaling,
                bounds=KOELLE["bounds"] if scaling == "bound" else [])
    for rows in (1, 2):  # the one-step A2C's actor and critic calls
        assert batched_against_twins(spec, 4, 2, rows, seed=rows) == "kernels"


def test_fewer_features_than_qubits_and_more_layers():
    spec = dict(n_qubits=5, layers=3, ansatz="strongly_entangling", output="linear", scaling="atan")
    assert batched_against_twins(spec, 3, 2, 3, seeds=4) == "kernels"


def test_past_the_kernels_rows_each_seed_runs_its_own_twin():
    """A call the planner gives another executor (the dense one at 4 qubits past the kernels' rows, the
    numpy blocks without numba) runs each seed's twin in turn: the same bits again."""
    rows = kernels.max_rows(4) + 1
    assert batched_against_twins(KOELLE, 4, 2, rows) == "cached"


def test_without_numba_each_seed_runs_its_own_twin(monkeypatch):
    monkeypatch.setattr(kernels, "_NUMBA", None)
    monkeypatch.setenv("MARLQ_KERNELS", "0")
    assert not kernels.available()
    assert batched_against_twins(KOELLE, 4, 2, 2) == "cached"
    assert batched_against_twins(dict(KOELLE, n_qubits=5), 4, 2, 2) == "blocks"  # 4 features on 5 qubits


def test_seed_batched_against_pennylane():
    """Independent reference: each seed's own QNode (default.qubit, backprop) at its row's parameters."""
    seeds, rows = 4, 2
    modules = heads(seeds, 4, 2, **KOELLE)
    params = random_rows(modules, 3)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(seeds, rows, 4))
    coefficients = rng.normal(size=(seeds, rows, 2))
    entry = seed_batched_twin(modules)
    out, cache = entry.forward(params, x)
    got = np.zeros(params.shape, dtype=np.float32)
    entry.backward(cache, coefficients, got)
    for s in range(seeds):
        reference = heads(1, 4, 2, **KOELLE)[0]
        load(reference, params[s])
        qnode = reference.to_qnode("default.qubit", diff_method="backprop")
        expected = qnode(torch.from_numpy(x[s]).float())
        np.testing.assert_allclose(out[s], expected.detach().double().numpy(), atol=1e-5, rtol=0)
        grads = torch.autograd.grad((expected * torch.from_numpy(coefficients[s]).to(expected.dtype)).sum(),
                                    list(reference.parameters()))
        want = np.concatenate([g.double().numpy().reshape(-1) for g in grads])
        np.testing.assert_allclose(got[s], want, atol=1e-5, rtol=0)


def test_counts_are_the_twins_counts():
    """The circuits, jobs and gradient circuits a seed's head reports: what its own twin counts call by
    call (rows with a zero output gradient cost no gradient circuits; a backward without any, no job)."""
    seeds = 3
    modules, alone = heads(seeds, 4, 2, **KOELLE), heads(seeds, 4, 2, **KOELLE)
    for m in modules + alone:
        attach(m)
    entry = seed_batched_twin(modules)
    params = random_rows(modules, 5)
    rng = np.random.default_rng(6)
    twins = [NumpyVQC(m) for m in alone]
    for step in range(4):
        rows = 1 + step % 2
        x = rng.normal(size=(seeds, rows, 4))
        grad = rng.normal(size=(seeds, rows, 2))
        grad[step % seeds] = 0.0  # one seed without any gradient this step
        out, cache = entry.forward(params, x)
        entry.backward(cache, grad, np.zeros(params.shape, dtype=np.float32))
        for s, twin in enumerate(twins):
            load(alone[s], params[s])
            for p in alone[s].parameters():
                p.grad = torch.zeros_like(p)
            twin.backward(twin.forward(x[s])[1], grad[s])
        if step == 1:  # read part-way: what was counted so far
            entry.report_counts(0)
            assert head_totals(modules[0]) == head_totals(alone[0])
    for s in range(seeds):
        entry.report_counts(s)
        assert head_totals(modules[s]) == head_totals(alone[s])
        skipped = sum(step % seeds == s for step in range(4))  # steps without a gradient: no job
        totals = head_totals(modules[s])
        assert totals["act_jobs"] == 4 and totals["act_circuits"] == 1 + 2 + 1 + 2
        assert totals["grad_jobs"] == 4 - skipped


def test_seeds_with_different_specs_are_not_batched():
    a = heads(1, 4, 2, **KOELLE)
    b = heads(1, 4, 2, **dict(KOELLE, layers=3))
    assert seed_batched_twin(a + b) is None
    assert SeedBatchedVQC.supports(a + a)
    assert seed_batched_twin(heads(2, 4, 2, **dict(KOELLE, shots=100))) is None  # a twin is exact: no shots

