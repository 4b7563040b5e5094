"""The ``einsum`` executor: the worked example of docs/circuits.md, "Adding an executor".

A forward-only numpy executor in one file. It reads the circuit's compiled ``Program`` (nothing is
rebuilt here): the encoded product state from the one builder (``gates.product_state``), then per
layer each wire's 2 x 2 matrix applied by one ``numpy.einsum`` on the state viewed as
(B, 2, ..., 2), and the layer's CNOT/CZ gates as the program's signed permutation; the readouts are
|psi|^2 @ the program's readout matrix. complex128 throughout.

It runs where the planner's row for it says (``engine: einsum`` in a head's spec, without a weight
gradient: it has no backward, so a call that needs one is refused with a clear error). It is slower
than the statevector executor (one ``einsum`` per wire and layer); it is here to show what adding an
executor takes, and it is checked against PennyLane (tests/circuits/test_einsum_executor.py).
"""
from __future__ import annotations

import string

import numpy as np

from circuits import gates, kernels
from circuits.program import Program

_LETTERS = string.ascii_uppercase  # einsum subscripts: one per wire (b: the batch, x: a wire's new index)


def apply_wire(psi: np.ndarray, matrix: np.ndarray, wire: int, n_qubits: int) -> np.ndarray:
    """One 2 x 2 matrix on wire ``wire`` of states psi (B, 2^n), as one einsum on (B, 2, ..., 2)."""
    axes = _LETTERS[:n_qubits]
    out = axes[:wire] + "x" + axes[wire + 1 :]
    spec = f"x{axes[wire]},b{axes}->b{out}"
    return np.einsum(spec, matrix, psi.reshape((-1,) + (2,) * n_qubits)).reshape(psi.shape)


def forward(program: Program, angles: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Readouts (B, m) float64 of encoding angles (B, n) at weights (L, n, k)."""
    n = program.n_qubits
    psi = gates.product_state(np.asarray(angles, dtype=np.float64), state_map=program.state_map)  # (B, 2^n) complex
    rotations = kernels.rotations(program, np.asarray(weights, dtype=np.float64), False)[0]  # (L, n, 2, 2)
    for layer in range(program.layers):
        if program.entangle_first:
            psi = psi[:, program.inverse[layer]] * program.sign[layer]
        for wire in range(n):
            psi = apply_wire(psi, rotations[layer, wire], wire, n)
        if not program.entangle_first:
            psi = psi[:, program.inverse[layer]] * program.sign[layer]
    return (psi.real**2 + psi.imag**2) @ program.readout_rows.T
