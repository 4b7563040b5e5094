"""The ``pauli`` executor (circuits/pauli.py): its pieces against brute force, its readouts and gradients
against PennyLane, and where the planner takes it."""
from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch

from circuits import VQC, gates, pauli
from circuits.blocks import CircuitConfigError, LayerOptions
from circuits.planner import Plan
from tests.circuits.test_parity import assert_parity

torch.set_num_threads(1)
PAULIS = pauli._PAULIS


def dense_string(codes) -> np.ndarray:
    out = np.ones((1, 1), dtype=np.complex128)
    for code in codes:
        out = np.kron(out, PAULIS[code])
    return out


def gate_matrix(pairs, n: int) -> np.ndarray:
    """The product of CNOT/CZ gates applied in order, as a dense 2^n x 2^n matrix (from the engine's own
    signed permutation: psi' = psi[inverse] * sign)."""
    inverse, sign = gates.signed_permutation(pairs, n)
    out = np.zeros((2**n, 2**n), dtype=np.complex128)
    out[np.arange(2**n), inverse] = sign
    return out


def test_clifford_steps_equal_conjugation_by_the_dense_gates():
    rng = np.random.default_rng(0)
    n = 4
    for trial in range(40):
        pairs = [(str(rng.choice(["cnot", "cz"])), *map(int, rng.choice(n, 2, replace=False))) for _ in range(5)]
        strings = rng.integers(0, 4, size=(6, n)).astype(np.int8)
        images, signs = pauli._clifford_step(strings, pairs)
        u = gate_matrix(pairs, n)
        for string, image, sign in zip(strings, images, signs):
            np.testing.assert_allclose(u.conj().T @ dense_string(string) @ u, sign * dense_string(image), atol=1e-12)


def walsh_z_strings(readout: np.ndarray, n_qubits: int, tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """The brute-force reference: a diagonal readout matrix (2^n, m) (wire 0 the most significant bit) as Z
    strings by its Walsh-Hadamard transform: (codes (S, n), coefficients (S, m))."""
    m = readout.shape[1]
    table = np.asarray(readout, dtype=np.float64).reshape((2,) * n_qubits + (m,))
    for axis in range(n_qubits):  # (v0, v1) -> ((v0 + v1) / 2, (v0 - v1) / 2): the coefficient of I, of Z
        a, b = np.take(table, 0, axis=axis), np.take(table, 1, axis=axis)
        table = np.stack([(a + b) / 2.0, (a - b) / 2.0], axis=axis)
    flat = table.reshape(-1, m)
    keep = np.nonzero(np.any(np.abs(flat) > tol, axis=1))[0]
    bits = (keep[:, None] >> (n_qubits - 1 - np.arange(n_qubits))[None, :]) & 1
    return (3 * bits).astype(np.int8), flat[keep]


def rebuilt(codes, coefficients) -> np.ndarray:
    return sum(np.real(np.diag(dense_string(c)))[:, None] * coefficients[s] for s, c in enumerate(codes))


@pytest.mark.parametrize("observable, n", [(o, n) for o in ("z", "zz", "p0") for n in (1, 2, 3, 5)
                                           if not (o == "zz" and n == 1)])  # (zz needs two qubits)
def test_observable_z_strings_are_the_readout_matrix(observable, n):
    readout = gates.readout_matrix(observable, n)
    codes, coefficients = pauli.observable_z_strings(observable, n)
    np.testing.assert_allclose(rebuilt(codes, coefficients), readout, atol=1e-12)
    want_codes, want = walsh_z_strings(readout, n)
    order = np.lexsort(want_codes.T[::-1])
    np.testing.assert_array_equal(codes, want_codes[order])
    np.testing.assert_allclose(coefficients, want[order], atol=1e-12)


def test_heisenberg_matrices_rotate_the_paulis():
    torch.manual_seed(0)
    from circuits.blocks import ANSATZE

    matrices = ANSATZE["strongly_entangling"].matrices(torch.randn(5, 3, dtype=torch.float64), LayerOptions("rx", "cnot"),
                                                       torch.complex128)
    rotations = pauli.heisenberg_matrices(matrices).numpy()
    for v, r in zip(matrices.numpy(), rotations):
        for a in range(3):
            want = v.conj().T @ PAULIS[a + 1] @ v
            np.testing.assert_allclose(sum(r[a, b] * PAULIS[b + 1] for b in range(3)), want, atol=1e-12)


@pytest.mark.parametrize("ansatz", ["strongly_entangling", "rzryrz_ring", "basic_entangler", "ry_cz"])
@pytest.mark.parametrize("rotation", ["rx", "ry", "rz"])
def test_real_layer_adjoints_equal_the_complex_route(ansatz, rotation):
    torch.manual_seed(5)
    from circuits.blocks import ANSATZE

    module = VQC(5, 3, n_qubits=5, layers=3, ansatz=ansatz, rotation=rotation, engine="pauli", output="linear", dtype="complex128")
    weights = torch.randn(module.weights.shape, dtype=torch.float64)
    program = module.pauli_program()
    want = pauli.heisenberg_matrices(ANSATZE[ansatz].matrices(weights, program.options, torch.complex128))
    torch.testing.assert_close(pauli.layer_adjoints(program, weights, torch.complex128), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("encoding, hadamard", [("angle_x", False), ("angle_y", True), ("angle_z", True), ("angle_z", False)])
def test_encoded_bloch_vectors(encoding, hadamard):
    state_map = gates.encoding_state_map(encoding, hadamard)
    constants = pauli.encoded_bloch(state_map)
    for t in np.linspace(-3.0, 3.0, 7):
        state = state_map @ np.array([np.cos(t / 2), np.sin(t / 2)])
        want = [np.vdot(state, PAULIS[a + 1] @ state).real for a in range(3)]
        np.testing.assert_allclose(constants[:, 0] + constants[:, 1] * np.cos(t) + constants[:, 2] * np.sin(t), want, atol=1e-12)


# every ansatz (rotations first, and rzryrz_ring's entanglers first), the encodings, Hadamards and the
# readout families, at sizes where the executor applies
CASES = [
    dict(n_qubits=5, layers=2, ansatz="strongly_entangling", encoding="angle_x", observable="z"),
    dict(n_qubits=5, layers=3, ansatz="strongly_entangling", encoding="angle_y", hadamard=True, observable="zz"),
    dict(n_qubits=4, layers=2, ansatz="rzryrz_ring", encoding="angle_z", hadamard=True, observable="p0"),
    dict(n_qubits=5, layers=2, ansatz="ry_cz", encoding="angle_y", observable="z"),
    dict(n_qubits=5, layers=2, ansatz="ry_cz", entangler="cz", rotation="ry", encoding="angle_x", observable="z"),
    dict(n_qubits=4, layers=3, ansatz="basic_entangler", rotation="ry", encoding="angle_x", observable="zz"),
    dict(n_qubits=6, layers=1, ansatz="basic_entangler", entangler="cz", encoding="angle_y", observable="z"),
    dict(n_qubits=2, layers=2, ansatz="strongly_entangling", encoding="angle_x", observable="zz"),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s['ansatz']}-{s['n_qubits']}q{s['layers']}L-{s['observable']}")
@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
def test_parity_with_pennylane(spec, dtype):
    torch.manual_seed(1)
    module = VQC(spec["n_qubits"], 3, engine="pauli", output="linear", dtype=dtype, **spec)
    assert module.plan(7, True) == Plan("pauli", "autograd")
    x = torch.randn(7, spec["n_qubits"], dtype=torch.float64 if dtype == "complex128" else torch.float32)
    assert_parity(module, x)


def test_parity_with_trainable_scaling_and_a_pre_layer():
    torch.manual_seed(2)
    module = VQC(9, 4, n_qubits=5, layers=2, engine="pauli", preprocess="linear", scaling="trainable",
                 output="scaled", observable="z", dtype="complex128")
    assert_parity(module, torch.randn(6, 9, dtype=torch.float64))


def test_the_mappo_actor_at_learner_rows_takes_it_and_matches_pennylane():
    # the 8-qubit actor (spread's 18 observations + 3 agent ids -> 5 actions) at a learner's rows,
    # under engine auto; PennyLane's reference on a few of them, the state vector's blocks on all
    torch.manual_seed(0)
    spec = dict(n_qubits=8, layers=2, preprocess="linear", output="linear", scaling="atan")
    module = VQC(21, 5, **spec)
    assert module.plan(1200, True) == Plan("pauli", "autograd")
    assert module.plan(48, True).executor == "statevector"  # few rows: the blocks' fixed cost is the lower
    x = torch.randn(1200, 21) * 2
    forced = VQC(21, 5, engine="pauli", **spec)
    forced.load_state_dict(module.state_dict())
    assert_parity(forced, x[:5].clone())
    blocks = VQC(21, 5, engine="statevector", **spec)
    blocks.load_state_dict(module.state_dict())
    coefficients = torch.randn(1200, 5)
    got = module(x)
    got_grads = torch.autograd.grad((got * coefficients).sum(), list(module.parameters()))
    want = blocks(x)
    want_grads = torch.autograd.grad((want * coefficients).sum(), list(blocks.parameters()))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for (name, _), a, b in zip(module.named_parameters(), got_grads, want_grads):
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, atol=4e-5 * max(scale, 1.0), rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_the_string_count_of_two_strongly_entangling_layers():
    # <Z_i> pushed back through the last layer's CNOTs (reach 2 on 8 wires) is a Z string on 2-4 wires
    # (wires 2..7: 2, 2, 3, 3, 4, 4; wires 0, 1: 3, 3); each wire then fans out to X, Y, Z: 3^s strings, all distinct
    program = VQC(8, 5, n_qubits=8, layers=2, output="linear").pauli_program()
    assert program.strings.shape[0] == sum(3**s for s in (3, 3, 2, 2, 3, 3, 4, 4)) == 288
    assert program.transitions == 288


def test_engine_pauli_refuses_cuda():
    # checked before the device is built, so it holds on a machine without CUDA too
    from circuits.spec import make_config

    module = VQC(8, 3, n_qubits=8, layers=2, output="linear")
    module.cfg = make_config(n_qubits=8, layers=2, output="linear", engine="pauli", device="cuda")
    with pytest.raises(CircuitConfigError, match="device: cuda"):
        module._check_pauli(module.cfg)


def test_engine_pauli_refuses_what_it_cannot_run():
    for spec, words in [(dict(reupload=True), "reupload"), (dict(shots=100), "shots"), (dict(layers=4), "fan out"),
                        (dict(output="born"), "born"),
                        (dict(backend="pennylane"), "pennylane"), (dict(noise={"depolarizing": 0.01}), "noise")]:
        with pytest.raises(CircuitConfigError, match=words):
            VQC(8, 3, **{"n_qubits": 8, "layers": 2, "engine": "pauli", **spec})


def test_a_head_pickles_without_its_structure_and_computes_the_same_after():
    torch.manual_seed(3)
    module = VQC(8, 3, n_qubits=8, layers=2, engine="pauli", output="linear")
    x = torch.randn(5, 8)
    before = module(x)
    assert "_pauli" in module.circuit.__dict__
    copy = pickle.loads(pickle.dumps(module))
    assert "_pauli" not in copy.circuit.__dict__
    torch.testing.assert_close(copy(x), before, atol=0, rtol=0)


def test_up_to_four_qubits_engine_auto_never_compiles_it():
    for n, layers in itertools.product([1, 2, 3, 4], [1, 2]):
        module = VQC(n, 2, n_qubits=n, layers=layers, output="linear")
        assert module.pauli_program() is None
        assert module.facts().pauli_cost == 0


@pytest.mark.parametrize("spec", CASES + [dict(n_qubits=1, layers=2, ansatz="rzryrz_ring", encoding="angle_x", observable="z")],
                         ids=lambda s: f"{s['ansatz']}-{s['n_qubits']}q{s['layers']}L-{s['observable']}")
@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
def test_the_compiled_tree_equals_the_torch_route(spec, dtype):
    # the compiled loops of both sides (WeightsSide, TreeReadouts) against the same arithmetic as torch ops with
    # autograd: outputs and the gradients in the angles and the weights, at row counts on and off the loops'
    # blocks of rows
    if not pauli.kernels.available():
        pytest.skip("numba is off here (MARLQ_KERNELS=0): the compiled loops do not run")
    torch.manual_seed(2)
    module = VQC(spec["n_qubits"], 3, engine="pauli", output="linear", dtype=dtype, **spec)
    program = module.pauli_program()
    flat, nt = program.flat, 4 * spec["n_qubits"]
    entries = np.arange(flat.left.size)
    assert np.all(flat.left < nt + entries) and np.all(flat.right < nt + entries)  # each entry's factors come first
    real = torch.float64 if dtype == "complex128" else torch.float32
    tolerance = 1e-12 if dtype == "complex128" else 2e-5
    for rows in (1, pauli.BLOCK, pauli.BLOCK_FORWARD + 45, 2 * pauli.BLOCK_FORWARD + 45):
        angles = (torch.rand(rows, spec["n_qubits"], dtype=real) * 6.0).requires_grad_()
        results = []
        for compiled in (True, False):
            side = pauli.weights_side(program, module.weights, module.circuit.complex_dtype, real, compiled=compiled)
            out = pauli.data_side(program, angles, *side, compiled=compiled)
            coefficients = torch.randn(out.shape, dtype=real, generator=torch.Generator().manual_seed(rows))
            results.append((out, *torch.autograd.grad((out * coefficients).sum(), [angles, module.weights])))
        for got, want in zip(*results):
            assert float(want.abs().max()) > 1e-3
            torch.testing.assert_close(got, want, atol=tolerance * max(1.0, float(want.abs().max())), rtol=0)


def test_a_second_derivative_through_the_compiled_tree_is_refused():
    if not pauli.kernels.available():
        pytest.skip("numba is off here (MARLQ_KERNELS=0): the compiled loops do not run")
    module = VQC(8, 3, n_qubits=8, layers=2, output="linear", engine="pauli")
    x = torch.randn(5, 8, requires_grad=True)
    grad, = torch.autograd.grad(module(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_the_planners_cost_model():
    from circuits.planner import Facts, plan

    mappo_actor = Facts(8, layers=2, pauli_cost=729)  # 8 qubits, 2 strongly_entangling layers, 8 <Z_i>
    assert plan(mappo_actor, 48, True).executor == "statevector"  # its fixed cost per call dominates
    assert plan(mappo_actor, 1200, True) == Plan("pauli", "autograd")
    assert plan(mappo_actor, 1200, False) == Plan("pauli", "autograd")
    # an act keeps the weights side: from 8 qubits it takes the pauli executor where its products are few
    assert plan(mappo_actor, 48, False) == Plan("pauli", "autograd")
    assert plan(mappo_actor, 1, False) == Plan("pauli", "autograd")
    assert plan(Facts(8, layers=2, pauli_cost=41069), 48, False).executor == "statevector"  # rzryrz_ring's strings
    assert plan(Facts(7, layers=2, pauli_cost=500), 48, False).executor != "pauli"  # up to 7: the blocks, then dense
    assert plan(Facts(6, layers=3, pauli_cost=6811), 5000, True).executor != "pauli"  # too many strings
    assert plan(Facts(5, layers=2, pauli_cost=366), 5000, True).executor != "pauli"
    for facts in [Facts(8, layers=2, pauli_cost=729, engine="statevector"), Facts(8, layers=2, pauli_cost=729, device="cuda"),
                  Facts(4, layers=2, pauli_cost=50), Facts(8, layers=2, pauli_cost=0),
                  Facts(8, layers=2, pauli_cost=729, hardware=True, analytic=False)]:
        assert plan(facts, 5000, True).executor != "pauli", facts
    assert plan(Facts(8, layers=2, pauli_cost=729), 1200, True, entry="numpy").executor != "pauli"  # the twins: no pauli
    # ... and a twin plans as if it were not there: 12 qubits (no dense matrix) keeps the state vector's blocks
    assert plan(Facts(12, layers=1, pauli_cost=50), 5000, True, entry="numpy") == Plan("statevector", "adjoint", "blocks")
    assert plan(Facts(5, layers=9, pauli_cost=1, engine="pauli"), 1, False) == Plan("pauli", "autograd")


def test_a_structure_compiled_under_inference_mode_trains():
    # a head's first call may be an act under torch.inference_mode, which compiles the structure
    torch.manual_seed(4)
    module = VQC(8, 3, n_qubits=8, layers=2, output="linear")  # engine auto: compiled on the first call
    x = torch.randn(1200, 8)
    with torch.inference_mode():
        acted = module(x)
    assert module.plan(1200, True) == Plan("pauli", "autograd")
    out = module(x)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), acted, atol=0, rtol=0)
    assert float(module.weights.grad.abs().max()) > 0


def test_an_act_keeps_the_weights_side_and_gives_a_training_calls_bits(monkeypatch):
    # without a gradient the weights side is computed once per weights (an actor's rollout), and the readouts
    # are the bits the learner's training call recomputes at the same weights; a weight change in place
    # (a worker's flat buffer) computes it again
    torch.manual_seed(5)
    module = VQC(8, 3, n_qubits=8, layers=2, output="linear")
    calls = []
    original = pauli.weights_side
    monkeypatch.setattr(pauli, "weights_side", lambda *args: calls.append(1) or original(*args))
    x = torch.randn(1200, 8)  # (a training call takes the pauli executor from some hundreds of rows)
    assert module.plan(48, False) == module.plan(1200, False) == module.plan(1200, True) == Plan("pauli", "autograd")
    for _ in range(2):
        with torch.inference_mode():
            acted = module(x)
        with torch.no_grad():
            again = module(x[:48])
        assert len(calls) == 1
        trained = module(x)
        assert len(calls) == 2
        torch.testing.assert_close(trained.detach(), acted, atol=0, rtol=0)
        torch.testing.assert_close(again, acted[:48], atol=0, rtol=0)
        with torch.no_grad():
            module.weights.add_(0.3)
        calls.clear()
    with torch.no_grad():
        reference = VQC(8, 3, n_qubits=8, layers=2, output="linear", engine="statevector")
        reference.load_state_dict(module.state_dict())
        torch.testing.assert_close(module(x), reference(x), atol=2e-6, rtol=0)


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s['ansatz']}-{s['n_qubits']}q{s['layers']}L-{s['observable']}")
def test_the_compiled_weights_side_passes_gradcheck(spec):
    # WeightsSide's hand-written backward against finite differences, in float64, at weights where some
    # rotation entries are exactly 0 (w = 0, pi: the other factors' products must not divide by them)
    if not pauli.kernels.available():
        pytest.skip("numba is off here (MARLQ_KERNELS=0): the compiled loops do not run")
    torch.manual_seed(3)
    module = VQC(spec["n_qubits"], 3, engine="pauli", output="linear", dtype="complex128", **spec)
    program = module.pauli_program()
    weights = module.weights.detach().clone()
    weights.view(-1)[::3] = 0.0
    weights.view(-1)[1::5] = np.pi
    weights.requires_grad_()
    assert torch.autograd.gradcheck(lambda w: pauli.WeightsSide.apply(w, program, torch.float64), (weights,))
