"""One rotation (key ``rotation``) per qubit, then a ring of ``entangler`` gates (PennyLane's
BasicEntanglerLayers for CNOT)."""
from __future__ import annotations

from typing import Any

from circuits import gates
from circuits.blocks import Ansatz, LayerOptions, Pair, register


def pairs(n_qubits: int, layer: int, options: LayerOptions) -> list[Pair]:
    if n_qubits < 2:
        return []
    if n_qubits == 2:
        return [(options.entangler, 0, 1)]
    return [(options.entangler, i, (i + 1) % n_qubits) for i in range(n_qubits)]


def pennylane_layer(qml: Any, weights: Any, layer: int, wires: list[int], options: LayerOptions) -> None:
    gate = getattr(qml, gates.PENNYLANE_GATES[options.rotation])
    if options.entangler == "cnot":
        qml.BasicEntanglerLayers(weights[layer : layer + 1, :, 0], wires=wires, rotation=gate)
        return
    for wire in wires:
        gate(weights[layer, wire, 0], wires=wire)
    for _, control, target in pairs(len(wires), layer, options):
        qml.CZ(wires=[control, target])


ANSATZ = register(Ansatz(
    name="basic_entangler",
    help="one rotation (key `rotation`) per qubit, then a ring of `entangler` gates",
    weights_per_qubit=1,
    matrices=lambda weights, options, dtype: gates.rotation_matrices(options.rotation, weights[..., 0], dtype),
    matrices_np=lambda weights, options: gates.rotation_matrices_np(options.rotation, weights[..., 0]),
    pairs=pairs,
    pennylane_layer=pennylane_layer,
    pauli_axes=lambda options: (options.rotation,),
))
