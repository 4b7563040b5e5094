"""Compiled state-vector kernels for a few rows: acting, and the one-step A2C update.

At one to a few rows the numpy paths (the dense matrix up to 4 qubits, ``circuits.adjoint``'s block
sweeps from 5) spend most of a call in numpy's per-call cost: ~15 calls to act, ~200 for a forward
and backward, at about a microsecond each, where one XLA call of a jitted peer does the whole
circuit. Here a row's whole circuit is one loop nest compiled by numba (``circuits.numba_kernels``):
the product state, each layer's signed permutation and per-wire 2 x 2 matrices, the readouts; and
the adjoint method's backward sweep with the weights' gradient. The numpy twins
(``agents.numpy_heads``) take it for up to ``max_rows(n)`` rows; past that numpy's GEMMs, which
work on many rows at once, win (measured by ``marlq bench quantum --peers``, docs/circuits.md).

The kernels compute in complex128, in a fixed order: reruns give the same bits. Where numba cannot
be imported (``available()``), or ``MARLQ_KERNELS=0`` is set, the twins keep the numpy paths; both
are tested against each other and against PennyLane.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from circuits.adjoint import kept_on_circuit
from circuits.blocks import ANSATZE

if TYPE_CHECKING:
    from circuits.engine import CompiledCircuit

_AXES = {"rx": 0, "ry": 1, "rz": 2}
_NUMBA: Any = None  # the kernels module once imported; False where it cannot be
# the most rows a kernel call takes, by qubit count: about where the numpy paths' forward or backward
# became faster (2 layers, CPU time; the table in docs/circuits.md, "compiled kernels"). From 12 qubits numpy's
# 4-wire block GEMMs win even at one row: the kernels apply one wire at a time
MAX_ROWS = {1: 64, 2: 64, 3: 64, 4: 64, 5: 64, 6: 32, 7: 16, 8: 8, 9: 4, 10: 3, 11: 1}


def available() -> bool:
    """Whether the compiled kernels can run here (numba imports, and ``MARLQ_KERNELS`` is not 0)."""
    global _NUMBA
    if _NUMBA is None:
        _NUMBA = False
        if os.environ.get("MARLQ_KERNELS", "1") != "0":
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


class Program:
    """A circuit's fixed arrays as the kernels take them (float64, complex128, int64, one row per
    layer); ``program_of`` keeps one per circuit."""

    def __init__(self, circuit: "CompiledCircuit") -> None:
        layers, size = circuit.layers, 2**circuit.n_qubits
        self.inverse = np.zeros((layers, size), dtype=np.int64)
        self.forward = np.zeros((layers, size), dtype=np.int64)
        self.sign = np.ones((layers, size))
        for layer in range(layers):
            self.inverse[layer] = getattr(circuit, f"inverse_{layer}").numpy()
            self.forward[layer] = getattr(circuit, f"forward_{layer}").numpy()
            self.sign[layer] = getattr(circuit, f"sign_{layer}").numpy()
        self.readout = np.ascontiguousarray(circuit.readout.numpy().T, dtype=np.float64)  # (m, 2^n)
        self.state_map = circuit.state_map.numpy().astype(np.complex128)
        self.entangle_first = bool(circuit.entangle_first)
        ansatz = ANSATZE[circuit.ansatz]
        axes = None if ansatz.pauli_axes is None else ansatz.pauli_axes(circuit.options)
        self.axes = None if axes is None else np.array([_AXES[a] for a in axes], dtype=np.int64)


def program_of(circuit: "CompiledCircuit") -> Program:
    """The circuit's ``Program``, kept on it like ``adjoint.structure_of`` (``adjoint.kept_on_circuit``)."""
    return kept_on_circuit(circuit, "_kernel_program", Program)


_NO_GENERATORS = np.zeros((0, 0, 0, 2, 2), dtype=np.complex128)
_NO_STATES = np.zeros((0, 0), dtype=np.complex128)


def pauli_rotations(circuit: "CompiledCircuit", weights: np.ndarray,
                    generators: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Each wire's matrix (L, n, 2, 2) at weights (L, n, k) float64, and with ``generators`` each weight's
    R^dagger dR/dw (L, n, k, 2, 2) (else an empty array), complex128, in one compiled call; None where
    the kernels are not available or the ansatz does not name its Pauli axes."""
    if not available():
        return None
    program = program_of(circuit)
    if program.axes is None:
        return None
    rot = np.empty(weights.shape[:2] + (2, 2), dtype=np.complex128)
    gen = np.empty(weights.shape + (2, 2), dtype=np.complex128) if generators else _NO_GENERATORS
    _compiled().pauli_rotations(np.ascontiguousarray(weights, dtype=np.float64), program.axes, rot, gen)
    return rot, gen


def rotations(circuit: "CompiledCircuit", weights: np.ndarray, generators: bool) -> tuple[np.ndarray, np.ndarray]:
    """``pauli_rotations``, or for an ansatz that does not name its axes ``matrices_np`` and the shift rule
    (``adjoint.shift_rule_rotations``)."""
    from circuits import adjoint

    built = pauli_rotations(circuit, weights, generators)
    if built is not None:
        return built
    if generators:
        return adjoint.shift_rule_rotations(circuit, weights)
    return ANSATZE[circuit.ansatz].matrices_np(weights, circuit.options), _NO_GENERATORS


def forward(circuit: "CompiledCircuit", angles: np.ndarray, rot: np.ndarray,
            keep_states: bool) -> tuple[np.ndarray, np.ndarray]:
    """Readouts (B, m) float64 of encoding angles (B, n) at the wires' matrices ``rot``, and the final
    states (B, 2^n) complex128 for ``weight_grad`` (with ``keep_states``; else an empty array)."""
    program = program_of(circuit)
    angles = np.ascontiguousarray(angles, dtype=np.float64)
    rows = angles.shape[0]
    readouts = np.empty((rows, program.readout.shape[0]))
    states = np.empty((rows, program.readout.shape[1]), dtype=np.complex128) if keep_states else _NO_STATES
    _compiled().forward(angles, program.state_map, rot, program.inverse, program.sign, program.entangle_first,
                   program.readout, states, readouts)
    return readouts, states


def weight_grad(circuit: "CompiledCircuit", states: np.ndarray, grad_readouts: np.ndarray, rot: np.ndarray,
                gen: np.ndarray) -> np.ndarray:
    """d loss / d weights (L, n, k) float64 from ``forward``'s final states and d loss / d readouts (B, m)."""
    program = program_of(circuit)
    out = np.empty(gen.shape[:3])
    _compiled().backward(states, np.ascontiguousarray(grad_readouts, dtype=np.float64), rot, gen, program.forward,
                    program.sign, program.entangle_first, program.readout, out)
    return out
