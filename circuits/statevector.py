"""The ``statevector`` executor's numpy blocks: one forward sweep, one backward sweep (the adjoint method), no graph.

A circuit without re-uploading is: an encoded product state psi_0 = F^{(x)n} r(x) (r real, F the
encoding's fixed 2x2, ``gates.encoding_state_map``), then per layer a signed permutation E_l
(the CNOT/CZ gates) and a Kronecker product K_l of per-wire 2x2 matrices, read out as
probabilities |psi_L|^2. ``StatevectorNode`` runs that on a (2^n, B) complex state (batch last), reading the
circuit's ``circuits.program.Program``:

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

With data re-uploading (``reupload: true``) each layer from 1 on starts with the encoding block
again, applied per row to the state and un-applied by the backward sweep, which also gives each such
block's angle gradients (the section "data re-uploading" at the end of this module).

Everything runs in numpy on the CPU tensors' memory: the block matrices and their derivatives (a few
16 x 16 matrices, complex128, cast to the state's dtype) are built on each call from the weights,
and the sweeps are numpy GEMMs and gathers, so a training step pays neither autograd bookkeeping nor
torch's per-op dispatch. For a few rows the same executor runs its compiled kernels instead
(``circuits.kernels``); ``circuits.planner`` chooses.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from circuits import gates
from circuits.blocks import ANSATZE
from circuits.kernels import rotations_and_generators
from circuits.program import Program, block_layout, kron_matrices  # noqa: F401 (block_layout: the tests')
from marl_q.native import single_thread_blas

HEAP_KEEP_BYTES = 1 << 26  # keep_heap: arrays up to this size come from (and return to) the heap
_HEAP_KEPT = False


def keep_heap() -> None:
    """Ask glibc's malloc (once per process) to serve arrays up to ``HEAP_KEEP_BYTES`` from its heap and
    to keep up to 4x that free, instead of mapping fresh pages for each: every block, gather and product
    of a sweep allocates a new (2^n, B) state, and at 8 qubits and 1024 rows (2 MB each) first-touch page
    faults were a third of an act (6.3 -> 4.1 ms, profiled on one thread; bits unchanged: only where the
    arrays live). No-op where libc is not glibc."""
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return
    _HEAP_KEPT = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 4 * HEAP_KEEP_BYTES)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, HEAP_KEEP_BYTES)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


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
    gemm = conjugating_gemm(lam.dtype) if lam.dtype == psi.dtype and lam.size >= CONJUGATING_GEMM_MIN_SIZE else None
    if rows == 1:
        if gemm is not None and lam.flags.c_contiguous and psi.flags.c_contiguous:
            return _lam_psi_dagger_t(gemm, lam.reshape(d, -1), psi.reshape(d, -1), None).T
        return lam.reshape(d, -1) @ psi.reshape(d, -1).conj().T
    rest = lam.size // (rows * d)
    lam, psi = lam.reshape(rows, d, rest), psi.reshape(rows, d, rest)
    if rest < GATHERED_GRADIENT_MAX_REST:
        return lam.swapaxes(0, 1).reshape(d, -1) @ psi.swapaxes(0, 1).reshape(d, -1).conj().T
    if gemm is not None and lam.flags.c_contiguous and psi.flags.c_contiguous:
        total = None  # the 2^first products summed in BLAS's output (beta = 1)
        for r in range(rows):
            total = _lam_psi_dagger_t(gemm, lam[r], psi[r], total)
        return total.T
    return (lam @ psi.conj().swapaxes(-1, -2)).sum(0)


CONJUGATING_GEMM_MIN_SIZE = 1 << 16  # block_gradient: from this many amplitudes (x rows), psi^dagger read in place
_CONJUGATING_GEMMS: dict[np.dtype, Any] | None = None


def conjugating_gemm(dtype: np.dtype) -> Any:
    """BLAS's complex GEMM of ``dtype`` (scipy's), which reads an operand conjugate-transposed in place:
    ``block_gradient``'s lam psi^dagger without a conjugated copy of psi (a pass over a (2^n, B) state:
    about a third of a block gradient at 8 qubits and 1,200 rows); None where scipy's BLAS cannot be
    imported. scipy is imported on the first call (not with this module: a few hundred ms in a process
    that has not), and its OpenBLAS, a library of its own, is set to one thread like numpy's."""
    global _CONJUGATING_GEMMS
    if _CONJUGATING_GEMMS is None:
        try:
            from scipy.linalg import blas
        except ImportError:
            _CONJUGATING_GEMMS = {}
        else:
            _CONJUGATING_GEMMS = {np.dtype(np.complex64): blas.cgemm, np.dtype(np.complex128): blas.zgemm}
            single_thread_blas(loaded=True)
    return _CONJUGATING_GEMMS.get(np.dtype(dtype))


def _lam_psi_dagger_t(gemm: Any, lam: np.ndarray, psi: np.ndarray, total: np.ndarray | None) -> np.ndarray:
    """(lam psi^dagger)^T for C-contiguous (d, R) lam and psi, as a Fortran-ordered (d, d) array, added to
    ``total`` (an earlier result) when given. BLAS reads a C-ordered (d, R) array as the Fortran (R, d)
    matrix of its transpose, so the GEMM forms conj(psi) lam^T = (lam psi^dagger)^T, conjugating psi as it
    reads it; the caller's ``.T`` is lam psi^dagger."""
    if total is None:
        return gemm(1.0, psi.T, lam.T, trans_a=2)
    return gemm(1.0, psi.T, lam.T, trans_a=2, beta=1.0, c=total, overwrite_c=1)


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

    def __init__(self, program: Program, weights: np.ndarray, with_derivatives: bool) -> None:
        layers = weights.shape[0]
        if with_derivatives:
            rotations, self.generators = rotations_and_generators(program, weights, compiled=False)
        else:
            rotations = ANSATZE[program.ansatz].matrices_np(weights, program.options)  # (L, n, 2, 2)
        dtype = program.complex_dtype
        self.layout = program.layout
        self.shape = weights.shape
        # the first layer's rotation of each wire times the encoding's 2 x 2 (final_state, rotations first)
        self.first_wires = (None if program.entangle_first or not layers
                            else (rotations[0] @ program.state_map).astype(dtype))
        self.first_rotations = None if self.first_wires is None else rotations[0]  # (n, 2, 2) complex128
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

    def weight_gradient(self, grads: list[np.ndarray], start: int = 0) -> np.ndarray:
        """d loss / d weights (L, n, k) from each block's G (L, 2^w, 2^w), torch's convention for complex grads.

        A weight of wire i changes the block K to K Gen (Gen = g on wire i, the identity elsewhere,
        g = R^dagger dR/dw), so its gradient Re sum conj(G) (K Gen) is Re sum conj(H_i) g with H = K^dagger G
        and H_i its partial trace over the block's other wires: per group of blocks of one width, one
        GEMM for H, one for every wire's partial trace (``partial_trace_selector``) and one contraction
        with the generators. With ``start``, ``grads`` hold layers ``start`` on, and so are the rows of the
        result filled (the others are left for the caller)."""
        layers, _, k = self.shape
        layers -= start
        out = np.empty(self.shape)
        block = 0
        for (first, width, count), exact in zip(self.groups, self.exact):
            wires = slice(first, first + width * count)
            h = np.conj(np.swapaxes(exact[start:], -1, -2)) @ np.stack(grads[block : block + count], axis=1).astype(np.complex128)
            partial = (h.reshape(-1, 4**width) @ partial_trace_selector(width)).reshape(layers, width * count, 1, 4)
            out[start:, wires] = (partial.conj() * self.generators[start:, wires].reshape(layers, width * count, k, 4)).sum(-1).real
            block += count
        return out


class WeightsCache(NamedTuple):
    """What was built from one value of a head's weights (``built_for_weights``)."""

    weights: torch.Tensor  # a clone of the weights it was built for
    built: dict[str, Any]  # key -> what was built from them


def built_for_weights(cache: WeightsCache | None, weights: torch.Tensor, key: str,
                      make: Any) -> tuple[WeightsCache, Any]:
    """make(weights as float64 numpy) for ``weights``, kept in ``cache`` until they change (compared by
    value: a worker's weights change in place, through its flat buffer); returns the cache to keep and
    the value. What acting without a gradient reuses between weight changes: the blocks (``VQC``'s
    no-grad forward, the acting twin) and the kernels' matrices (the twin)."""
    if cache is None or not torch.equal(cache.weights, weights):
        cache = WeightsCache(weights.clone(), {})
    built = cache.built
    if key not in built:
        built[key] = make(cache.weights.numpy().astype(np.float64))
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


def entangle(psi: np.ndarray, program: Program, layer: int) -> np.ndarray:
    """Layer ``layer``'s signed permutation on states (..., 2^n, B)."""
    psi = np.take(psi, program.inverse[layer], axis=-2)
    sign = program.sign_columns[layer]
    return psi if sign is None else psi * sign


def unentangle(psi: np.ndarray, program: Program, layer: int) -> np.ndarray:
    """Undo ``entangle`` (a signed permutation: its inverse is its transpose)."""
    sign = program.sign_columns[layer]
    if sign is not None:
        psi = psi * sign
    return np.take(psi, program.forward[layer], axis=-2)


def encode(r: np.ndarray, program: Program) -> np.ndarray:
    """psi_0 = F^(x)n r for the real product vectors r (2^n, B): a phase per basis state when F is
    diagonal (angle_x, angle_y without Hadamard), else F's Kronecker blocks."""
    if program.phase is not None:
        return r * program.phase
    psi = r.astype(program.complex_dtype)
    for (first, width), encoder in zip(program.layout, program.encoders):
        psi = apply_block(psi, encoder, first, width)
    return psi


def encode_backward(grad: np.ndarray, program: Program) -> np.ndarray:
    """d loss / d r from d loss / d psi_0 (torch's convention): Re of F^(x)n's adjoint applied."""
    if program.phase is not None:
        return (grad * program.phase.conj()).real
    for (first, width), encoder in zip(program.layout, program.encoders):
        grad = apply_block(grad, encoder.conj().T, first, width)
    return grad.real


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


KEEP_STATES_MIN_ROWS = 64  # from this many rows (and ``KEEP_STATES_MAX_BYTES``) a training forward keeps
KEEP_STATES_MAX_BYTES = 1 << 28  # every block's input state, and the backward un-applies blocks to lambda alone


def keeps_states(program: Program, rows: int) -> bool:
    """Whether a training forward of ``rows`` rows keeps each block's input state for ``backward_sweep``:
    the backward then un-applies each block to lambda only (half the GEMMs), at the cost of memory (one
    state per block and layer). Only for programs whose layers start with their gates (the blocks of a
    rotations-first circuit's first layer are folded into the encoding), and from
    ``KEEP_STATES_MIN_ROWS`` rows: the stored states differ from the un-applied ones in the last bits,
    and the shipped scenarios' training calls (few rows) keep the bits they always had (the goldens)."""
    return (program.entangle_first and rows >= KEEP_STATES_MIN_ROWS and not program.reupload
            and rows * 2**program.n_qubits * np.dtype(program.complex_dtype).itemsize * program.layers
            * len(program.layout) <= KEEP_STATES_MAX_BYTES)


def evolve(program: Program, psi: np.ndarray, blocks: BlockMatrices, start: int = 0,
           kept: list[np.ndarray] | None = None, uploads: "Uploads | None" = None) -> np.ndarray:
    """The state after every layer from ``start`` on, from psi (2^n, B); with ``kept``, every block's
    input state is appended to it (layer by layer, block by block); with ``uploads`` (re-uploading), each
    layer from 1 on starts with its encoding block."""
    for layer in range(start, program.layers):
        if uploads is not None and layer:
            psi = uploads.apply(psi, layer)
        if program.entangle_first:
            psi = entangle(psi, program, layer)
        for (first, width), matrix in zip(blocks.layout, blocks.blocks):
            if kept is not None:
                kept.append(psi)
            psi = apply_block(psi, matrix[layer], first, width)
        if not program.entangle_first:
            psi = entangle(psi, program, layer)
    return psi


def final_state(program: Program, angles: np.ndarray, blocks: BlockMatrices,
                kept: list[np.ndarray] | None = None, uploads: "Uploads | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """The final state (2^n, B) for encoding angles (B, n) (the first encoding block's; ``uploads``: the
    later blocks' gates, ``reupload_inputs``), and the per-wire encoding vectors (n, 2, B).

    When the first layer's rotations come before its gates, they meet a product state: each wire's
    vector is rotated (R_0 F, 2 x 2) before the one Kronecker product, which saves the encoding and the
    first layer's block GEMMs (a third of an 8-qubit actor's act on 3 rows)."""
    vectors = gates.half_angle_vectors(angles, batch_last=True)  # (n, 2, B)
    if program.entangle_first or program.layers == 0:
        # the vectors lie batch-major in memory (the angles' transpose), and so would r and the encoded
        # state: the first gather on that transposed state cost 11x one on a C-contiguous one (8 qubits,
        # 1024 rows). The copy is exact (the vectors stay as they are for the backward's sums)
        r = gates.kron_vectors(np.ascontiguousarray(vectors), batch_last=True)  # gates.product_state(angles, batch_last=True)
        return evolve(program, encode(r, program), blocks, kept=kept, uploads=uploads), vectors
    psi = gates.kron_vectors(blocks.first_wires @ vectors.astype(program.complex_dtype), batch_last=True)
    return evolve(program, entangle(psi, program, 0), blocks, start=1, uploads=uploads), vectors


def readouts_of(psi: np.ndarray, program: Program) -> np.ndarray:
    """Readouts (B, m) of final states psi (2^n, B)."""
    return np.ascontiguousarray((program.readout.T @ (psi.real**2 + psi.imag**2)).T)


def readouts_np(program: Program, angles: np.ndarray, blocks: BlockMatrices) -> np.ndarray:
    """Readouts (B, m) of encoding angles (B, n) by the state-vector forward alone (acting, no gradient):
    the arithmetic of the autograd node's forward (``training_forward`` for a rotations-first program),
    so acting and a training call give the same bits."""
    single_thread_blas()
    keep_heap()
    if trains_on_product(program):
        return training_forward(program, angles, blocks)[0]
    first, uploads = reupload_inputs(program, angles)
    return readouts_of(final_state(program, first, blocks, uploads=uploads)[0], program)


def trains_on_product(program: Program) -> bool:
    """Whether a training call runs ``training_forward`` / ``training_backward``: the first layer's
    rotations come before its gates (every shipped ansatz but ``rzryrz_ring``), without re-uploading."""
    return not program.entangle_first and program.layers >= 1 and not program.reupload


class Tape(NamedTuple):
    """What ``training_forward`` keeps for ``training_backward``."""

    vectors: np.ndarray  # (n, 2, B) real: each wire's (cos(t/2), sin(t/2))
    factors: np.ndarray  # (n, 2, B): each wire's vector after the first layer, u_i = R_i F v_i
    kept: list[np.ndarray]  # every block's input state, layers 1 on, layer by layer, block by block
    psi: np.ndarray  # (2^n, B): the state before the last layer's gates
    readout: np.ndarray  # (2^n, m): the readout matrix with the last layer's gates folded in


def folded_readout(program: Program) -> np.ndarray:
    """The readout matrix of the state *before* the last layer's signed permutation E: probabilities
    are |E psi|^2 = P |psi|^2 (signs square away), so R^T |E psi|^2 = R[forward]^T |psi|^2."""
    return np.ascontiguousarray(program.readout[program.forward[program.layers - 1]])


def training_forward(program: Program, angles: np.ndarray, blocks: BlockMatrices) -> tuple[np.ndarray, Tape]:
    """Readouts (B, m) of encoding angles (B, n) for a training call of a rotations-first program
    (``trains_on_product``), and the tape of its backward. The same circuit as ``final_state``, with
    two savings for the backward: the first layer stays a product of per-wire vectors (its gradient is
    taken from those, ``factor_gradients``, not by un-applying its blocks), and the last layer's gates
    are folded into the readout (``folded_readout``). Every later block's input state is kept, so the
    backward un-applies blocks to lambda alone."""
    vectors = gates.half_angle_vectors(angles, batch_last=True)  # (n, 2, B)
    factors = blocks.first_wires @ vectors.astype(program.complex_dtype)
    psi = gates.kron_vectors(factors, batch_last=True)
    last = program.layers - 1
    kept: list[np.ndarray] = []
    for layer in range(program.layers):
        if layer:
            for (first, width), matrix in zip(blocks.layout, blocks.blocks):
                kept.append(psi)
                psi = apply_block(psi, matrix[layer], first, width)
        if layer < last:
            psi = entangle(psi, program, layer)
    readout = folded_readout(program)
    out = np.ascontiguousarray((readout.T @ (psi.real**2 + psi.imag**2)).T)
    return out, Tape(vectors, factors, kept, psi, readout)


FACTOR_SPLIT_MIN_WIRES = 6  # factor_gradients: from this many wires, cut the register in two halves first


def factor_gradients(lam: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """g (n, 2, B): for a product state psi = u_0 (x) ... (x) u_{n-1} (factors (n, 2, B), wire 0 the most
    significant bit) and lam = d loss / d conj(psi) (2^n, B, torch's convention), each factor's
    gradient in the same convention, g_i[a] = sum over the other wires' indices of lam conj(prod_{j!=i} u_j).
    Walking the wires in order, ``left`` has the wires before i contracted with their conjugate
    factors, met by the product of the wires after i: O(2^n B) in all. From ``FACTOR_SPLIT_MIN_WIRES``
    wires the register is first cut in two halves: lam contracted with one half's conjugate product
    (``gates.kron_vectors``) is the other half's lam, each half then walked on 2^(n/2) amplitudes, about
    half the passes over the (2^n, B) array (8 qubits, 1,200 rows: 3.0-3.2 -> 1.8-2.0 ms; at 6 wires a draw)."""
    n, _, batch = factors.shape
    conj = factors.conj()
    if n >= FACTOR_SPLIT_MIN_WIRES:
        half = n // 2
        view = lam.reshape(2**half, 2 ** (n - half), batch)
        out = np.empty_like(factors)
        out[:half] = factor_gradients((view * gates.kron_vectors(conj[half:], batch_last=True)).sum(axis=1), factors[:half])
        out[half:] = factor_gradients((view * gates.kron_vectors(conj[:half], batch_last=True)[:, None]).sum(axis=0),
                                      factors[half:])
        return out
    suffixes: list[np.ndarray] = [None] * n  # type: ignore[list-item]
    suffix = np.ones((1, batch), dtype=factors.dtype)
    for wire in reversed(range(n)):
        suffixes[wire] = suffix
        if wire:
            suffix = (conj[wire][:, None] * suffix[None]).reshape(-1, batch)
    out = np.empty_like(factors)
    left = lam
    for wire in range(n):
        view = left.reshape(2, -1, batch)
        out[wire] = (view * suffixes[wire]).sum(axis=1)
        if wire < n - 1:
            left = view[0] * conj[wire, 0] + view[1] * conj[wire, 1]
    return out


def training_backward(program: Program, tape: Tape, grad_readouts: np.ndarray, blocks: BlockMatrices,
                      weights: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """d loss / d angles (B, n) and, with ``weights``, d loss / d weights (L, n, k) of a
    ``training_forward`` call. Layers 1 on: the adjoint method on lambda with the kept states
    (``block_gradient``, ``BlockMatrices.weight_gradient``). Layer 0: u_i = A_i v_i with A_i = R_i F,
    so from each factor's gradient g_i (``factor_gradients``), d loss / d v_i = Re(A_i^dagger g_i)
    (then d v / d t = (-sin, cos) / 2) and the wire's weights get Re sum conj(H) gen with
    H = R_i^dagger sum_rows g_i (F v_i)^dagger, the rule of ``BlockMatrices.weight_gradient``."""
    layers, count = program.layers, len(blocks.layout)
    lam = tape.psi * (2.0 * (tape.readout @ grad_readouts.T))
    grads: list[list[np.ndarray]] = [[None] * (layers - 1) for _ in blocks.layout]  # type: ignore[list-item]
    for layer in reversed(range(1, layers)):
        if layer < layers - 1:
            lam = unentangle(lam, program, layer)
        for b in reversed(range(count)):
            first, width = blocks.layout[b]
            if weights:
                grads[b][layer - 1] = block_gradient(lam, tape.kept[(layer - 1) * count + b], first, width)
            lam = apply_block(lam, blocks.adjoints[b][layer], first, width)
    if layers > 1:
        lam = unentangle(lam, program, 0)
    g = factor_gradients(lam, tape.factors)  # (n, 2, B)
    wires = blocks.first_wires  # A_i (n, 2, 2), the state's dtype
    q = (np.conj(np.swapaxes(wires, -1, -2)) @ g).real  # d loss / d v_i
    v = tape.vectors
    grad_angles = (0.5 * (v[:, 0] * q[:, 1] - v[:, 1] * q[:, 0])).T
    if not weights:
        return grad_angles, None
    out = (blocks.weight_gradient([np.stack(gr) for gr in grads], start=1) if layers > 1
           else np.empty(blocks.shape))
    encoded = (program.state_map @ v.astype(np.complex128))  # F v_i (n, 2, B)
    outer = g.astype(np.complex128) @ np.conj(np.swapaxes(encoded, -1, -2))  # (n, 2, 2)
    h = np.conj(np.swapaxes(blocks.first_rotations, -1, -2)) @ outer
    n, k = blocks.shape[1], blocks.shape[2]
    out[0] = (h.reshape(n, 1, 4).conj() * blocks.generators[0].reshape(n, k, 4)).sum(-1).real
    return grad_angles, out


class StatevectorNode(torch.autograd.Function):
    """readouts (B, m) from the encoding angles (B, n) and weights (L, n, k); see the module docstring.
    The product state, the sweeps and the angles' gradient run in numpy on the CPU tensors' memory."""

    @staticmethod
    def forward(ctx, angles: torch.Tensor, weights: torch.Tensor, program: Program) -> torch.Tensor:
        if angles.device.type != "cpu" or weights.device.type != "cpu":
            raise ValueError(f"the statevector executor runs numpy on the CPU; got angles on {angles.device} and weights on "
                             f"{weights.device} (on a GPU the planner takes torch_autograd or dense)")
        single_thread_blas()
        keep_heap()
        blocks = BlockMatrices(program, weights.detach().numpy().astype(np.float64), ctx.needs_input_grad[1])
        ctx.blocks, ctx.program, ctx.tape = blocks, program, None
        if trains_on_product(program):
            out, ctx.tape = training_forward(program, angles.detach().numpy(), blocks)
            return torch.from_numpy(out)
        first, ctx.uploads = reupload_inputs(program, angles.detach().numpy())
        psi, ctx.vectors = final_state(program, first, blocks, uploads=ctx.uploads)
        ctx.psi, ctx.angles_dim = psi, angles.dim()
        return torch.from_numpy(readouts_of(psi, program))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        program = ctx.program
        if ctx.tape is not None:
            real = ctx.tape.vectors.dtype
            grad_angles, grad_w = training_backward(program, ctx.tape, grad.detach().numpy(), ctx.blocks,
                                                    ctx.needs_input_grad[1])
            return (torch.from_numpy(grad_angles.astype(real)) if ctx.needs_input_grad[0] else None,
                    None if grad_w is None else torch.from_numpy(grad_w.astype(real)), None)
        psi = ctx.psi
        lam, grad_w = backward_sweep(program, psi, grad.detach().numpy(), ctx.blocks, ctx.needs_input_grad[1],
                                     uploads=ctx.uploads)
        real = psi.real.dtype
        grad_angles = None
        if ctx.needs_input_grad[0]:
            grad_first = product_rows_backward(encode_backward(lam, program), ctx.vectors)
            if ctx.uploads is not None:
                grad_first = ctx.uploads.angle_gradients(grad_first, ctx.angles_dim)
            grad_angles = torch.from_numpy(grad_first.astype(real))
        return grad_angles, None if grad_w is None else torch.from_numpy(grad_w.astype(real)), None


def backward_sweep(program: Program, psi: np.ndarray, grad_readouts: np.ndarray, blocks: BlockMatrices,
                   weights: bool, kept: list[np.ndarray] | None = None,
                   uploads: "Uploads | None" = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The adjoint method's backward pass from the final states psi (2^n, B) and d loss / d readouts (B, m):
    d loss / d psi_0 (2^n, B, torch's convention), and with ``weights`` d loss / d weights (L, n, k)
    (``blocks`` then carries the derivatives). With ``kept`` (the forward's block input states,
    ``keeps_states``), the blocks are un-applied to lambda alone. With ``uploads`` (re-uploading), each
    later encoding block is un-applied too, after its angles' gradients are written into
    ``uploads.grads`` (``upload_gradients``)."""
    if kept:
        return _backward_kept(program, psi, grad_readouts, blocks, weights, kept)
    # state and adjoint stacked (2, 2^n, B): every un-apply is one GEMM on both.
    # lambda = d loss / d conj(psi) in torch's convention: 2 (R g) psi
    both = np.empty((2,) + psi.shape, dtype=psi.dtype)
    both[0] = psi
    np.multiply(psi, 2.0 * (program.readout @ grad_readouts.T), out=both[1])
    grads: list[list[np.ndarray]] = [[None] * program.layers for _ in blocks.layout]  # type: ignore[list-item]
    upload_adjoints = None if uploads is None else uploads.adjoints()
    for layer in reversed(range(program.layers)):
        if not program.entangle_first:
            both = unentangle(both, program, layer)
        for b in reversed(range(len(blocks.layout))):
            first, width = blocks.layout[b]
            adjoint_out = both[1]
            both = apply_block(both, blocks.adjoints[b][layer], first, width)
            if weights:  # G = lambda_out psi_in^dagger
                grads[b][layer] = block_gradient(adjoint_out, both[0], first, width)
        if program.entangle_first:
            both = unentangle(both, program, layer)
        if uploads is not None and layer:
            uploads.grads[layer - 1] = upload_gradients(both[1], both[0], program)
            both = upload_wires(both, upload_adjoints[layer - 1])
    return both[1], blocks.weight_gradient([np.stack(g) for g in grads]) if weights else None


def _backward_kept(program: Program, psi: np.ndarray, grad_readouts: np.ndarray, blocks: BlockMatrices,
                   weights: bool, kept: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """``backward_sweep`` of an entangle-first program with the forward's block input states: at 8 qubits
    and 1024 rows the un-applies on the stacked state and lambda were half the backward."""
    lam = psi * (2.0 * (program.readout @ grad_readouts.T))
    count = len(blocks.layout)
    grads: list[list[np.ndarray]] = [[None] * program.layers for _ in blocks.layout]  # type: ignore[list-item]
    for layer in reversed(range(program.layers)):
        for b in reversed(range(count)):
            first, width = blocks.layout[b]
            if weights:  # G = lambda_out psi_in^dagger
                grads[b][layer] = block_gradient(lam, kept[layer * count + b], first, width)
            lam = apply_block(lam, blocks.adjoints[b][layer], first, width)
        lam = unentangle(lam, program, layer)
    return lam, blocks.weight_gradient([np.stack(g) for g in grads]) if weights else None


# ----------------------------------------------------------------------------- data re-uploading
# With ``reupload: true`` the encoding block comes again before every layer from 1 on, on the (no longer
# product) state, with per-row angles: (B, L, n) with trainable input scaling (a scale per block), else
# the (B, n) angles in every block. The first block is the encoded product state as without
# re-uploading; a later block is per wire and row the gate R_P(t) h = cos(t/2) [h] + sin(t/2) [-i P h]
# (``Program.upload_gate``), applied to the state (2^n, B) as 2 x 2 per row (``apply_wire_rows``), or for
# one row (an actor's act) as the Kronecker blocks of the layout, one GEMM each (``apply_block``: 16
# small per-wire products cost most of a 4-qubit, 5-layer act), and the adjoint sweep un-applies it
# wire by wire (the conjugate transposes). An angle's gradient needs no derivative
# gate: d/dt R_P(t) h = (-i P / 2) R_P(t) h, so at the block's output state psi and adjoint lambda it is
# Re <lambda, (-i P / 2)_i psi> (``upload_gradients``; the wires of one block commute).


class Uploads(NamedTuple):
    """A re-uploading call's encoding blocks from layer 1 on (``reupload_inputs``), and the gradients of
    their angles, which ``backward_sweep`` writes."""

    gates: np.ndarray  # (L - 1, n, 2, 2, B) per layer, wire and row, the state's dtype
    grads: np.ndarray  # (L - 1, n, B): d loss / d angles, filled by backward_sweep
    blocks: tuple[np.ndarray, ...] | None  # one row: per block of the layout its (L - 1, 2^w, 2^w) Kronecker product
    layout: tuple[tuple[int, int], ...]

    def apply(self, psi: np.ndarray, layer: int) -> np.ndarray:
        """Layer ``layer``'s encoding block (layer >= 1) on the states psi (2^n, B)."""
        if self.blocks is None:
            return upload_wires(psi, self.gates[layer - 1])
        for (first, width), block in zip(self.layout, self.blocks):
            psi = apply_block(psi, block[layer - 1], first, width)
        return psi

    def adjoints(self) -> np.ndarray:
        """The gates' conjugate transposes (L - 1, n, 2, 2, B): un-applying a block."""
        return np.conj(np.swapaxes(self.gates, 2, 3))

    def angle_gradients(self, grad_first: np.ndarray, dim: int) -> np.ndarray:
        """d loss / d angles of the call: (B, L, n) with the first block's (B, n) and the later blocks'
        from ``grads``, or summed over the blocks for angles given once (B, n) (``dim`` 2)."""
        grads = np.concatenate([grad_first[:, None], np.transpose(self.grads, (2, 0, 1))], axis=1)
        return grads if dim == 3 else grads.sum(axis=1)


def reupload_inputs(program: Program, angles: np.ndarray) -> tuple[np.ndarray, Uploads | None]:
    """The first encoding block's angles (B, n) and, for a re-uploading program, the later blocks'
    ``Uploads``, from a call's angles: (B, n), or (B, L, n) a block each (trainable input scaling)."""
    if not program.reupload:
        return angles, None
    per_block = angles if angles.ndim == 3 else np.broadcast_to(angles[:, None], (angles.shape[0], program.layers, angles.shape[1]))
    vectors = np.moveaxis(gates.half_angle_vectors(per_block[:, 1:]), 0, -1)  # (L - 1, n, 2, B)
    parts = program.upload_gate  # (2, 2, 2)
    upload_gates = (vectors[:, :, 0, None, None] * parts[0][:, :, None]
                    + vectors[:, :, 1, None, None] * parts[1][:, :, None])
    layers, n, batch = vectors.shape[0], vectors.shape[1], vectors.shape[-1]
    blocks = (None if batch > 1 else
              tuple(kron_matrices(upload_gates[:, first : first + width, :, :, 0]) for first, width in program.layout))
    return per_block[:, 0], Uploads(upload_gates, np.empty((layers, n, batch), dtype=vectors.dtype), blocks, program.layout)


def apply_wire_rows(psi: np.ndarray, matrices: np.ndarray, wire: int, n_qubits: int) -> np.ndarray:
    """A 2 x 2 matrix per row, matrices (2, 2, B), on wire ``wire`` of states psi (..., 2^n, B)."""
    shape = psi.shape
    view = psi.reshape(*shape[:-2], 2**wire, 2, 2 ** (n_qubits - wire - 1), shape[-1])
    out = view[..., 0:1, :, :] * matrices[:, 0, None] + view[..., 1:2, :, :] * matrices[:, 1, None]
    return out.reshape(shape)


def upload_wires(psi: np.ndarray, block: np.ndarray) -> np.ndarray:
    """One encoding block's gates, block (n, 2, 2, B) per wire and row, on states psi (..., 2^n, B)."""
    n = block.shape[0]
    for wire in range(n):
        psi = apply_wire_rows(psi, block[wire], wire, n)
    return psi


def upload_gradients(lam: np.ndarray, psi: np.ndarray, program: Program) -> np.ndarray:
    """d loss / d angles (n, B) of an encoding block from its output states psi and adjoint lam (2^n, B,
    torch's convention): Re <lam, (-i P / 2)_i psi> per wire i and row."""
    n, batch = program.n_qubits, psi.shape[-1]
    generator = np.broadcast_to(program.upload_generator[:, :, None], (2, 2, 1))
    out = np.empty((n, batch), dtype=psi.real.dtype)
    conj = lam.conj()
    for wire in range(n):
        out[wire] = (conj * apply_wire_rows(psi, generator, wire, n)).real.reshape(-1, batch).sum(axis=0)
    return out
