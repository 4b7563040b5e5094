"""PennyLane's StronglyEntanglingLayers: Rot per qubit, then CNOT(i, i + r), r = l mod (n - 1) + 1."""
from __future__ import annotations

from typing import Any

from circuits import gates
from circuits.blocks import Ansatz, LayerOptions, Pair, register


def pairs(n_qubits: int, layer: int, options: LayerOptions) -> list[Pair]:
    if n_qubits < 2:
        return []
    reach = layer % (n_qubits - 1) + 1
    return [("cnot", i, (i + reach) % n_qubits) for i in range(n_qubits)]


def pennylane_layer(qml: Any, weights: Any, layer: int, wires: list[int], options: LayerOptions) -> None:
    n_qubits = len(wires)
    reach = layer % (n_qubits - 1) + 1 if n_qubits > 1 else 0
    qml.StronglyEntanglingLayers(weights[layer : layer + 1], wires=wires, ranges=[reach])


ANSATZ = register(Ansatz(
    name="strongly_entangling",
    help="PennyLane StronglyEntanglingLayers: Rot per qubit, CNOT(i, i+r) with r = l mod (n-1) + 1",
    weights_per_qubit=3,
    matrices=gates.rot_layer,
    matrices_np=gates.rot_layer_np,
    pairs=pairs,
    pennylane_layer=pennylane_layer,
    pauli_axes=lambda options: ("rz", "ry", "rz"),  # Rot(w0, w1, w2) = RZ(w2) RY(w1) RZ(w0)
))
