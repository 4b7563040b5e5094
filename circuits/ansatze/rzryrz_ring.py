"""Koelle et al.: a CNOT ring 0 -> 1 -> .. -> 0 first, then RZ RY RZ on every qubit."""
from __future__ import annotations

from typing import Any

from circuits import gates
from circuits.blocks import Ansatz, LayerOptions, Pair, register


def pairs(n_qubits: int, layer: int, options: LayerOptions) -> list[Pair]:
    if n_qubits < 2:
        return []
    return [("cnot", i, (i + 1) % n_qubits) for i in range(n_qubits)]


def pennylane_layer(qml: Any, weights: Any, layer: int, wires: list[int], options: LayerOptions) -> None:
    for _, control, target in pairs(len(wires), layer, options):
        qml.CNOT(wires=[control, target])
    for wire in wires:
        qml.RZ(weights[layer, wire, 0], wires=wire)
        qml.RY(weights[layer, wire, 1], wires=wire)
        qml.RZ(weights[layer, wire, 2], wires=wire)


ANSATZ = register(Ansatz(
    name="rzryrz_ring",
    help="Koelle et al.: CNOT ring 0->1->..->0, then RZ RY RZ on every qubit",
    weights_per_qubit=3,
    # RZ(w2) RY(w1) RZ(w0) is PennyLane's Rot(w0, w1, w2)
    matrices=gates.rot_layer,
    matrices_np=gates.rot_layer_np,
    pairs=pairs,
    pennylane_layer=pennylane_layer,
    entangle_first=True,
    pauli_axes=lambda options: ("rz", "ry", "rz"),
    # three gates per wire in PennyLane (RZ, RY, RZ): noise acts after each
    gate_matrices=lambda weights, options, dtype: [gates.rotation_matrices(axis, weights[..., k], dtype)
                                                   for k, axis in enumerate(("rz", "ry", "rz"))],
))
