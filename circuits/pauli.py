"""The ``pauli`` executor: a shallow circuit's readouts in the Heisenberg picture, as torch ops.

Every shipped ansatz is single-qubit rotations and CNOT/CZ gates, and every readout is diagonal: a
sum of Z strings. Without re-uploading the data enters only in the encoding, whose state is a
product of one-qubit states; so is the state after a first layer of rotations (an ansatz whose
rotations come first). Pushed back through the rest of the circuit, a readout O becomes an operator
that depends on the weights alone:

    <psi(x)| U^dagger O U |psi(x)> = sum_t c_t(weights) prod_k b_k(x)[P_tk],

a sum over Pauli strings P_t, each string's expectation on the product state the product over wires
of the wire's Bloch vector component (b_k = (1, <X>, <Y>, <Z>) of wire k's state). The CNOT/CZ gates
map a Pauli string to one Pauli string with a sign (they are Clifford gates); a layer of one-qubit
rotations maps each wire's Pauli a to sum_b R[a, b] P_b, R the rotation's 3 x 3 adjoint matrix
(``layer_adjoints``), so a string with s non-identity wires becomes at most 3^s strings. The
strings and which coefficient feeds which are found once per circuit structure (``compile_pauli``,
from the ansatz's gate list and the readouts' Z strings: ``observable_z_strings``); a call then costs:

- the weights' side (no batch axis): per layer each wire's 3 x 3 matrix, and per layer one product of
  gathered entries per string transition, summed into the next layer's coefficients;
- the data's side: the wires' Bloch vectors (the encoding's, turned by the first layer when it is
  absorbed), and each needed string's product over wires, built as a tree of pairwise products over
  halves of the register (each node the sub-strings it needs, once), then each string's row, times its
  coefficient, added into its readout (most strings feed one readout: ``PauliProgram.pairs``).

Outputs and every gradient (weights, angles, hence input scales and a pre-layer) come from torch's
autograd on these few ops. It is exact: the same numbers as the state vector to float rounding, at
O(T) per row rather than O(L 2^n): the planner takes it where the strings are few (``Facts.pauli_cost``;
e.g. 8 qubits, 2 layers of ``strongly_entangling``, <Z_i> readouts: 288 strings against 256 amplitudes
per layer, each touched by a 16 x 16 block per layer). Deep circuits fan out (3^s per wire set per
layer): past ``MAX_TRANSITIONS`` it does not apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from circuits import kernels
from circuits.blocks import ANSATZE, OBSERVABLES, LayerOptions

MAX_TRANSITIONS = 200_000  # string-to-string transitions over all layers past which the structure is not compiled
MAX_STRINGS = 20_000  # the most final strings (columns of the (B, T) product)

_PAULIS = np.array([np.eye(2), [[0, 1], [1, 0]], [[0, -1j], [1j, 0]], [[1, 0], [0, -1]]], dtype=np.complex128)
_GATES = {
    "cnot": np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=np.complex128),
    "cz": np.diag([1.0, 1.0, 1.0, -1.0]).astype(np.complex128),
}


def _conjugation_table(gate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """G^dagger (P_c (x) P_t) G = s (Q_c (x) Q_t) for the 16 two-wire Pauli pairs: (images (16, 2), signs (16,))."""
    images, signs = np.zeros((16, 2), np.int64), np.zeros(16)
    pairs = [(a, b) for a in range(4) for b in range(4)]
    for code, (a, b) in enumerate(pairs):
        conj = gate.conj().T @ np.kron(_PAULIS[a], _PAULIS[b]) @ gate
        for qa, qb in pairs:
            overlap = np.trace(np.kron(_PAULIS[qa], _PAULIS[qb]) @ conj) / 4.0
            if abs(overlap) > 0.5:
                assert abs(overlap.imag) < 1e-12 and abs(abs(overlap.real) - 1.0) < 1e-12
                images[code], signs[code] = (qa, qb), overlap.real
    return images, signs


_TABLES = {name: _conjugation_table(g) for name, g in _GATES.items()}


@dataclass(frozen=True, eq=False)
class RotationStep:
    """One layer of rotations pushed back: new coefficients[dst] += old[src] * prod(table[factors])."""

    layer: int
    src: np.ndarray  # (E,) int64: the transition's input string
    dst: np.ndarray  # (E,) int64: its output string (of this step's ``size``)
    factors: np.ndarray  # (E, n) int64: per wire an entry of the layer's flat (n, 3, 3) table, or n * 9 (a 1)
    size: int


@dataclass(frozen=True, eq=False)
class CliffordStep:
    """A layer's CNOT/CZ gates pushed back: new coefficients = old[order] * sign (a signed permutation)."""

    order: np.ndarray  # (S,) int64
    sign: np.ndarray  # (S,) float64


@dataclass(frozen=True, eq=False)
class Node:
    """A tree node over wires [lo, hi): the values of its ``size`` sub-strings are left[li] * right[ri]
    (a leaf: rows ``li`` of the flat (4n, B) Bloch table). ``left_rows`` / ``right_rows``: where a child
    is a leaf, the table's rows its side reads directly (torch int64, built once)."""

    size: int
    li: np.ndarray
    ri: Optional[np.ndarray] = None
    left: Optional["Node"] = None
    right: Optional["Node"] = None

    def __post_init__(self) -> None:
        take = lambda child, index: torch.as_tensor(child.li[index] if child.left is None else index)  # noqa: E731
        # (normal tensors even where the structure is compiled under torch.inference_mode, e.g. by a first call
        # while acting: an inference tensor cannot be saved for a later training call's backward)
        with torch.inference_mode(False):
            object.__setattr__(self, "rows", torch.as_tensor(self.li))
            if self.left is not None:
                object.__setattr__(self, "left_rows", take(self.left, self.li))
                object.__setattr__(self, "right_rows", take(self.right, self.ri))


@dataclass(frozen=True, eq=False)
class PauliProgram:
    """What a call of the ``pauli`` executor reads (``compile_pauli``)."""

    n_qubits: int
    layers: int
    ansatz: str
    options: LayerOptions
    absorbed: bool  # the first layer's rotations are folded into the Bloch vectors (rotations-first ansatz)
    start: np.ndarray  # (S0, m): the readouts' Z-string coefficients
    steps: tuple  # RotationStep | CliffordStep, in the order they are applied to the coefficients
    strings: np.ndarray  # (T, n) int8: the final strings (0 I, 1 X, 2 Y, 3 Z)
    tree: Node  # the product tree whose root's columns are ``strings``
    bloch: np.ndarray  # (3, 3): e_a(t) = bloch[a, 0] + bloch[a, 1] cos t + bloch[a, 2] sin t (the encoded qubit)
    transitions: int  # the rotation steps' transitions (the weights' side of a call)
    pairs: np.ndarray  # (2, P) int64: the (string, readout) entries of the coefficients that can be nonzero

    def __post_init__(self) -> None:
        # what every call reads, built once (normal tensors even under torch.inference_mode: see Node)
        with torch.inference_mode(False):
            object.__setattr__(self, "pair_strings", torch.as_tensor(self.pairs[0]))
            object.__setattr__(self, "pair_readouts", torch.as_tensor(self.pairs[1]))
            object.__setattr__(self, "pairs_are_rows", bool(np.array_equal(self.pairs[0], np.arange(self.strings.shape[0]))))
            for step in self.steps:
                index = (step.order,) if isinstance(step, CliffordStep) else (step.src, step.dst, step.factors)
                object.__setattr__(step, "tensors", tuple(torch.as_tensor(a) for a in index))
        object.__setattr__(self, "flat", _flatten(self.tree, 4 * self.n_qubits, self.pairs))
        object.__setattr__(self, "_constants", {})

    def constants(self, dtype: torch.dtype) -> dict[str, Any]:
        """The weights side's constant tensors in ``dtype``, built once per dtype (each call converted them
        from numpy: about a tenth of a call's fixed cost): ``start``, the Clifford steps' ``signs``, ``one``,
        and, for an ansatz whose wires' matrices are Pauli rotations, their ``generators`` K and K^2
        (``layer_adjoints``) and ``eye``."""
        built = self._constants.get(dtype)
        if built is None:
            with torch.inference_mode(False):
                built = {"start": torch.as_tensor(self.start, dtype=dtype), "one": torch.ones(1, dtype=dtype),
                         "signs": [torch.as_tensor(step.sign, dtype=dtype)[:, None] if isinstance(step, CliffordStep)
                                   else None for step in self.steps]}
                axes = ANSATZE[self.ansatz].pauli_axes
                if axes is not None:
                    generators = np.stack([_GENERATORS[a] for a in axes(self.options)])
                    built.update(generators=torch.as_tensor(generators, dtype=dtype),
                                 squares=torch.as_tensor(generators @ generators, dtype=dtype),
                                 eye=torch.eye(3, dtype=dtype))
            self._constants[dtype] = built
        return built

    @property
    def cost(self) -> int:
        """What a row costs, in products: the tree's nodes' sub-strings (``Facts.pauli_cost``)."""
        total, stack = 0, [self.tree]
        while stack:
            node = stack.pop()
            if node.left is not None:
                total += node.size
                stack += [node.left, node.right]
        return total + self.pairs.shape[1]


@dataclass(frozen=True, eq=False)
class FlatTree:
    """The tree as the compiled kernels read it (``circuits.numba_kernels.pauli_readouts``): values V are
    the Bloch table's ``nt`` rows, then the internal nodes' entries in post-order, entry e being
    V[left[e]] * V[right[e]]; ``pair_src`` is the V row of each (string, readout) pair's string, ``pair_read``
    its readout."""

    left: np.ndarray
    right: np.ndarray
    pair_src: np.ndarray
    pair_read: np.ndarray


def _flatten(tree: Node, nt: int, pairs: np.ndarray) -> FlatTree:
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    end = [nt]  # the next free V row

    def rows(node: Node) -> np.ndarray:  # the V rows of the node's entries
        if node.left is None:
            return node.li
        lrows, rrows = rows(node.left), rows(node.right)
        left.append(lrows[node.li])
        right.append(rrows[node.ri])
        end[0] += node.size
        return np.arange(end[0] - node.size, end[0])

    root = rows(tree)
    empty = np.zeros(0, np.int64)
    as_index = lambda parts: np.ascontiguousarray(np.concatenate(parts) if parts else empty, dtype=np.int64)  # noqa: E731
    return FlatTree(as_index(left), as_index(right), as_index([root[pairs[0]]]), as_index([pairs[1]]))


def _clifford_step(strings: np.ndarray, pairs: list[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Push strings (S, n) back through gates ``pairs`` (applied in order): G^dagger P G for the last first."""
    out, sign = strings.astype(np.int64).copy(), np.ones(strings.shape[0])
    for gate, control, target in reversed(pairs):
        images, signs = _TABLES[gate]
        code = out[:, control] * 4 + out[:, target]
        out[:, control], out[:, target] = images[code, 0], images[code, 1]
        sign *= signs[code]
    return out.astype(np.int8), sign


def _unique(strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows (U, n) and each row's index into them."""
    unique, inverse = np.unique(strings, axis=0, return_inverse=True)
    return unique, inverse.reshape(-1)


def _rotation_step(strings: np.ndarray, layer: int, n: int) -> tuple[np.ndarray, RotationStep]:
    """Push strings back through a layer of one-qubit rotations: each non-identity wire's a -> b in X, Y, Z."""
    src, out, factors = [], [], []
    for index, row in enumerate(strings):
        wires = np.nonzero(row)[0]
        count = 3 ** len(wires)
        choices = np.array(np.meshgrid(*[[1, 2, 3]] * len(wires), indexing="ij")).reshape(len(wires), -1).T if len(wires) else np.zeros((1, 0), np.int64)
        images = np.repeat(row[None, :].astype(np.int64), count, axis=0)
        images[:, wires] = choices
        factor = np.full((count, n), n * 9, np.int64)
        factor[:, wires] = wires[None, :] * 9 + (row[wires][None, :] - 1) * 3 + (choices - 1)
        src.append(np.full(count, index))
        out.append(images)
        factors.append(factor)
    images = np.concatenate(out)
    unique, dst = _unique(images)
    return unique.astype(np.int8), RotationStep(layer, np.concatenate(src), dst, np.concatenate(factors), unique.shape[0])


def _tree(strings: np.ndarray, lo: int, hi: int) -> tuple[Node, np.ndarray]:
    """The product tree over wires [lo, hi) of the sub-strings ``strings[:, lo:hi]`` (each string's id)."""
    if hi - lo == 1:
        codes, ids = np.unique(strings[:, lo], return_inverse=True)
        return Node(len(codes), (4 * lo + codes).astype(np.int64)), ids.reshape(-1)
    mid = (lo + hi) // 2
    left, lid = _tree(strings, lo, mid)
    right, rid = _tree(strings, mid, hi)
    pairs, ids = _unique(np.stack([lid, rid], axis=1))
    return Node(pairs.shape[0], pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64), left, right), ids


def observable_z_strings(observable: str, n_qubits: int) -> tuple[np.ndarray, np.ndarray]:
    """A registered observable family's readouts as Z strings (the Walsh-Hadamard transform of its readout
    matrix, in O(m): no 2^n table): readout j is value(prod_{i in wires_j} Z_i), and any function
    of a +-1 eigenvalue is affine in it, value(z) = (v(1) + v(-1)) / 2 + (v(1) - v(-1)) / 2 z."""
    family = OBSERVABLES[observable]
    wires = family.wires(n_qubits)
    high, low = (float(v) for v in family.value(np.array([1.0, -1.0])))
    strings = [np.zeros(n_qubits, np.int8)]
    for readout in wires:
        string = np.zeros(n_qubits, np.int8)
        string[list(readout)] = 3
        strings.append(string)
    start = np.zeros((len(strings), len(wires)))
    start[0] = (high + low) / 2.0
    start[1 + np.arange(len(wires)), np.arange(len(wires))] = (high - low) / 2.0
    codes, index = _unique(np.stack(strings))
    merged = np.zeros((codes.shape[0], len(wires)))
    np.add.at(merged, index, start)
    keep = np.any(merged != 0.0, axis=1)
    return codes[keep], merged[keep]


def compile_pauli(n_qubits: int, layers: int, ansatz_name: str, options: LayerOptions,
                  z_strings: tuple[np.ndarray, np.ndarray], state_map: np.ndarray) -> Optional[PauliProgram]:
    """The ``pauli`` executor's structure for a circuit without re-uploading whose readouts are the Z strings
    ``z_strings`` (codes (S, n), coefficients (S, m): ``observable_z_strings``), or
    None where it fans out past ``MAX_TRANSITIONS`` / ``MAX_STRINGS`` (the planner then takes another executor)."""
    ansatz = ANSATZE[ansatz_name]
    codes, start = z_strings
    if codes.shape[0] > MAX_STRINGS:
        return None
    absorbed = not ansatz.entangle_first
    steps: list = []
    strings, transitions = codes, 0
    for layer in reversed(range(layers)):
        pairs = ansatz.pairs(n_qubits, layer, options)
        parts = ["rotate", "entangle"] if ansatz.entangle_first else ["entangle", "rotate"]
        for part in parts:  # the layer's operations, last applied first
            if part == "entangle" and pairs:
                strings, sign = _clifford_step(strings, pairs)
                unique, order = _unique(strings)  # a bijection: only the order changes
                inverse = np.empty_like(order)
                inverse[order] = np.arange(order.size)
                steps.append(CliffordStep(inverse, sign[inverse]))
                strings = unique
            elif part == "rotate" and not (absorbed and layer == 0):
                fan_out = int(np.sum(3 ** np.count_nonzero(strings, axis=1)))
                transitions += fan_out
                if transitions > MAX_TRANSITIONS:
                    return None
                strings, step = _rotation_step(strings, layer, n_qubits)
                steps.append(step)
                if strings.shape[0] > MAX_STRINGS:
                    return None
    tree, ids = _tree(strings, 0, n_qubits)
    assert np.array_equal(ids, np.arange(strings.shape[0]))  # the root's sub-strings are the sorted strings
    return PauliProgram(n_qubits, layers, ansatz_name, options, absorbed, start, tuple(steps), strings, tree,
                        encoded_bloch(state_map), transitions, np.stack(np.nonzero(_pattern(start, steps))))


def _pattern(start: np.ndarray, steps: list) -> np.ndarray:
    """Which final coefficients (T, m) can be nonzero: the readouts' strings carried through the steps."""
    pattern = start != 0
    for step in steps:
        if isinstance(step, CliffordStep):
            pattern = pattern[step.order]
        else:
            out = np.zeros((step.size, pattern.shape[1]), dtype=bool)
            np.logical_or.at(out, step.dst, pattern[step.src])
            pattern = out
    return pattern


def compile_circuit(circuit, observable: str) -> Optional[PauliProgram]:
    """``compile_pauli`` of a ``circuits.engine.CompiledCircuit`` whose readouts are the registered family
    ``observable`` (its buffers hold the encoding)."""
    return compile_pauli(circuit.n_qubits, circuit.layers, circuit.ansatz, circuit.options,
                         observable_z_strings(observable, circuit.n_qubits),
                         circuit._buffers["state_map"].cpu().numpy().astype(np.complex128))


def encoded_bloch(state_map: np.ndarray) -> np.ndarray:
    """(3, 3) constants of the encoded qubit's Bloch vector: the state F (cos(t/2), sin(t/2)) has
    <P_a> = c^T Re(F^dagger P_a F) c = alpha + beta cos t + gamma sin t."""
    out = np.zeros((3, 3))
    for a in range(3):
        g = (state_map.conj().T @ _PAULIS[a + 1] @ state_map).real
        out[a] = ((g[0, 0] + g[1, 1]) / 2.0, (g[0, 0] - g[1, 1]) / 2.0, (g[0, 1] + g[1, 0]) / 2.0)
    return out


def heisenberg_matrices(matrices: torch.Tensor) -> torch.Tensor:
    """(..., 2, 2) unitaries V -> (..., 3, 3) real R with V^dagger P_a V = sum_b R[a, b] P_b (a, b: X, Y, Z)."""
    paulis = torch.as_tensor(_PAULIS[1:], dtype=matrices.dtype, device=matrices.device)
    conj = matrices.conj().transpose(-1, -2).unsqueeze(-3) @ paulis @ matrices.unsqueeze(-3)  # (..., 3, 2, 2)
    a01 = conj[..., 0, 1]
    return torch.stack([a01.real, -a01.imag, (conj[..., 0, 0].real - conj[..., 1, 1].real) / 2.0], dim=-1)


_GENERATORS = {  # K_P with the adjoint of R_P(w) = exp(-i w P / 2) equal to I + sin(w) K_P + (1 - cos(w)) K_P^2
    "rx": np.array([[0, 0, 0], [0, 0, -1], [0, 1, 0]], dtype=np.float64),
    "ry": np.array([[0, 0, 1], [0, 0, 0], [-1, 0, 0]], dtype=np.float64),
    "rz": np.array([[0, -1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.float64),
}


def layer_adjoints(program: PauliProgram, weights: torch.Tensor, complex_dtype: torch.dtype) -> torch.Tensor:
    """Each layer's and wire's 3 x 3 adjoint matrix (L, n, 3, 3) (``heisenberg_matrices`` of its 2 x 2). For an
    ansatz whose wires' matrices are Pauli rotations (``Ansatz.pauli_axes``: every shipped one) in real
    arithmetic, Rodrigues' formula per rotation and their product (the adjoint of A B is adj(A) adj(B)): a
    fraction of the complex route's small torch ops, which is a call's fixed cost."""
    ansatz = ANSATZE[program.ansatz]
    if ansatz.pauli_axes is None:
        return heisenberg_matrices(ansatz.matrices(weights, program.options, complex_dtype))
    constants = program.constants(weights.dtype)
    generators = constants["generators"]  # (k, 3, 3)
    each = (constants["eye"] + torch.sin(weights)[..., None, None] * generators
            + (1.0 - torch.cos(weights))[..., None, None] * constants["squares"])  # (L, n, k, 3, 3)
    out = each[..., -1, :, :]
    for i in range(generators.shape[0] - 2, -1, -1):  # adj(A_(k-1)) ... adj(A_0)
        out = out @ each[..., i, :, :]
    return out


def _values(node: Node, table: torch.Tensor) -> torch.Tensor:
    """The node's sub-string values (size, B) from the flat Bloch table (4n, B), batch last: every gather
    is of whole rows (and its backward an add of whole rows)."""
    if node.left is None:
        return table.index_select(0, node.rows)
    left = table if node.left.left is None else _values(node.left, table)
    right = table if node.right.left is None else _values(node.right, table)
    return left.index_select(0, node.left_rows) * right.index_select(0, node.right_rows)


def weights_side(program: PauliProgram, weights: torch.Tensor, complex_dtype: torch.dtype,
                 real: torch.dtype, compiled: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a call computes from the weights alone: the final strings' coefficients (T, m) and the first
    layer's 3 x 3 matrices (n, 3, 3), which turn the encoded Bloch vectors when ``absorbed``. ``compiled``:
    ``WeightsSide``'s compiled loops (None: where numba runs, on CPU tensors, for an ansatz whose wires'
    matrices are Pauli rotations), or torch ops with autograd (False), the route it is tested against."""
    if compiled is None:
        compiled = (weights.device.type == "cpu" and ANSATZE[program.ansatz].pauli_axes is not None
                    and kernels.available())
    if compiled:
        return WeightsSide.apply(weights, program, real)
    rotations = layer_adjoints(program, weights, complex_dtype).to(real)  # (L, n, 3, 3)
    constants = program.constants(real)
    coefficients, one = constants["start"], constants["one"]  # (S0, m)
    for step, sign in zip(program.steps, constants["signs"]):
        if isinstance(step, CliffordStep):
            coefficients = coefficients[step.tensors[0]] * sign
            continue
        src, dst, factors = step.tensors
        table = torch.cat([rotations[step.layer].reshape(-1), one])
        scale = table[factors].prod(dim=1)  # (E,)
        coefficients = torch.zeros(step.size, coefficients.shape[1], dtype=real).index_add(
            0, dst, coefficients[src] * scale[:, None])
    return coefficients, rotations[0]


class WeightsSide(torch.autograd.Function):
    """``weights_side`` as compiled loops (``numba_kernels.pauli_adjoints``, ``pauli_rotation_step`` and their
    backwards), float64 inside, for an ansatz whose wires' matrices are Pauli rotations: the same arithmetic
    as the torch route, whose twenty-odd small ops and autograd nodes were a call's fixed cost (8 qubits, 2
    layers: 0.26 ms forward and backward; numpy in their place, some forty calls, 0.20).

    Forward: each rotation's adjoint M = I + sin(w) K + (1 - cos(w)) K^2 and a wire's product M_(k-1) ...
    M_0; the coefficients pushed back step by step. Backward: a Clifford step's signed permutation
    transposed; a rotation step new[dst] += old[src] * prod_j table[factors[:, j]] gives old's gradient and
    each table entry's (the other factors' product); a wire's product by its partial products."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, program: PauliProgram, real: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        compiled = kernels._compiled()
        constants = program.constants(torch.float64)
        w = weights.detach().numpy().astype(np.float64)  # (L, n, k)
        each, rotations = compiled.pauli_adjoints(w, constants["generators"].numpy(), constants["squares"].numpy())
        coefficients = program.start.astype(np.float64)
        saved, tables = [], []
        for step in program.steps:
            saved.append(coefficients)
            if isinstance(step, CliffordStep):
                coefficients = coefficients[step.order] * step.sign[:, None]
                tables.append(None)
                continue
            table = np.append(rotations[step.layer].reshape(-1), 1.0)
            tables.append(table)
            coefficients = compiled.pauli_rotation_step(coefficients, step.src, step.dst, step.factors, table, step.size)
        ctx.program, ctx.dtype = program, weights.dtype
        ctx.arrays = (w, each, saved, tables)
        dtype = _NUMPY_REAL[real]
        return torch.from_numpy(coefficients.astype(dtype)), torch.from_numpy(rotations[0].astype(dtype))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_coefficients: torch.Tensor, grad_first: torch.Tensor):
        compiled, program = kernels._compiled(), ctx.program
        w, each, saved, tables = ctx.arrays
        n = program.n_qubits
        grad_rotations = np.zeros((w.shape[0], n, 3, 3))
        grad_rotations[0] = grad_first.numpy()
        g = grad_coefficients.numpy().astype(np.float64)
        for step, old, table in zip(reversed(program.steps), reversed(saved), reversed(tables)):
            if isinstance(step, CliffordStep):  # (a permutation: every old string is one new string)
                back = np.empty_like(old)
                back[step.order] = g * step.sign[:, None]
                g = back
                continue
            grad_table = np.zeros(9 * n + 1)
            g = compiled.pauli_rotation_step_backward(np.ascontiguousarray(g), old, step.src, step.dst, step.factors,
                                                      table, grad_table)
            grad_rotations[step.layer] += grad_table[: 9 * n].reshape(n, 3, 3)
        constants = program.constants(torch.float64)
        grad_weights = compiled.pauli_adjoints_backward(w, each, grad_rotations, constants["generators"].numpy(),
                                                        constants["squares"].numpy())
        return torch.from_numpy(grad_weights.astype(_NUMPY_REAL[ctx.dtype])), None, None


_NUMPY_REAL = {torch.float32: np.float32, torch.float64: np.float64}


# rows per block of the compiled data side, the tree's values of a block staying in the core's cache: the
# backward keeps two arrays of them (values and gradients), the forward one, and a forward's per-row loop
# overheads fall with longer rows (8 qubits, 2 layers, 1,200 rows, one core: forward 0.116 / 0.096 / 0.086 /
# 0.079 ms at 128 / 192 / 256 / 384 rows a block; backward 0.307 / 0.310 / 0.326 / 1.07 ms). The forward's
# bits do not depend on its block; the backward's sums over rows do (lane by lane).
BLOCK = 128
BLOCK_FORWARD = 256


def _kernel_inputs(program: PauliProgram, angles: np.ndarray, first: Optional[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The compiled data side's arrays: the angles' cosines and sines (n, B) (numpy's vectorised ufuncs),
    the first layer's matrices (n, 3, 3) (the identity where they are not ``absorbed``) and the encoded
    qubit's Bloch constants, all in the angles' dtype."""
    turns = np.ascontiguousarray(angles.T)  # (n, B)
    dtype = turns.dtype
    matrices = np.broadcast_to(np.eye(3, dtype=dtype), (program.n_qubits, 3, 3)) if first is None else first
    return np.cos(turns), np.sin(turns), np.ascontiguousarray(matrices, dtype=dtype), program.bloch.astype(dtype)


def compiled_readouts(program: PauliProgram, arrays: tuple[np.ndarray, ...], pair_coef: np.ndarray) -> np.ndarray:
    """Readouts (m, B) by the compiled data side from ``_kernel_inputs``' arrays and the pairs' coefficients:
    ``TreeReadouts``' forward, and a call without a gradient."""
    cos, sin, matrices, bloch = arrays
    flat = program.flat
    return kernels._compiled().pauli_readouts(cos, sin, bloch, matrices, flat.left, flat.right, flat.pair_src,
                                              flat.pair_read, pair_coef, program.start.shape[1], BLOCK_FORWARD)


class TreeReadouts(torch.autograd.Function):
    """The whole data side as two compiled loops (``numba_kernels.pauli_readouts`` and its backward): readouts
    (m, B) from the encoding angles (B, n), the first layer's matrices (n, 3, 3) when ``absorbed`` (else None)
    and each (string, readout) pair's coefficient (P,). The same arithmetic as ``data_side``'s torch route
    (the Bloch table, its tree of products, the sums), in blocks of rows (``BLOCK_FORWARD``, ``BLOCK``), with
    no (T, B) intermediate in memory, and none of the route's small torch ops (the table's cosines, sines,
    matrix products and concatenation, each with its autograd node): the backward recomputes a block's
    values rather than keeping them. Only the angles' cosines and sines are computed outside, by numpy."""

    @staticmethod
    def forward(ctx, angles: torch.Tensor, first: Optional[torch.Tensor], pair_coef: torch.Tensor,
                program: PauliProgram) -> torch.Tensor:
        ctx.program, ctx.absorbed = program, first is not None
        ctx.arrays = _kernel_inputs(program, angles.detach().numpy(), None if first is None else first.detach().numpy())
        ctx.save_for_backward(pair_coef)
        return torch.from_numpy(compiled_readouts(program, ctx.arrays, pair_coef.detach().numpy()))

    @staticmethod
    @once_differentiable  # (a second derivative through the loops is refused, not silently zero)
    def backward(ctx, grad: torch.Tensor):
        pair_coef, = ctx.saved_tensors
        cos, sin, matrices, bloch = ctx.arrays
        flat = ctx.program.flat
        grad_angles, grad_first, grad_coef = kernels._compiled().pauli_readouts_backward(
            cos, sin, bloch, matrices, flat.left, flat.right, flat.pair_src, flat.pair_read, pair_coef.detach().numpy(),
            np.ascontiguousarray(grad.detach().numpy()), BLOCK)
        return (torch.from_numpy(grad_angles).T, torch.from_numpy(grad_first) if ctx.absorbed else None,
                torch.from_numpy(grad_coef), None)


def data_side(program: PauliProgram, angles: torch.Tensor, coefficients: torch.Tensor, first: torch.Tensor,
              compiled: Optional[bool] = None) -> torch.Tensor:
    """Readouts (B, m) of angles (B, n) from ``weights_side``'s coefficients and first-layer matrices.
    ``compiled``: the whole data side as ``TreeReadouts``' compiled loops (None: where numba runs, on CPU
    tensors), or as torch ops (False), the route every gradient is also tested by."""
    if compiled is None:
        compiled = angles.device.type == "cpu" and kernels.available()
    if compiled:
        pair_coef = coefficients[program.pair_strings, program.pair_readouts]
        first = first if program.absorbed else None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (angles, first, pair_coef)):
            return TreeReadouts.apply(angles, first, pair_coef.contiguous(), program).T
        arrays = _kernel_inputs(program, angles.detach().numpy(), None if first is None else first.detach().numpy())
        return torch.from_numpy(compiled_readouts(program, arrays, np.ascontiguousarray(pair_coef.detach().numpy())).T)
    n = program.n_qubits
    constants = torch.as_tensor(program.bloch, dtype=angles.dtype)
    turns = angles.T  # (n, B)
    bloch = (constants[:, 0, None, None] + constants[:, 1, None, None] * torch.cos(turns)
             + constants[:, 2, None, None] * torch.sin(turns)).transpose(0, 1)  # (n, 3, B)
    if program.absorbed:
        bloch = first @ bloch  # wire k: R_k (3 x 3) @ its Bloch vectors (3, B)
    table = torch.cat([torch.ones_like(bloch[:, :1]), bloch], dim=1).reshape(4 * n, angles.shape[0])
    values = _values(program.tree, table)  # (T, B)
    strings, readouts = program.pair_strings, program.pair_readouts
    if not program.pairs_are_rows:
        values = values.index_select(0, strings)
    # each string's sum into its readout(s): the coefficients are sparse (most strings feed one readout)
    weighted = values * coefficients[strings, readouts][:, None]
    out = torch.zeros(coefficients.shape[1], angles.shape[0], dtype=values.dtype).index_add(0, readouts, weighted)
    return out.T


def forward(program: PauliProgram, angles: torch.Tensor, weights: torch.Tensor, complex_dtype: torch.dtype) -> torch.Tensor:
    """Readouts (B, m) of encoding angles (B, n) at weights (L, n, k), differentiable in both."""
    return data_side(program, angles, *weights_side(program, weights, complex_dtype, angles.dtype))
