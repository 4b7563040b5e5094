"""Z-basis readouts: <Z_i>, <Z_i Z_(i+1)>, P(qubit i = 0)."""
from __future__ import annotations

from typing import Any

from circuits.blocks import CircuitConfigError, Observable, register


def single_wires(n_qubits: int) -> list[tuple[int, ...]]:
    return [(i,) for i in range(n_qubits)]


def neighbour_pairs(n_qubits: int) -> list[tuple[int, ...]]:
    if n_qubits < 2:
        raise CircuitConfigError("observable zz needs n_qubits >= 2")
    if n_qubits == 2:
        return [(0, 1)]
    return [(i, (i + 1) % n_qubits) for i in range(n_qubits)]


def z_product(qml: Any, wires: tuple[int, ...]) -> Any:
    operator = qml.PauliZ(wires[0])
    for wire in wires[1:]:
        operator = operator @ qml.PauliZ(wire)
    return qml.expval(operator)


Z = register(Observable("z", "<Z_i> for every qubit i", single_wires, z_product))
ZZ = register(Observable("zz", "<Z_i Z_(i+1 mod n)> for neighbouring pairs (one pair for n = 2)", neighbour_pairs, z_product))
P0 = register(Observable("p0", "P(qubit i = 0) = (<Z_i> + 1) / 2 for every qubit i", single_wires,
                         lambda qml, wires: qml.expval(qml.Projector([0], wires=wires[0])),
                         value=lambda z: (z + 1.0) / 2.0))
