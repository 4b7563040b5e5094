"""A hardware-efficient layer: RY on every qubit, then a CZ ladder CZ(0, 1), CZ(1, 2), .., CZ(n-2, n-1).

The worked example of docs/circuits.md ("Adding an ansatz"): this file is all it took.
"""
from __future__ import annotations

from typing import Any

from circuits import gates
from circuits.blocks import Ansatz, LayerOptions, Pair, register


def pairs(n_qubits: int, layer: int, options: LayerOptions) -> list[Pair]:
    """The layer's two-qubit gates, in order: an open CZ ladder (none on one qubit)."""
    return [("cz", i, i + 1) for i in range(n_qubits - 1)]


def pennylane_layer(qml: Any, weights: Any, layer: int, wires: list[int], options: LayerOptions) -> None:
    """The same layer in PennyLane ops, for the reference QNode (and the parity tests)."""
    for wire in wires:
        qml.RY(weights[layer, wire, 0], wires=wire)
    for _, control, target in pairs(len(wires), layer, options):
        qml.CZ(wires=[control, target])


ANSATZ = register(Ansatz(
    name="ry_cz",
    help="hardware-efficient: RY per qubit, then a CZ ladder CZ(0,1) .. CZ(n-2,n-1)",
    weights_per_qubit=1,
    # weights (..., n, 1) -> RY(w) per wire (..., n, 2, 2); torch for the engine, numpy for the analytic gradient
    matrices=lambda weights, options, dtype: gates.rotation_matrices("ry", weights[..., 0], dtype),
    matrices_np=lambda weights, options: gates.rotation_matrices_np("ry", weights[..., 0]),
    pairs=pairs,
    pennylane_layer=pennylane_layer,
    pauli_axes=lambda options: ("ry",),
))
