"""The statevector executor's compiled kernels, for a few rows: acting, and the one-step A2C update.

At one to a few rows the numpy executors (the dense matrix up to 4 qubits, ``circuits.statevector``'s
block sweeps from 5) spend most of a call in numpy's per-call overhead (tens of calls to act, a few
hundred for a forward and backward), where one XLA call of a jitted peer does the whole circuit.
Here a row's whole circuit is one loop nest compiled by numba (``circuits.numba_kernels``): the
product state, each layer's signed permutation and per-wire 2 x 2 matrices, the readouts; and the
adjoint method's backward sweep with the weights' gradient. The planner (``circuits.planner``) gives
them up to ``max_rows(n)`` rows; past that numpy's GEMMs, which work on many rows at once, win
(measured by ``marlq bench quantum --peers``, docs/circuits.md).

This module also builds every analytic gradient's wire matrices and generators
(``rotations_and_generators``), compiled where the ansatz names its Pauli axes.

The per-row kernels compute in complex128, in a fixed order: reruns give the same bits. The same loops
on a batch-last state, the rows vectorised (``columns_forward``, ``columns_weight_grad``), take a
twin's calls of more rows at 5-8 qubits, training and acting (``planner.COLUMNS_QUBITS``), in the head's precision. Where numba cannot
be imported (``available()``), or ``MARLQ_KERNELS=0`` is set, the planner never picks them; both
executor variants are tested against each other and against PennyLane.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from circuits.blocks import ANSATZE
from circuits.program import Program
from marl_q import compiled

_NUMBA: Any = None  # the kernels module once imported; False where it cannot be
# the most rows a kernel call takes, by qubit count: about where the numpy block executor's forward or
# backward became faster (2 layers, CPU time, on one 2-core machine: docs/circuits.md, "Executors and the planner").
# From 12 qubits numpy's 4-wire block GEMMs win even at one row: the kernels apply one wire at a time
MAX_ROWS = {1: 64, 2: 64, 3: 64, 4: 64, 5: 64, 6: 32, 7: 16, 8: 8, 9: 4, 10: 3, 11: 1}


def available() -> bool:
    """Whether the compiled kernels can run here (numba imports, and ``MARLQ_KERNELS`` is not 0)."""
    global _NUMBA
    if _NUMBA is None:
        _NUMBA = False
        if compiled.allowed():
            try:
                from circuits import numba_kernels
            except ImportError:
                pass
            else:
                _NUMBA = numba_kernels
    return _NUMBA is not False


def _compiled() -> Any:
    """``circuits.numba_kernels``; callers have checked ``available()``."""
    if not available():
        raise RuntimeError("the compiled kernels are not available here (numba not importable, or MARLQ_KERNELS=0)")
    return _NUMBA


def max_rows(n_qubits: int) -> int:
    """The most rows a kernel call takes for an n-qubit circuit (0: none)."""
    return MAX_ROWS.get(n_qubits, 0) if available() else 0


_NO_GENERATORS = np.zeros((0, 0, 0, 2, 2), dtype=np.complex128)
_NO_STATES = np.zeros((0, 0), dtype=np.complex128)
_SHIFTS: dict[int, np.ndarray] = {}


def pauli_rotations(program: Program, weights: np.ndarray,
                    generators: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Each wire's matrix (L, n, 2, 2) at weights (L, n, k) float64, and with ``generators`` each weight's
    R^dagger dR/dw (L, n, k, 2, 2) (else an empty array), complex128, in one compiled call; None where
    the kernels are not available or the ansatz does not name its Pauli axes."""
    if program.axes is None or not available():
        return None
    rot = np.empty(weights.shape[:2] + (2, 2), dtype=np.complex128)
    gen = np.empty(weights.shape + (2, 2), dtype=np.complex128) if generators else _NO_GENERATORS
    _compiled().pauli_rotations(np.ascontiguousarray(weights, dtype=np.float64), program.axes, rot, gen)
    return rot, gen


def shift_rule_rotations(program: Program, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rotations_and_generators`` from the ansatz's ``matrices_np`` alone: at the weights and at each
    weight shifted by pi (dR/dw = R(w + pi) / 2 for a Pauli-rotation angle)."""
    k = weights.shape[-1]
    if k not in _SHIFTS:  # the weights, then each shifted by pi
        _SHIFTS[k] = np.concatenate([np.zeros((1, k)), np.pi * np.eye(k)])
    matrices = ANSATZE[program.ansatz].matrices_np(weights[:, :, None, :] + _SHIFTS[k], program.options)
    rotations = matrices[:, :, 0]  # (L, n, 1 + k, 2, 2): at the weights, then each shifted
    return rotations, 0.5 * (np.conj(np.swapaxes(rotations, -1, -2))[:, :, None] @ matrices[:, :, 1:])


def rotations_and_generators(program: Program, weights: np.ndarray,
                             compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each wire's matrix R (L, n, 2, 2) at weights (L, n, k), and for each weight g = R^dagger dR/dw
    (L, n, k, 2, 2); numpy complex128. Every analytic weight gradient uses it (the dense executor's, the
    block and kernel state-vector executors'): one compiled call for an ansatz that names its Pauli axes,
    else ``shift_rule_rotations``. ``compiled=False`` (the block executor, ``statevector.BlockMatrices``)
    always takes the numpy rule: 0.08 against 0.006 ms a call (8 qubits, 2 layers of Rot), nothing beside
    a training sweep of many rows, and a process whose plan never runs a kernel (a learner's 8-qubit
    actor at 1,200 rows) is spared numba's start-up, its import and the load of the cached machine code
    (1.05 s, about 8% of a 12,304-step MAPPO run on spread)."""
    built = pauli_rotations(program, weights, True) if compiled else None
    return shift_rule_rotations(program, weights) if built is None else built


def rotations(program: Program, weights: np.ndarray, generators: bool) -> tuple[np.ndarray, np.ndarray]:
    """``rotations_and_generators`` with ``generators``; without, the wires' matrices alone (and an empty array)."""
    if generators:
        return rotations_and_generators(program, weights)
    built = pauli_rotations(program, weights, False)
    if built is not None:
        return built
    return ANSATZE[program.ansatz].matrices_np(weights, program.options), _NO_GENERATORS


def forward(program: Program, angles: np.ndarray, rot: np.ndarray,
            keep_states: bool) -> tuple[np.ndarray, np.ndarray]:
    """Readouts (B, m) float64 of encoding angles (B, n) at the wires' matrices ``rot``, and the final
    states (B, 2^n) complex128 for ``weight_grad`` (with ``keep_states``; else an empty array)."""
    angles = np.ascontiguousarray(angles, dtype=np.float64)
    rows = angles.shape[0]
    readouts = np.empty((rows, program.readout_rows.shape[0]))
    states = np.empty((rows, program.readout_rows.shape[1]), dtype=np.complex128) if keep_states else _NO_STATES
    _compiled().forward(angles, program.state_map, rot, program.inverse, program.sign, program.entangle_first,
                        program.readout_rows, states, readouts)
    return readouts, states


def weight_grad(program: Program, states: np.ndarray, grad_readouts: np.ndarray, rot: np.ndarray,
                gen: np.ndarray) -> np.ndarray:
    """d loss / d weights (L, n, k) float64 from ``forward``'s final states and d loss / d readouts (B, m)."""
    out = np.empty(gen.shape[:3])
    _compiled().backward(states, np.ascontiguousarray(grad_readouts, dtype=np.float64), rot, gen, program.forward,
                         program.sign, program.entangle_first, program.readout_rows, out)
    return out


# -- the same kernels over S weight sets (a leading seed axis): one compiled call for every seed, each
# seed's arithmetic the single call's (``circuits.twins.SeedBatchedVQC``, batched seeds)
def rotations_seeds(program: Program, weights: np.ndarray, generators: bool) -> tuple[np.ndarray, np.ndarray]:
    """``rotations`` of S weight sets (S, L, n, k): (S, L, n, 2, 2) and (S, L, n, k, 2, 2) (or empty).
    Every builder works on each (layer, wire) alone, so the S sets are built as S L layers of one call."""
    S, L = weights.shape[:2]
    rot, gen = rotations(program, weights.reshape((S * L,) + weights.shape[2:]), generators)
    rot = rot.reshape((S, L) + rot.shape[1:])
    return rot, (gen.reshape((S, L) + gen.shape[1:]) if gen.size else gen)


def forward_seeds(program: Program, angles: np.ndarray, rot: np.ndarray,
                  keep_states: bool) -> tuple[np.ndarray, np.ndarray]:
    """``forward`` of S weight sets: angles (S, B, n), rot (S, L, n, 2, 2) -> readouts (S, B, m) and, with
    ``keep_states``, the final states (S, B, 2^n)."""
    angles = np.ascontiguousarray(angles, dtype=np.float64)
    S, rows = angles.shape[:2]
    size = program.readout_rows.shape[1]
    readouts = np.empty((S, rows, program.readout_rows.shape[0]))
    states = np.empty((S, rows if keep_states else 0, size), dtype=np.complex128)
    _compiled().forward_seeds(angles, program.state_map, np.ascontiguousarray(rot), program.inverse, program.sign,
                              program.entangle_first, program.readout_rows, states, readouts)
    return readouts, states


def weight_grad_seeds(program: Program, states: np.ndarray, grad_readouts: np.ndarray, rot: np.ndarray,
                      gen: np.ndarray) -> np.ndarray:
    """``weight_grad`` of S weight sets: d loss / d weights (S, L, n, k) from ``forward_seeds``' states."""
    out = np.empty(gen.shape[:4])
    _compiled().backward_seeds(states, np.ascontiguousarray(grad_readouts, dtype=np.float64), np.ascontiguousarray(rot),
                               np.ascontiguousarray(gen), program.forward, program.sign, program.entangle_first,
                               program.readout_rows, out)
    return out


# -- many rows: the compiled kernels on a batch-last state, rows vectorised (``numba_kernels.columns_*``),
# in the state's precision (the head's dtype: complex64 computes in float32, as the numpy blocks do)
def planar_rotations(rot: np.ndarray, complex_dtype: np.dtype) -> np.ndarray:
    """The wires' matrices (L, n, 2, 2) complex128 as the columns kernels take them: (L, n, 2, 2, 2),
    [.., (re, im)] in the state's real dtype."""
    real = np.empty(0, dtype=complex_dtype).real.dtype
    return np.ascontiguousarray(np.stack([rot.real, rot.imag], axis=-1), dtype=real)


def columns_forward(program: Program, angles: np.ndarray, rot: np.ndarray,
                    keep_states: bool) -> tuple[np.ndarray, np.ndarray]:
    """Readouts (B, m) float64 of encoding angles (B, n) at the wires' matrices ``rot`` (``rotations``),
    computed in ``program.complex_dtype``'s precision, and with ``keep_states`` the final states for
    ``columns_weight_grad`` ((2, 2^n, B): real and imaginary parts; else an empty array)."""
    compiled = _compiled()
    angles = np.ascontiguousarray(angles, dtype=np.float64)
    rows = angles.shape[0]
    planar = planar_rotations(rot, program.complex_dtype)
    size = program.readout_rows.shape[1]
    readouts = np.empty((rows, program.readout_rows.shape[0]))
    states = np.empty((2, size, rows if keep_states else 0), dtype=planar.dtype)
    work = np.empty((2, size, 2 * compiled.CHUNK), dtype=planar.dtype)
    compiled.columns_forward(angles, program.state_map, planar, program.inverse, program.sign,
                             program.entangle_first, program.readout_rows, states, readouts, work)
    return readouts, states


def columns_weight_grad(program: Program, states: np.ndarray, grad_readouts: np.ndarray, rot: np.ndarray,
                        gen: np.ndarray) -> np.ndarray:
    """d loss / d weights (L, n, k) float64 from ``columns_forward``'s final states and d loss / d readouts (B, m)."""
    compiled = _compiled()
    out = np.empty(gen.shape[:3])
    planar = planar_rotations(rot, program.complex_dtype)
    work = np.empty((2, states.shape[1], 4 * compiled.CHUNK), dtype=states.dtype)
    weights_rows = np.ascontiguousarray(program.readout_rows.T @ np.asarray(grad_readouts, dtype=np.float64).T)
    compiled.columns_backward(states, weights_rows, planar, rot, gen, program.forward, program.sign,
                              program.entangle_first, out, work)
    return out
