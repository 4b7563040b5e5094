"""The compiled kernels (circuits.kernels) against independent references: the ansatz's own numpy
matrices and the shift rule, finite differences, and PennyLane's default.qubit through the numpy twins
that run them (outputs and every parameter's gradient, to the parity tests' 1e-5)."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import itertools
import os

import numpy as np
import pytest
import torch

from circuits import VQC, kernels
from circuits.program import Program, program_of
from circuits.twins import NumpyVQC, NumpyVQCActing
from circuits.spec import ANSATZE, ENCODINGS, OBSERVABLES

# numba is a core dependency: where it cannot be imported these tests fail (test_numba_is_here says why);
# only a user's own MARLQ_KERNELS=0 turns the kernels off, and then there is nothing here to test
pytestmark = pytest.mark.skipif(os.environ.get("MARLQ_KERNELS") == "0",
                                reason="MARLQ_KERNELS=0 in the environment turns the compiled kernels off")
TOLERANCE = 1e-5


def test_numba_is_here():
    """numba is in the project's dependencies: an install where it does not import is broken."""
    importlib.import_module("numba")  # its ImportError names what is missing
    assert kernels.available()


@pytest.mark.parametrize("ansatz, rotation", [("rzryrz_ring", "rx"), ("strongly_entangling", "rx"), ("ry_cz", "rx"),
                                              ("basic_entangler", "rx"), ("basic_entangler", "ry"),
                                              ("basic_entangler", "rz")])
def test_rotations_and_generators_equal_the_ansatz_matrices_and_the_shift_rule(ansatz, rotation):
    module = VQC(3, 2, n_qubits=3, layers=3, ansatz=ansatz, rotation=rotation, dtype="complex128")
    circuit = module.circuit
    program = program_of(circuit)
    weights = np.random.default_rng(0).uniform(-4, 4, size=tuple(module.weights.shape))
    rot, gen = kernels.rotations(program, weights, True)
    want_rot, want_gen = kernels.shift_rule_rotations(program, weights)
    np.testing.assert_allclose(rot, want_rot, atol=1e-13)
    np.testing.assert_allclose(gen, want_gen, atol=1e-13)
    np.testing.assert_array_equal(kernels.rotations(program, weights, False)[0], rot)
    np.testing.assert_array_equal(kernels.rotations_and_generators(program, weights)[1], gen)  # every executor's builder
    # and R^dagger dR/dw by central differences of the ansatz's numpy matrices
    matrices = ANSATZE[ansatz].matrices_np
    h = 1e-6
    for i in range(weights.shape[-1]):
        step = np.zeros_like(weights)
        step[..., i] = h
        derivative = (matrices(weights + step, circuit.options) - matrices(weights - step, circuit.options)) / (2 * h)
        np.testing.assert_allclose(np.conj(np.swapaxes(rot, -1, -2)) @ derivative, gen[:, :, i], atol=1e-8)


def _twin_against_pennylane(module: VQC, x: np.ndarray, acting: bool = False, nonzero_grad: bool = True) -> None:
    """The twin on the kernel path: outputs and the gradients of every parameter against the module's own
    PennyLane QNode (default.qubit, backprop)."""
    assert x.shape[0] <= kernels.max_rows(module.cfg.n_qubits)
    reference = module.to_qnode("default.qubit", diff_method="backprop")
    params = list(module.parameters())
    expected = reference(torch.from_numpy(x).to(params[0].dtype))
    coefficients = np.random.default_rng(7).normal(size=tuple(expected.shape))
    expected_grads = torch.autograd.grad((expected * torch.from_numpy(coefficients).to(expected.dtype)).sum(), params)
    twin = NumpyVQCActing(module) if acting else NumpyVQC(module)
    out, cache = twin.forward(x)
    np.testing.assert_allclose(out, expected.detach().double().numpy(), atol=TOLERANCE, rtol=0)
    if acting:
        return
    assert cache.plan.variant == "kernels"  # the statevector executor's compiled kernels
    for p in params:
        p.grad = torch.zeros_like(p)
    twin.backward(cache, coefficients)
    for (name, p), want in zip(module.named_parameters(), expected_grads):
        np.testing.assert_allclose(p.grad.double().numpy(), want.double().numpy(), atol=TOLERANCE, rtol=0, err_msg=name)
    if nonzero_grad:  # not two zero gradients
        assert np.abs(module.weights.grad.numpy()).max() > 1e-4


GRID = list(itertools.product(ENCODINGS, ANSATZE, OBSERVABLES, [2, 4, 6]))


@pytest.mark.parametrize("encoding, ansatz, observable, n", GRID)
def test_kernel_twin_parity_registered_grid(encoding, ansatz, observable, n, param_seed):
    torch.manual_seed(param_seed)
    module = VQC(n, 1 if observable == "zz" and n == 2 else 2, n_qubits=n, layers=2, encoding=encoding,
                 ansatz=ansatz, observable=observable, output="linear", scaling="atan")
    _twin_against_pennylane(module, np.random.default_rng(n).normal(size=(3, n)))


@pytest.mark.parametrize("encoding, hadamard, rotation, entangler",
                         list(itertools.product(ENCODINGS, [False, True], ["rx", "ry"], ["cnot", "cz"])))
def test_kernel_twin_parity_encoding_and_block_options(encoding, hadamard, rotation, entangler):
    torch.manual_seed(1)
    module = VQC(3, 3, n_qubits=3, layers=2, encoding=encoding, hadamard=hadamard, ansatz="basic_entangler",
                 rotation=rotation, entangler=entangler, output="relu_linear", scaling="atan")
    # some have zero weight gradients by physics (after a Hadamard, an RX encoding and RX blocks leave
    # |+> unchanged), as in the parity tests; the values and gradients still match
    _twin_against_pennylane(module, np.random.default_rng(1).normal(size=(4, 3)), nonzero_grad=False)


@pytest.mark.parametrize("n, rows, ansatz", [(8, 8, "rzryrz_ring"), (8, 1, "strongly_entangling"), (11, 1, "rzryrz_ring")])
def test_kernel_twin_parity_at_larger_widths(n, rows, ansatz):
    torch.manual_seed(n)
    module = VQC(n, 3, n_qubits=n, layers=2, ansatz=ansatz, output="relu_linear", scaling="atan")
    _twin_against_pennylane(module, np.random.default_rng(n).normal(size=(rows, n)))


@pytest.mark.parametrize("output, scaling", [("raw", "none"), ("sum", "bound"), ("linear", "atan")])
def test_kernel_acting_twin_parity_with_a_pre_layer(output, scaling):
    torch.manual_seed(3)
    module = VQC(7, 2, n_qubits=5, layers=2, preprocess="linear", output=output, scaling=scaling,
                 bounds=[1.5] + [None] * 4 if scaling == "bound" else [])
    _twin_against_pennylane(module, np.random.default_rng(3).normal(size=(3, 7)), acting=True)


def test_an_ansatz_without_pauli_axes_takes_its_numpy_matrices(monkeypatch):
    """A registered ansatz need not name its axes: the kernels then take ``matrices_np`` and the shift
    rule, with the same results."""
    torch.manual_seed(4)
    module = VQC(4, 2, n_qubits=4, layers=2, ansatz="ry_cz", output="linear")
    x = np.random.default_rng(4).normal(size=(2, 4))
    monkeypatch.setitem(ANSATZE, "ry_cz", dataclasses.replace(ANSATZE["ry_cz"], pauli_axes=None))
    assert Program.compile(module.circuit).axes is None
    _twin_against_pennylane(module, x)


def test_kernels_are_deterministic_and_rows_are_independent():
    module = VQC(6, 2, n_qubits=6, layers=3, output="linear")
    circuit = program_of(module.circuit)
    weights = np.random.default_rng(5).normal(size=tuple(module.weights.shape))
    rot, gen = kernels.rotations(circuit, weights, True)
    angles = np.random.default_rng(6).normal(size=(5, 6))
    g = np.random.default_rng(8).normal(size=(5, 6))
    first, states = kernels.forward(circuit, angles, rot, True)
    again, states_again = kernels.forward(circuit, angles, rot, True)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(kernels.weight_grad(circuit, states, g, rot, gen),
                                  kernels.weight_grad(circuit, states_again, g, rot, gen))
    # each row is its own circuit: row 3 alone gives row 3, and the rows' gradients add up
    np.testing.assert_allclose(kernels.forward(circuit, angles[3:4], rot, False)[0], first[3:4], atol=1e-15)
    parts = sum(kernels.weight_grad(circuit, states[b : b + 1], g[b : b + 1], rot, gen) for b in range(5))
    np.testing.assert_allclose(parts, kernels.weight_grad(circuit, states, g, rot, gen), atol=1e-12)
    # the final states are normalised
    np.testing.assert_allclose(np.sum(np.abs(states) ** 2, axis=1), 1.0, atol=1e-12)


def test_without_numba_the_twins_keep_the_numpy_paths(monkeypatch):
    """Where numba cannot be imported (or MARLQ_KERNELS=0), no row runs through the kernels, and the
    twins give what they gave on the kernel path."""
    torch.manual_seed(9)
    module = VQC(5, 2, n_qubits=5, layers=2, output="linear", scaling="atan")
    x = np.random.default_rng(9).normal(size=(3, 5))
    with_kernels, cache = NumpyVQC(module).forward(x)
    assert cache.plan.variant == "kernels"
    monkeypatch.setattr(kernels, "_NUMBA", None)
    monkeypatch.setenv("MARLQ_KERNELS", "0")
    assert not kernels.available() and kernels.max_rows(5) == 0
    with pytest.raises(RuntimeError, match="MARLQ_KERNELS"):
        kernels.forward(program_of(module.circuit), x, np.zeros((2, 5, 2, 2), complex), False)
    without, cache = NumpyVQC(module).forward(x)
    assert cache.plan.variant == "blocks"
    np.testing.assert_allclose(without, with_kernels, atol=1e-5)


def test_a_program_follows_replaced_buffers():
    module = VQC(4, 2, n_qubits=4, layers=1)
    program = program_of(module.circuit)
    assert program_of(module.circuit) is program
    module.circuit.readout = module.circuit.readout.clone()  # what output: born does
    assert program_of(module.circuit) is not program
    import pickle

    assert "_program" not in pickle.loads(pickle.dumps(module.circuit)).__dict__  # compiled again on first use


PROBE = """
import hashlib
import numpy as np
import torch
from circuits import VQC
from circuits.twins import NumpyVQC
h = hashlib.sha256()
for n, rows, ansatz in [(4, 1, "rzryrz_ring"), (6, 2, "strongly_entangling"), (8, 3, "rzryrz_ring"), (5, 4, "basic_entangler")]:
    torch.manual_seed(n)
    m = VQC(n, 2, n_qubits=n, layers=3, ansatz=ansatz, output="linear")
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    twin = NumpyVQC(m)
    out, cache = twin.forward(np.random.default_rng(n).normal(size=(rows, n)))
    assert cache.plan.variant == "kernels", cache.plan
    twin.backward(cache, np.random.default_rng(n + 1).normal(size=out.shape))
    h.update(np.ascontiguousarray(out).tobytes())
    for p in m.parameters():
        h.update(p.grad.numpy().tobytes())
# the seed-batched kernels (circuits.twins.SeedBatchedVQC: one compiled loop over the seeds' weight sets)
# against each seed's own twin, in the same two processes
from circuits.twins import seed_batched_twin
spec = dict(n_qubits=4, layers=2, scaling="bound", bounds=[4.8, None, 0.418, None], output="relu_linear")
mods = []
for s in range(6):
    torch.manual_seed(s)
    mods.append(VQC(4, 2, **spec))
rng = np.random.default_rng(0)
params = rng.uniform(-2, 2, size=(6, sum(p.numel() for p in mods[0].parameters()))).astype(np.float32)
x, g = rng.normal(size=(6, 2, 4)), rng.normal(size=(6, 2, 2))
entry = seed_batched_twin(mods)
out, cache = entry.forward(params, x)
grads = np.zeros(params.shape, dtype=np.float32)
entry.backward(cache, g, grads)
batched = hashlib.sha256(out.tobytes() + grads.tobytes()).hexdigest()
outs, rows = [], []
for s, m in enumerate(mods):
    entry._load(m, params[s])
    twin = NumpyVQC(m)
    o, c = twin.forward(x[s])
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    twin.backward(c, g[s])
    outs.append(o)
    rows.append(np.concatenate([p.grad.numpy().reshape(-1) for p in m.parameters()]))
print(h.hexdigest(), batched, hashlib.sha256(np.stack(outs).tobytes() + np.stack(rows).tobytes()).hexdigest())
"""


def test_a_fresh_compile_and_a_cached_load_give_the_same_bits(tmp_path):
    """numba's cache: the first process compiles the kernels and writes them, later ones load them. With
    fastmath's reassoc the two gave different last bits (the golden bytes of a quantum run depended on
    whether it was the machine's first); the outputs and every gradient must be bit-identical. In both
    processes the seed-batched kernels (one compiled loop over the seeds) give each seed its own twin's bits."""
    import subprocess
    import sys
    from pathlib import Path

    cache = tmp_path / "numba_cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("NUMBA_DISABLE_JIT", None)
    digests = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.append(done.stdout.split())
        assert list(cache.rglob("*.nbi")), "the first process wrote no cache for the second to load"
    assert digests[0] == digests[1]
    for single, batched, alone in digests:
        assert batched == alone, "a seed-batched kernel call differs from its seeds' own calls"
    assert hashlib.sha256(b"").hexdigest() not in digests[0]
