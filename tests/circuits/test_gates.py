"""Gate matrices and single layers of the native engine against PennyLane's own matrices (qml.matrix)."""
from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch

from circuits import gates
from circuits.engine import CompiledCircuit, apply_block, kron_matrices
from circuits.spec import ENCODINGS, make_config

torch.set_num_threads(1)
RNG = np.random.default_rng(7)


def matrix_of_ops(ops: list, n: int) -> np.ndarray:
    """PennyLane's matrix of a gate list applied in order, wire 0 most significant."""

    def apply_all() -> None:
        for op in ops:
            qml.apply(op)

    return qml.matrix(apply_all, wire_order=list(range(n)))()


def circuit_unitary(cfg, weights: torch.Tensor) -> np.ndarray:
    """U of the trainable part alone, from the native engine run on the basis states."""
    compiled = CompiledCircuit(cfg, torch.complex128)
    psi = torch.eye(2**cfg.n_qubits, dtype=torch.complex128)
    for layer in range(cfg.layers):
        psi = compiled.trainable_layer(psi, weights, layer)
    return psi.numpy().T  # row k is U|k>, so the transpose is U


@pytest.mark.parametrize("axis, gate", [("rx", qml.RX), ("ry", qml.RY), ("rz", qml.RZ)])
def test_rotation_matrices_match_pennylane(axis, gate):
    angles = RNG.uniform(-4, 4, size=5)
    ours = gates.rotation_matrices(axis, torch.tensor(angles), torch.complex128).numpy()
    for angle, matrix in zip(angles, ours):
        np.testing.assert_allclose(matrix, qml.matrix(gate(angle, wires=0)), atol=1e-12)


def test_rot_matches_pennylane_rot():
    weights = RNG.uniform(-4, 4, size=(6, 3))
    ours = gates.rot_matrices(torch.tensor(weights), torch.complex128).numpy()
    for w, matrix in zip(weights, ours):
        np.testing.assert_allclose(matrix, qml.matrix(qml.Rot(*w, wires=0)), atol=1e-12)


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("hadamard", [False, True])
def test_encoding_state_map_gives_the_encoded_state(encoding, hadamard):
    gate = {"rx": qml.RX, "ry": qml.RY, "rz": qml.RZ}[ENCODINGS[encoding].axis]
    state_map = gates.encoding_state_map(encoding, hadamard)
    for angle in RNG.uniform(-4, 4, size=4):
        matrix = qml.matrix(gate(angle, wires=0))
        if hadamard:
            matrix = matrix @ qml.matrix(qml.Hadamard(wires=0))
        expected = matrix[:, 0]  # the gates applied to |0>
        np.testing.assert_allclose(state_map @ [np.cos(angle / 2), np.sin(angle / 2)], expected, atol=1e-12)
        ours = gates.encoding_gate_matrices(encoding, hadamard, torch.tensor(angle), torch.complex128).numpy()
        np.testing.assert_allclose(ours, matrix, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("entangler, gate", [("cnot", qml.CNOT), ("cz", qml.CZ)])
def test_signed_permutation_matches_gate_product(n, entangler, gate):
    pairs = [(entangler, i, (i + 1) % n) for i in range(n)]
    inverse, sign = gates.signed_permutation(pairs, n)
    matrix = np.eye(2**n)[inverse] * sign[:, None]  # rows: psi'[j] = sign[j] psi[inv[j]]
    tape_ops = [gate(wires=[c, t]) for _, c, t in pairs]
    expected = matrix_of_ops(tape_ops, n)
    np.testing.assert_allclose(matrix, expected, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layers", [1, 3])
def test_strongly_entangling_unitary_matches_template(n, layers):
    cfg = make_config(n_qubits=n, layers=layers, ansatz="strongly_entangling")
    weights = torch.tensor(RNG.uniform(-3, 3, size=(layers, n, 3)))
    expected = qml.matrix(qml.StronglyEntanglingLayers(weights.numpy(), wires=range(n)), wire_order=list(range(n)))
    np.testing.assert_allclose(circuit_unitary(cfg, weights), expected, atol=1e-10)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("rotation, gate", [("rx", qml.RX), ("ry", qml.RY), ("rz", qml.RZ)])
def test_basic_entangler_unitary_matches_template(n, rotation, gate):
    cfg = make_config(n_qubits=n, layers=2, ansatz="basic_entangler", rotation=rotation)
    weights = torch.tensor(RNG.uniform(-3, 3, size=(2, n, 1)))
    template = qml.BasicEntanglerLayers(weights[..., 0].numpy(), wires=range(n), rotation=gate)
    expected = qml.matrix(template, wire_order=list(range(n)))
    np.testing.assert_allclose(circuit_unitary(cfg, weights), expected, atol=1e-10)


def test_rzryrz_ring_unitary_matches_hand_listed_gates():
    n, layers = 4, 2
    cfg = make_config(n_qubits=n, layers=layers, ansatz="rzryrz_ring")
    weights = RNG.uniform(-3, 3, size=(layers, n, 3))
    ops = []
    for layer in range(layers):  # Koelle et al.: CNOT 0->1->2->3->0, then RZ RY RZ per qubit
        ops += [qml.CNOT(wires=[0, 1]), qml.CNOT(wires=[1, 2]), qml.CNOT(wires=[2, 3]), qml.CNOT(wires=[3, 0])]
        for q in range(n):
            ops += [qml.RZ(weights[layer, q, 0], wires=q), qml.RY(weights[layer, q, 1], wires=q), qml.RZ(weights[layer, q, 2], wires=q)]
    expected = matrix_of_ops(ops, n)
    np.testing.assert_allclose(circuit_unitary(cfg, torch.tensor(weights)), expected, atol=1e-10)


def test_apply_block_matches_kronecker_product():
    n = 4
    psi = torch.tensor(RNG.normal(size=(3, 16)) + 1j * RNG.normal(size=(3, 16)))
    for first, width in [(0, 1), (2, 1), (3, 1), (1, 2), (0, 4)]:
        matrix = torch.tensor(RNG.normal(size=(2**width,) * 2) + 1j * RNG.normal(size=(2**width,) * 2))
        full = np.kron(np.kron(np.eye(2**first), matrix.numpy()), np.eye(2 ** (n - first - width)))
        np.testing.assert_allclose(apply_block(psi, matrix, first, width, n).numpy(), psi.numpy() @ full.T, atol=1e-12)
        per_sample = matrix.expand(3, -1, -1)  # the batched branch: one matrix per state
        np.testing.assert_allclose(apply_block(psi, per_sample, first, width, n).numpy(), psi.numpy() @ full.T, atol=1e-12)


def test_kron_matrices_matches_numpy_kron():
    matrices = torch.tensor(RNG.normal(size=(2, 3, 2, 2)) + 1j * RNG.normal(size=(2, 3, 2, 2)))
    for b in range(2):
        expected = np.kron(np.kron(matrices[b, 0].numpy(), matrices[b, 1].numpy()), matrices[b, 2].numpy())
        np.testing.assert_allclose(kron_matrices(matrices)[b].numpy(), expected, atol=1e-12)


def test_kron_vectors_is_the_kronecker_product():
    vectors = torch.tensor(RNG.normal(size=(3, 4, 2)))
    for b in range(3):
        expected = vectors[b, 0].numpy()
        for q in range(1, 4):
            expected = np.kron(expected, vectors[b, q].numpy())
        np.testing.assert_allclose(gates.kron_vectors(vectors)[b].numpy(), expected, atol=1e-12)


def test_readout_matrix_hand_computed_two_qubits():
    # basis |00>, |01>, |10>, |11>: Z_0 = +1 +1 -1 -1, Z_1 = +1 -1 +1 -1
    np.testing.assert_array_equal(gates.readout_matrix("z", 2), [[1, 1], [1, -1], [-1, 1], [-1, -1]])
    np.testing.assert_array_equal(gates.readout_matrix("zz", 2), [[1], [-1], [-1], [1]])
    np.testing.assert_array_equal(gates.readout_matrix("p0", 2), [[1, 1], [1, 0], [0, 1], [0, 0]])


@pytest.mark.parametrize("n, batch", [(4, 1), (4, 3), (6, 1), (6, 2), (8, 1), (8, 40), (12, 1)])
def test_numpy_block_kernels_match_kronecker_products(n, batch):
    """circuits.statevector's apply_block and block_gradient in every layout they switch between (one GEMM on
    the first wires, the rows by matrix^T for one column, gathered or summed products for the gradient)
    against the block written out as a 2^n x 2^n Kronecker product."""
    from circuits import statevector as adjoint

    psi = RNG.normal(size=(2**n, batch)) + 1j * RNG.normal(size=(2**n, batch))
    lam = RNG.normal(size=(2**n, batch)) + 1j * RNG.normal(size=(2**n, batch))
    for first, width in adjoint.block_layout(n) + [(1, 2), (n - 1, 1)]:
        d = 2**width
        matrix = RNG.normal(size=(d, d)) + 1j * RNG.normal(size=(d, d))
        full = np.kron(np.kron(np.eye(2**first), matrix), np.eye(2 ** (n - first - width)))
        np.testing.assert_allclose(adjoint.apply_block(psi, matrix, first, width), full @ psi, atol=1e-10)
        stacked = np.stack([psi, lam])  # the backward pass's (2, 2^n, B)
        np.testing.assert_allclose(adjoint.apply_block(stacked, matrix, first, width)[1], full @ lam, atol=1e-10)
        # G[i, j] = sum lam[.., i, ..] conj(psi[.., j, ..]) over the other wires and the batch
        view = lambda a: a.reshape(2**first, d, 2 ** (n - first - width), batch)
        expected = np.einsum("aicb,ajcb->ij", view(lam), view(psi).conj())
        np.testing.assert_allclose(adjoint.block_gradient(lam, psi, first, width), expected, atol=1e-9)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_partial_trace_selector_gives_every_wires_partial_trace(width):
    from circuits.statevector import partial_trace_selector

    d = 2**width
    h = RNG.normal(size=(d, d)) + 1j * RNG.normal(size=(d, d))
    got = (h.reshape(-1) @ partial_trace_selector(width)).reshape(width, 2, 2)
    for i in range(width):
        view = h.reshape(2**i, 2, 2 ** (width - i - 1), 2**i, 2, 2 ** (width - i - 1))
        np.testing.assert_allclose(got[i], np.einsum("airajr->ij", view), atol=1e-12)


def test_kron_rows_is_the_kronecker_product_of_every_wire_in_order():
    """gates.kron_vectors(batch_last=True) (pairs of wires, then a balanced tree) for every wire count it splits
    differently, real and complex, against numpy's kron row by row."""
    kron_rows = lambda vectors: gates.kron_vectors(vectors, batch_last=True)  # noqa: E731

    for n in range(1, 12):
        vectors = RNG.normal(size=(n, 2, 3)) + 1j * RNG.normal(size=(n, 2, 3)) * (n % 2)
        got = kron_rows(vectors)
        for b in range(3):
            expected = vectors[0, :, b]
            for wire in range(1, n):
                expected = np.kron(expected, vectors[wire, :, b])
            np.testing.assert_allclose(got[:, b], expected, atol=1e-12)


@pytest.mark.parametrize("n", [1, 3, 8, 9])
def test_the_product_state_builder_gives_the_same_state_in_every_form(n):
    """gates.product_state, the one builder: fused (torch and numpy), Kronecker (torch and numpy, batch first
    and last) and encoded by F, against the cosine formula r_k = prod_i cos(t_i/2 - bit_i(k) pi/2)."""
    angles = RNG.uniform(-4, 4, size=(3, n))
    bits = gates.basis_bits(n)
    want = np.prod(np.cos(angles[:, None, :] / 2 - bits[None] * np.pi / 2), axis=-1)
    shifts = bits.T * (np.pi / 2)
    np.testing.assert_allclose(gates.product_state(angles, bit_shifts=shifts), want, atol=1e-12)
    np.testing.assert_allclose(gates.product_state(torch.from_numpy(angles), bit_shifts=torch.from_numpy(shifts)).numpy(),
                               want, atol=1e-12)
    np.testing.assert_allclose(gates.product_state(angles), want, atol=1e-12)
    np.testing.assert_allclose(gates.product_state(torch.from_numpy(angles)).numpy(), want, atol=1e-12)
    np.testing.assert_allclose(gates.product_state(angles, batch_last=True).T, want, atol=1e-12)
    state_map = gates.encoding_state_map("angle_y", True)
    got = gates.product_state(angles, state_map=state_map)
    full = np.ones((1, 1))
    for _ in range(n):
        full = np.kron(full, state_map)
    np.testing.assert_allclose(got, want @ full.T, atol=1e-12)
