"""The adjoint state-vector path of the native engine: one forward sweep, one backward sweep, no graph.

A circuit without re-uploading is: an encoded product state psi_0 = F^{(x)n} r(x) (r real, F the
encoding's fixed 2x2, ``gates.encoding_state_map``), then per layer a signed permutation E_l
(the CNOT/CZ gates) and a Kronecker product K_l of per-wire 2x2 matrices, read out as
probabilities |psi_L|^2. ``StatevectorAdjoint`` runs that on a (B, 2^n) complex state:

- forward: K_l is applied as a few Kronecker *blocks* of up to ``BLOCK_WIDTH`` neighbouring wires
  (one 2^w x 2^w matrix each, one GEMM on the state viewed as (B 2^first, 2^w, 2^rest)); E_l is
  one gather. Only the final state is kept: memory O(B 2^n), whatever the depth.
- backward (the adjoint method): with lambda = dL/dpsi_L (torch's convention, 2 g psi_L for
  L = sum g |psi|^2), walk the layers from the end, un-applying every block to the state
  (psi_in = K^dagger psi_out: unitary, nothing stored) and to lambda, and contracting
  G = sum_batch lambda_out psi_in^dagger (a 2^w x 2^w matrix per block). A weight's gradient is
  Re sum conj(G) dK/dw, where dK/dw is the block with that wire's matrix replaced by its
  derivative, 0.5 R(w + pi) for a Pauli-rotation angle (the rule the dense path's analytic
  gradient uses). lambda at the start gives the gradient of r, through which autograd reaches
  the encoding angles (and a ``preprocess: linear`` layer).

Everything runs in numpy on the CPU tensors' memory: the block matrices and their derivatives (a few
16 x 16 matrices, complex128, cast to the state's dtype) are built on each call from the weights,
and the sweeps are numpy GEMMs and gathers, so a training step pays neither autograd bookkeeping nor
torch's per-op dispatch (several microseconds per op, the whole cost at small batches).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuits.blocks import ANSATZE

if TYPE_CHECKING:
    from circuits.engine import CompiledCircuit

BLOCK_WIDTH = 4  # wires per Kronecker block: a 16 x 16 GEMM per block
_BLAS_SINGLE_THREAD = False


def single_thread_blas() -> None:
    """Numpy's BLAS to one thread, once per process, on the first call of a numpy engine path. Its
    GEMMs here (16 x 16 blocks against a few thousand columns) gain nothing from threads, and
    OpenBLAS's spinning workers cost 6x the CPU time of one thread on a busy 2-core machine (1.29 vs
    0.21 ms for a block at B = 600); a process pinned to one CPU (``marlq bench quantum --peers``)
    lost up to 80x. torch's own pool is left alone (``torch.set_num_threads``)."""
    global _BLAS_SINGLE_THREAD
    if not _BLAS_SINGLE_THREAD:
        _BLAS_SINGLE_THREAD = True
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")


def block_layout(n_qubits: int, width: int = BLOCK_WIDTH) -> list[tuple[int, int]]:
    """(first wire, width) of each block: ceil(n / width) blocks of near-equal width, wire 0 first."""
    count = -(-n_qubits // width)
    base, extra = divmod(n_qubits, count)
    layout, first = [], 0
    for b in range(count):
        w = base + (1 if b < extra else 0)
        layout.append((first, w))
        first += w
    return layout


def kron_matrices(matrices: Any) -> Any:
    """Kronecker product over wires of per-wire matrices: (..., n, 2, 2) -> (..., 2^n, 2^n), wire 0 first;
    torch tensors or numpy arrays (``circuits.engine`` re-exports it)."""
    out = matrices[..., 0, :, :]
    for wire in range(1, matrices.shape[-3]):
        size = out.shape[-1] * 2
        out = (out[..., :, None, :, None] * matrices[..., wire, None, :, None, :]).reshape(*out.shape[:-2], size, size)
    return out


GATHERED_APPLY_MAX_REST = 8  # apply_block: from 2 to this many columns per block row, one gathered GEMM


def apply_block(psi: np.ndarray, matrix: np.ndarray, first: int, width: int) -> np.ndarray:
    """matrix (2^w, 2^w) on wires first..first+w-1 of states psi (..., 2^n, B), batch last.

    Viewed as (2^first, 2^w, R) with R = 2^rest B: one GEMM when first = 0, else 2^first GEMMs of
    (2^w, 2^w) x (2^w, R). For a few columns (the last wires of a few rows: an actor acting on 3
    agents' observations) those small products cost more than one GEMM of the rows (2^first R, 2^w)
    by matrix^T, gathered by a transposed copy (none needed when R = 1): 2.5x faster at 12 qubits
    and one row, 1.4x at 8 qubits and 3 rows; from ``GATHERED_APPLY_MAX_REST`` columns the copies cost more."""
    shape = psi.shape
    d, rows = 2**width, 2**first
    rest = shape[-2] * shape[-1] // (rows * d)
    if rows == 1 or rest >= GATHERED_APPLY_MAX_REST:
        return (matrix @ psi.reshape(*shape[:-2], rows, d, rest)).reshape(shape)
    if rest == 1:
        return (psi.reshape(*shape[:-2], rows, d) @ matrix.T).reshape(shape)
    lead = psi.size // (rows * d * rest)
    gathered = np.ascontiguousarray(psi.reshape(lead * rows, d, rest).swapaxes(-1, -2)).reshape(-1, d)
    out = (gathered @ matrix.T).reshape(lead * rows, rest, d).swapaxes(-1, -2)
    return np.ascontiguousarray(out).reshape(shape)


GATHERED_GRADIENT_MAX_REST = 32  # block_gradient: below this many columns per block row, one gathered GEMM


def block_gradient(lam: np.ndarray, psi: np.ndarray, first: int, width: int) -> np.ndarray:
    """G[i, j] = sum over every other index of lam[.., i, ..] conj(psi[.., j, ..]) on the block's wires;
    lam, psi (2^n, B). For few columns per block row (R = 2^rest B < ``GATHERED_GRADIENT_MAX_REST``) the
    other indices are gathered into one GEMM (2^w, 2^first R) x (2^first R, 2^w): 2^first small products
    summed were 13x slower for the last wires of one row at 12 qubits, and 1.3x faster from R = 64."""
    d, rows = 2**width, 2**first
    if rows == 1:
        return lam.reshape(d, -1) @ psi.reshape(d, -1).conj().T
    rest = lam.size // (rows * d)
    lam, psi = lam.reshape(rows, d, rest), psi.reshape(rows, d, rest)
    if rest < GATHERED_GRADIENT_MAX_REST:
        return lam.swapaxes(0, 1).reshape(d, -1) @ psi.swapaxes(0, 1).reshape(d, -1).conj().T
    return (lam @ psi.conj().swapaxes(-1, -2)).sum(0)


_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (complex64 -> complex64, ...)."""
    if dtype not in _NUMPY_DTYPES:
        _NUMPY_DTYPES[dtype] = torch.empty((), dtype=dtype).numpy().dtype
    return _NUMPY_DTYPES[dtype]


_SHIFTS: dict[int, np.ndarray] = {}


def rotations_and_generators(circuit: "CompiledCircuit", weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each wire's matrix R (L, n, 2, 2) at weights (L, n, k), and for each weight g = R^dagger dR/dw
    (L, n, k, 2, 2), with dR/dw = R(w + pi) / 2 for a Pauli-rotation angle; numpy complex128. Both
    analytic gradients use it: the dense path's (``CompiledCircuit.dense_adjoint``) and the adjoint
    path's (``BlockMatrices``). For an ansatz that names its Pauli axes, one compiled call
    (``kernels.pauli_rotations``: 5 us against 30-60 us here, a tenth of a 12-qubit training step at one
    row); else the ansatz's ``matrices_np`` at the weights and at each weight shifted by pi."""
    from circuits import kernels

    built = kernels.pauli_rotations(circuit, weights, True)
    return shift_rule_rotations(circuit, weights) if built is None else built


def shift_rule_rotations(circuit: "CompiledCircuit", weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rotations_and_generators`` from the ansatz's ``matrices_np`` alone: at the weights and at each
    weight shifted by pi."""
    k = weights.shape[-1]
    if k not in _SHIFTS:  # the weights, then each shifted by pi
        _SHIFTS[k] = np.concatenate([np.zeros((1, k)), np.pi * np.eye(k)])
    matrices = ANSATZE[circuit.ansatz].matrices_np(weights[:, :, None, :] + _SHIFTS[k], circuit.options)
    rotations = matrices[:, :, 0]  # (L, n, 1 + k, 2, 2): at the weights, then each shifted
    return rotations, 0.5 * (np.conj(np.swapaxes(rotations, -1, -2))[:, :, None] @ matrices[:, :, 1:])


def width_groups(layout: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(first wire, width, count) of each run of neighbouring blocks of one width (``block_layout`` gives
    at most two: the wider blocks first)."""
    groups: list[list[int]] = []
    for first, width in layout:
        if groups and groups[-1][1] == width:
            groups[-1][2] += 1
        else:
            groups.append([first, width, 1])
    return [(first, width, count) for first, width, count in groups]


class BlockMatrices:
    """The blocks of every layer at given weights, and their derivatives in each weight (numpy). Blocks of
    one width are built and differentiated together (``width_groups``): at one row the per-block numpy
    calls were most of a training step's cost."""

    def __init__(self, circuit: "CompiledCircuit", weights: np.ndarray, with_derivatives: bool) -> None:
        layers = weights.shape[0]
        if with_derivatives:
            rotations, self.generators = rotations_and_generators(circuit, weights)
        else:
            rotations = ANSATZE[circuit.ansatz].matrices_np(weights, circuit.options)  # (L, n, 2, 2)
        dtype = numpy_dtype(circuit.complex_dtype)
        self.layout = circuit.adjoint_layout
        self.shape = weights.shape
        # the first layer's rotation of each wire times the encoding's 2 x 2 (final_state, rotations first)
        self.first_wires = (None if circuit.entangle_first or not layers
                            else (rotations[0] @ circuit.state_map.numpy()).astype(dtype))
        self.groups = width_groups(self.layout)
        self.exact: list[np.ndarray] = []  # per group: (L, count, 2^w, 2^w) complex128
        self.blocks: list[np.ndarray] = []  # per block: (L, 2^w, 2^w) in the state's dtype
        self.adjoints: list[np.ndarray] = []  # their conjugate transposes (un-applying a block)
        for first, width, count in self.groups:
            exact = kron_matrices(rotations[:, first : first + width * count].reshape(layers, count, width, 2, 2))
            block = exact.astype(dtype)
            adjoints = np.ascontiguousarray(block.conj().swapaxes(-1, -2))
            self.exact.append(exact)
            self.blocks += [block[:, b] for b in range(count)]
            self.adjoints += [adjoints[:, b] for b in range(count)]

    def weight_gradient(self, grads: list[np.ndarray]) -> np.ndarray:
        """d loss / d weights (L, n, k) from each block's G (L, 2^w, 2^w), torch's convention for complex grads.

        A weight of wire i changes the block K to K Gen (Gen = g on wire i, the identity elsewhere,
        g = R^dagger dR/dw), so its gradient Re sum conj(G) (K Gen) is Re sum conj(H_i) g with H = K^dagger G
        and H_i its partial trace over the block's other wires: per group of blocks of one width, one
        GEMM for H, one for every wire's partial trace (``partial_trace_selector``) and one contraction
        with the generators."""
        layers, _, k = self.shape
        out = np.empty(self.shape)
        start = 0
        for (first, width, count), exact in zip(self.groups, self.exact):
            wires = slice(first, first + width * count)
            h = np.conj(np.swapaxes(exact, -1, -2)) @ np.stack(grads[start : start + count], axis=1).astype(np.complex128)
            partial = (h.reshape(-1, 4**width) @ partial_trace_selector(width)).reshape(layers, width * count, 1, 4)
            out[:, wires] = (partial.conj() * self.generators[:, wires].reshape(layers, width * count, k, 4)).sum(-1).real
            start += count
        return out


PerWeights = tuple  # (a clone of the weights, {key: what was built from them})


def built_for_weights(cache: PerWeights | None, weights: torch.Tensor, key: str,
                      make: Any) -> tuple[PerWeights, Any]:
    """make(weights as float64 numpy) for ``weights``, kept in ``cache`` until they change (compared by
    value: a worker's weights change in place, through its flat buffer); returns the cache to keep and
    the value. What acting without a gradient reuses between weight changes: the adjoint blocks
    (``VQC``'s no-grad forward, the numpy acting twin) and the kernels' matrices (the twin)."""
    if cache is None or not torch.equal(cache[0], weights):
        cache = (weights.clone(), {})
    built = cache[1]
    if key not in built:
        built[key] = make(cache[0].numpy().astype(np.float64))
    return cache, built[key]


_SELECTORS: dict[int, np.ndarray] = {}


def partial_trace_selector(width: int) -> np.ndarray:
    """S (4^w, 4 w), 0/1: H.reshape(4^w) @ S lists, for each wire i of a w-wire block (wire 0 the most
    significant bit), the 2 x 2 partial trace of H (2^w x 2^w) over the other wires, row-major (r, s)."""
    if width not in _SELECTORS:
        d = 2**width
        a, b = np.divmod(np.arange(d * d), d)  # row and column of each entry of H
        selector = np.zeros((d * d, 4 * width))
        for i in range(width):
            shift = width - 1 - i
            r, s = (a >> shift) & 1, (b >> shift) & 1
            others = ((a ^ b) & ~(1 << shift)) == 0  # the other wires' bits agree: on the trace
            selector[np.flatnonzero(others), 4 * i + 2 * r[others] + s[others]] = 1.0
        _SELECTORS[width] = selector
    return _SELECTORS[width]


def kept_on_circuit(circuit: "CompiledCircuit", attribute: str, make: Any) -> Any:
    """make(circuit), kept on the circuit under ``attribute`` (the circuit leaves it out of its pickles)
    and made again when the buffers it was made from were replaced: a head may replace its readout after
    construction (``output: born``), and ``.to()`` replaces every buffer. The numpy paths' views of a
    circuit (``structure_of``) and the kernels' copies (``kernels.program_of``)."""
    buffers = circuit._buffers  # (nn.Module's attribute lookup of a buffer costs a microsecond: a call's cost)
    kept = circuit.__dict__.get(attribute)
    if kept is None or kept[0] is not buffers["readout"] or kept[1] is not buffers.get("inverse_0"):
        kept = (buffers["readout"], buffers.get("inverse_0"), make(circuit))
        circuit.__dict__[attribute] = kept
    return kept[2]


class Structure:
    """A circuit's fixed arrays as numpy views of its buffers (no copies); ``structure_of`` keeps one per
    circuit."""

    def __init__(self, circuit: "CompiledCircuit") -> None:
        self.inverse = [getattr(circuit, f"inverse_{layer}").numpy() for layer in range(circuit.layers)]
        self.forward = [getattr(circuit, f"forward_{layer}").numpy() for layer in range(circuit.layers)]
        self.sign = [None if circuit.signs_trivial[layer] else getattr(circuit, f"sign_{layer}").numpy()[:, None]
                     for layer in range(circuit.layers)]
        self.readout = circuit.readout.numpy()
        self.phase = circuit.encoding_phase.numpy()[:, None] if circuit.encoding_diagonal else None
        self.encoders = [getattr(circuit, f"encoding_block_{b}").numpy() for b in range(len(circuit.adjoint_layout))]


def structure_of(circuit: "CompiledCircuit") -> Structure:
    """The circuit's ``Structure`` (``kept_on_circuit``). Making one costs as much as a 12-qubit act's
    sweep of one row."""
    return kept_on_circuit(circuit, "_adjoint_structure", Structure)


def entangle(psi: np.ndarray, structure: Structure, layer: int) -> np.ndarray:
    """Layer ``layer``'s signed permutation on states (..., 2^n, B)."""
    psi = np.take(psi, structure.inverse[layer], axis=-2)
    sign = structure.sign[layer]
    return psi if sign is None else psi * sign


def unentangle(psi: np.ndarray, structure: Structure, layer: int) -> np.ndarray:
    """Undo ``entangle`` (a signed permutation: its inverse is its transpose)."""
    sign = structure.sign[layer]
    if sign is not None:
        psi = psi * sign
    return np.take(psi, structure.forward[layer], axis=-2)


def encode(r: np.ndarray, structure: Structure, layout: list[tuple[int, int]], dtype: np.dtype) -> np.ndarray:
    """psi_0 = F^(x)n r for the real product vectors r (2^n, B): a phase per basis state when F is
    diagonal (angle_x, angle_y without Hadamard), else F's Kronecker blocks."""
    if structure.phase is not None:
        return r * structure.phase
    psi = r.astype(dtype)
    for (first, width), encoder in zip(layout, structure.encoders):
        psi = apply_block(psi, encoder, first, width)
    return psi


def encode_backward(grad: np.ndarray, structure: Structure, layout: list[tuple[int, int]]) -> np.ndarray:
    """d loss / d r from d loss / d psi_0 (torch's convention): Re of F^(x)n's adjoint applied."""
    if structure.phase is not None:
        return (grad * structure.phase.conj()).real
    for (first, width), encoder in zip(layout, structure.encoders):
        grad = apply_block(grad, encoder.conj().T, first, width)
    return grad.real


def encoding_vectors(angles: np.ndarray) -> np.ndarray:
    """Per-wire (cos(t/2), sin(t/2)) for angles (B, n): (n, 2, B)."""
    half = 0.5 * angles.T  # (n, B)
    return np.stack([np.cos(half), np.sin(half)], axis=1)


def product_rows(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The real product vectors r (2^n, B), wire 0 first, of per-wire (cos(t/2), sin(t/2)) for angles
    (B, n); with those per-wire vectors (n, 2, B) for the backward."""
    vectors = encoding_vectors(angles)
    return kron_rows(vectors), vectors


def kron_rows(vectors: np.ndarray) -> np.ndarray:
    """Kronecker products of per-wire vectors (k, 2, B) -> (2^k, B), wire 0 first: neighbouring wires
    paired in one product, then the pairs multiplied as a balanced tree (wire by wire, the large
    products were built k - 1 times, and at a few rows each step's call was the cost: 1.6x faster at 8
    qubits and 3 rows, 2.2x at 12 qubits and one row, 1.8x at 8 qubits and 600 rows)."""
    batch, half = vectors.shape[-1], len(vectors) // 2
    pairs = (vectors[0 : 2 * half : 2, :, None] * vectors[1 : 2 * half : 2, None]).reshape(half, 4, batch)
    return _kron_tree(list(pairs) + ([vectors[-1]] if len(vectors) % 2 else []), batch)


def _kron_tree(factors: list[np.ndarray], batch: int) -> np.ndarray:
    """The Kronecker product of factors (d_i, B) in order, as a balanced tree."""
    if len(factors) <= 2:
        out = factors[0]
        for factor in factors[1:]:
            out = (out[:, None] * factor[None]).reshape(-1, batch)
        return out
    middle = len(factors) // 2
    first, rest = _kron_tree(factors[:middle], batch), _kron_tree(factors[middle:], batch)
    return (first[:, None] * rest[None]).reshape(-1, batch)


def product_rows_backward(grad: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """d loss / d angles (B, n) from d loss / d r (2^n, B): wire i's factor replaced by its derivative
    (-sin(t/2), cos(t/2)) / 2, the other wires contracted in. Walking the wires in order, ``left`` is
    the gradient with the wires before i already contracted with their vectors (2^(n-i), B), met by
    the product of the wires after i: O(2^n B) in all (a three-operand einsum per wire cost 8x more
    at 8 qubits and 600 rows)."""
    n, _, batch = vectors.shape
    suffixes: list[np.ndarray] = [None] * n  # type: ignore[list-item]  # products of the wires > i: (2^(n-1-i), B)
    suffix = np.ones((1, batch), dtype=vectors.dtype)
    for wire in reversed(range(n)):
        suffixes[wire] = suffix
        if wire:
            suffix = (vectors[wire][:, None] * suffix[None]).reshape(-1, batch)
    out = np.empty((batch, n))
    left = grad
    for wire in range(n):
        view = left.reshape(2, -1, batch)
        env = (view * suffixes[wire]).sum(axis=1)  # (2, B)
        cos, sin = vectors[wire]
        out[:, wire] = 0.5 * (cos * env[1] - sin * env[0])
        if wire < n - 1:
            left = view[0] * cos + view[1] * sin
    return out


def evolve(circuit: "CompiledCircuit", psi: np.ndarray, blocks: BlockMatrices, structure: Structure,
           start: int = 0) -> np.ndarray:
    """The state after every layer from ``start`` on, from psi (2^n, B)."""
    for layer in range(start, circuit.layers):
        if circuit.entangle_first:
            psi = entangle(psi, structure, layer)
        for (first, width), matrix in zip(blocks.layout, blocks.blocks):
            psi = apply_block(psi, matrix[layer], first, width)
        if not circuit.entangle_first:
            psi = entangle(psi, structure, layer)
    return psi


def final_state(circuit: "CompiledCircuit", angles: np.ndarray, blocks: BlockMatrices,
                structure: Structure) -> tuple[np.ndarray, np.ndarray]:
    """The final state (2^n, B) for encoding angles (B, n), and the per-wire encoding vectors (n, 2, B).

    When the first layer's rotations come before its gates, they meet a product state: each wire's
    vector is rotated (R_0 F, 2 x 2) before the one Kronecker product, which saves the encoding and the
    first layer's block GEMMs (a third of an 8-qubit actor's act on 3 rows)."""
    dtype = numpy_dtype(circuit.complex_dtype)
    if circuit.entangle_first or circuit.layers == 0:
        r, vectors = product_rows(angles)
        return evolve(circuit, encode(r, structure, circuit.adjoint_layout, dtype), blocks, structure), vectors
    vectors = encoding_vectors(angles)
    psi = kron_rows(blocks.first_wires @ vectors.astype(dtype))
    return evolve(circuit, entangle(psi, structure, 0), blocks, structure, start=1), vectors


def readouts_of(psi: np.ndarray, structure: Structure) -> np.ndarray:
    """Readouts (B, m) of final states psi (2^n, B)."""
    return np.ascontiguousarray((structure.readout.T @ (psi.real**2 + psi.imag**2)).T)


def readouts_np(circuit: "CompiledCircuit", angles: np.ndarray, blocks: BlockMatrices) -> np.ndarray:
    """Readouts (B, m) of encoding angles (B, n) by the state-vector forward alone (acting, no gradient)."""
    single_thread_blas()
    structure = structure_of(circuit)
    return readouts_of(final_state(circuit, angles, blocks, structure)[0], structure)


class StatevectorAdjoint(torch.autograd.Function):
    """readouts (B, m) from the encoding angles (B, n) and weights (L, n, k); see the module docstring.
    The product state, the sweeps and the angles' gradient run in numpy on the CPU tensors' memory."""

    @staticmethod
    def forward(ctx, angles: torch.Tensor, weights: torch.Tensor, circuit: "CompiledCircuit") -> torch.Tensor:
        single_thread_blas()
        blocks = BlockMatrices(circuit, weights.detach().numpy().astype(np.float64), ctx.needs_input_grad[1])
        structure = structure_of(circuit)
        psi, ctx.vectors = final_state(circuit, angles.detach().numpy(), blocks, structure)
        ctx.psi, ctx.blocks, ctx.structure, ctx.circuit = psi, blocks, structure, circuit
        return torch.from_numpy(readouts_of(psi, structure))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        psi, circuit = ctx.psi, ctx.circuit
        lam, grad_w = backward_sweep(circuit, psi, grad.detach().numpy(), ctx.blocks, ctx.structure,
                                     ctx.needs_input_grad[1])
        real = psi.real.dtype
        grad_angles = None
        if ctx.needs_input_grad[0]:
            grad_r = encode_backward(lam, ctx.structure, circuit.adjoint_layout)
            grad_angles = torch.from_numpy(product_rows_backward(grad_r, ctx.vectors).astype(real))
        return grad_angles, None if grad_w is None else torch.from_numpy(grad_w.astype(real)), None


def backward_sweep(circuit: "CompiledCircuit", psi: np.ndarray, grad_readouts: np.ndarray, blocks: BlockMatrices,
                   structure: Structure, weights: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The adjoint method's backward pass from the final states psi (2^n, B) and d loss / d readouts (B, m):
    d loss / d psi_0 (2^n, B, torch's convention), and with ``weights`` d loss / d weights (L, n, k)
    (``blocks`` then carries the derivatives)."""
    # state and adjoint stacked (2, 2^n, B): every un-apply is one GEMM on both.
    # lambda = d loss / d conj(psi) in torch's convention: 2 (R g) psi
    both = np.empty((2,) + psi.shape, dtype=psi.dtype)
    both[0] = psi
    np.multiply(psi, 2.0 * (structure.readout @ grad_readouts.T), out=both[1])
    grads: list[list[np.ndarray]] = [[None] * circuit.layers for _ in blocks.layout]  # type: ignore[list-item]
    for layer in reversed(range(circuit.layers)):
        if not circuit.entangle_first:
            both = unentangle(both, structure, layer)
        for b in reversed(range(len(blocks.layout))):
            first, width = blocks.layout[b]
            adjoint_out = both[1]
            both = apply_block(both, blocks.adjoints[b][layer], first, width)
            if weights:  # G = lambda_out psi_in^dagger
                grads[b][layer] = block_gradient(adjoint_out, both[0], first, width)
        if circuit.entangle_first:
            both = unentangle(both, structure, layer)
    return both[1], blocks.weight_gradient([np.stack(g) for g in grads]) if weights else None
