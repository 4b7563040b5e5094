"""The statevector executor's training sweep for rotations-first circuits (``statevector.training_forward``
/ ``training_backward``): the first layer's gradient from the product state's factors, the last layer's
gates folded into the readout, the later blocks' input states kept.

References: a brute-force contraction for the factors' gradients, the older sweep (``final_state`` +
``backward_sweep``, which un-applies every block) and PennyLane at the learner's shapes (an 8-qubit
MAPPO actor: linear pre- and post-layers, atan scaling, a few hundred rows).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from circuits import VQC, statevector
from circuits.program import program_of

torch.set_num_threads(1)


@pytest.mark.parametrize("n", [4, statevector.FACTOR_SPLIT_MIN_WIRES, 9])  # the walk, and the register cut in halves
def test_factor_gradients_equal_a_brute_force_contraction(n):
    rng = np.random.default_rng(3)
    batch = 5
    factors = rng.standard_normal((n, 2, batch)) + 1j * rng.standard_normal((n, 2, batch))
    lam = rng.standard_normal((2**n, batch)) + 1j * rng.standard_normal((2**n, batch))
    got = statevector.factor_gradients(lam, factors)
    for b in range(batch):
        for wire in range(n):
            for a in range(2):
                # the product state with wire's factor replaced by the basis vector e_a
                state = np.ones(1, dtype=complex)
                for j in range(n):
                    vec = np.eye(2)[a] if j == wire else factors[j, :, b]
                    state = np.kron(state, vec)
                want = np.sum(lam[:, b] * np.conj(state))
                assert abs(got[wire, a, b] - want) < 1e-12


def test_factor_gradients_are_the_derivative_of_re_lambda_dagger_psi():
    # L = Re sum conj(lam) psi: d L / d Re u = Re g and d L / d Im u = Im g (torch's convention)
    rng = np.random.default_rng(4)
    n, batch, eps = 3, 2, 1e-6
    factors = rng.standard_normal((n, 2, batch)) + 1j * rng.standard_normal((n, 2, batch))
    lam = rng.standard_normal((2**n, batch)) + 1j * rng.standard_normal((2**n, batch))
    from circuits import gates

    def loss(f):
        return float(np.sum(np.conj(lam) * gates.kron_vectors(f, batch_last=True)).real)

    g = statevector.factor_gradients(lam, factors)
    for wire, a, b in [(0, 0, 0), (1, 1, 1), (2, 0, 1)]:
        for unit, part in ((1.0, g.real), (1j, g.imag)):
            bumped = factors.copy()
            bumped[wire, a, b] += unit * eps
            assert abs((loss(bumped) - loss(factors)) / eps - part[wire, a, b]) < 1e-5


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("n, batch, first, width", [(8, 300, 0, 4), (8, 300, 4, 4), (8, 300, 2, 3), (9, 200, 5, 4),
                                                    (8, 8, 4, 4)])
def test_block_gradient_equals_a_brute_force_contraction(dtype, n, batch, first, width):
    # G[i, j] = sum over the other wires and the rows of lam[.., i, ..] conj(psi[.., j, ..]); from
    # CONJUGATING_GEMM_MIN_SIZE amplitudes BLAS reads psi conjugated in place (scipy's cgemm / zgemm),
    # below (the last case) numpy's conj copy: both against an einsum in complex128
    rng = np.random.default_rng(n + first)
    lam = (rng.standard_normal((2**n, batch)) + 1j * rng.standard_normal((2**n, batch))).astype(dtype)
    psi = (rng.standard_normal((2**n, batch)) + 1j * rng.standard_normal((2**n, batch))).astype(dtype)
    assert (lam.size >= statevector.CONJUGATING_GEMM_MIN_SIZE) == (batch > 8)
    shape = (2**first, 2**width, -1)
    want = np.einsum("aib,ajb->ij", lam.astype(np.complex128).reshape(shape), psi.astype(np.complex128).reshape(shape).conj())
    got = statevector.block_gradient(lam, psi, first, width)
    assert got.dtype == dtype and got.shape == (2**width, 2**width)
    tol = 1e-12 if dtype == np.complex128 else 2e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    # a view that is not C-contiguous takes numpy's path, with the same result
    wide = np.empty((2**n, 2 * batch), dtype=dtype)
    wide[:, ::2] = lam
    np.testing.assert_allclose(statevector.block_gradient(wide[:, ::2], psi, first, width), got, rtol=0,
                               atol=tol * np.abs(want).max())


def test_a_training_call_on_the_block_executor_loads_no_numba():
    # the blocks build their wires' matrices and generators with numpy (kernels.rotations_and_generators,
    # compiled=False): a learner whose plan never runs a compiled kernel does not pay numba's start-up
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from circuits import VQC\n"
            "m = VQC(21, 5, n_qubits=8, layers=2, preprocess='linear', output='linear', scaling='atan', engine='statevector')\n"
            "assert m.plan(1200, True).variant == 'blocks'\n"
            "m(torch.randn(1200, 21)).square().sum().backward()\n"
            "with torch.no_grad():\n"
            "    m(torch.randn(1200, 21)); m(torch.randn(48, 21)); m(torch.randn(48, 21))\n"
            "assert m.weights.grad.abs().max() > 0\n"
            "print(sorted(k for k in sys.modules if k == 'numba' or k.startswith('numba.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _outputs_and_grads(module: VQC, x: torch.Tensor, coefficients: torch.Tensor):
    out = module(x)
    grads = torch.autograd.grad((out * coefficients).sum(), list(module.parameters()))
    return out.detach(), grads


@pytest.mark.parametrize("ansatz, layers, encoding", [("strongly_entangling", 1, "angle_y"), ("strongly_entangling", 2, "angle_y"),
                                                       ("strongly_entangling", 3, "angle_x"), ("basic_entangler", 2, "angle_z"),
                                                       ("ry_cz", 2, "angle_y")])
def test_training_sweep_equals_the_unapplying_sweep(ansatz, layers, encoding, monkeypatch):
    torch.manual_seed(layers)
    module = VQC(10, 3, n_qubits=7, layers=layers, ansatz=ansatz, encoding=encoding, preprocess="linear",
                 output="linear", scaling="atan", engine="statevector")  # (engine auto may take the pauli executor)
    assert module.plan(300, True).executor == "statevector"
    assert statevector.trains_on_product(program_of(module.circuit))
    x, coefficients = torch.randn(300, 10), torch.randn(300, 3)
    new_out, new_grads = _outputs_and_grads(module, x, coefficients)
    monkeypatch.setattr(statevector, "trains_on_product", lambda program: False)
    old_out, old_grads = _outputs_and_grads(module, x, coefficients)
    torch.testing.assert_close(new_out, old_out, atol=2e-6, rtol=0)
    for (name, _), got, want in zip(module.named_parameters(), new_grads, old_grads):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_the_mappo_actor_at_learner_rows_matches_pennylane():
    # the 8-qubit actor (spread's 18 observations + 3 agent ids -> 5 actions) on 400 rows
    torch.manual_seed(0)
    module = VQC(21, 5, n_qubits=8, layers=2, preprocess="linear", output="linear", scaling="atan", engine="statevector")
    assert module.plan(400, True) == statevector_plan()
    x = torch.randn(400, 21) * 2
    reference = module.to_qnode("default.qubit", diff_method="backprop")
    coefficients = torch.randn(400, 5)
    native, native_grads = _outputs_and_grads(module, x, coefficients)
    expected = reference(x)
    expected_grads = torch.autograd.grad((expected * coefficients.to(expected.dtype)).sum(), list(module.parameters()))
    torch.testing.assert_close(native.double(), expected.detach().double(), atol=1e-5, rtol=0)
    for (name, _), got, want in zip(module.named_parameters(), native_grads, expected_grads):
        # float32 sums over 400 rows: relative to the gradient's scale
        scale = float(want.abs().max())
        torch.testing.assert_close(got.double(), want.double(), atol=4e-5 * max(scale, 1.0), rtol=1e-4,
                                   msg=lambda m: f"{name}: {m}")
    assert float(native_grads[[n for n, _ in module.named_parameters()].index("weights")].abs().max()) > 1e-3


def statevector_plan():
    from circuits.planner import Plan

    return Plan("statevector", "adjoint", "blocks")
