"""The registered building blocks of a VQC: ansaetze, encodings, observables.

Each block is ONE object holding everything every consumer needs: the native engine's dense and
gate paths (``circuits.engine``), the PennyLane reference (``circuits.reference``), the spec's
choices (``circuits.spec``) and ``marlq list``. Nothing else branches on a block's name.

Blocks live one module (or a few related ones) per file in the packages ``circuits/ansatze/``,
``circuits/encodings/`` and ``circuits/observables/``; every module there is imported when the
package is (``discover``), and registers its blocks with ``register``. Adding one is adding one
file: see docs/circuits.md.

The block registry is ``marl_q.registry``'s ``ANSATZE``, ``ENCODINGS`` and ``OBSERVABLES`` (one table
each, where ``marlq list`` reads them too); ``register`` adds to them, and this module's tables of the
same names are views of them by name (``BlockTable``: ``ANSATZE[name]``, ``list(ENCODINGS)``, in the
order the blocks were registered). ``marlq list`` shows their names without importing them (or
torch): the plugin index (``marl_q.plugins``) reads each block module's
``register(Ansatz(name=..., help=...))`` from its source, the registry named by the class's
``registry`` attribute, and the block modules are found by the same function that finds every
plugin module (``marl_q.plugins.import_package``).
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, TypeVar

import numpy as np
import torch

from marl_q import registry as components  # the registries (not the blocks' ``registry`` attribute)


class CircuitConfigError(ValueError):
    """A user-supplied circuit spec is invalid; the message names the key, the value and the choices."""


class LayerOptions(NamedTuple):
    """The spec keys an ansatz layer may read besides its weights (``VQCConfig`` has both)."""

    rotation: str  # "rx" | "ry" | "rz": the rotation of a one-weight-per-qubit family
    entangler: Optional[str]  # "cnot" | "cz": the two-qubit gate of a family that lets the user choose


Pair = tuple[str, int, int]  # (gate "cnot" | "cz", control wire, target wire)


def _matrices_np_from_torch(ansatz: "Ansatz") -> Callable[[np.ndarray, LayerOptions], np.ndarray]:
    def matrices_np(layer_weights: np.ndarray, options: LayerOptions) -> np.ndarray:
        return ansatz.matrices(torch.from_numpy(layer_weights), options, torch.complex128).numpy()

    return matrices_np


@dataclass(frozen=True)
class Ansatz:
    """A trainable layer family. One layer is a single-qubit matrix per wire and a list of CNOT/CZ
    gates (the engine represents exactly these: a Kronecker product and a signed permutation).

    Every weight must enter as the angle of one Pauli rotation exp(-i w P / 2) inside its wire's
    matrix: the analytic dense gradient uses d/dw R(w) = R(w + pi) / 2 (the parity tests check it).
    """

    registry = "ANSATZE"  # the table it is registered in (marl_q.registry's; the plugin index reads it from source)

    name: str
    help: str
    weights_per_qubit: int  # k: weights have shape (layers, n_qubits, k)
    # (..., n, k) real weights of one layer (or of all layers) -> (..., n, 2, 2) complex matrices
    matrices: Callable[[torch.Tensor, LayerOptions, torch.dtype], torch.Tensor]
    # (n_qubits, layer, options) -> the layer's two-qubit gates, in order
    pairs: Callable[[int, int, LayerOptions], list[Pair]]
    # (qml, weights (layers, n, k), layer, wires, options): apply layer ``layer`` with PennyLane ops
    pennylane_layer: Callable[[Any, Any, int, list[int], LayerOptions], None]
    entangle_first: bool = False  # True: the two-qubit gates come before the rotations in a layer
    # ``matrices`` in numpy complex128, for the analytic-gradient path (numpy's per-call cost on these
    # small arrays is a fraction of torch's); None: ``matrices`` in complex128 converted
    matrices_np: Optional[Callable[[np.ndarray, LayerOptions], np.ndarray]] = None
    # the per-wire matrix as the single-qubit gates ``pennylane_layer`` applies, in order (a list of
    # (..., n, 2, 2) whose product, last first, is ``matrices``): the noisy density-matrix path puts
    # its channels after each of them, as PennyLane does. None: one gate per wire (``matrices``).
    gate_matrices: Optional[Callable[[torch.Tensor, LayerOptions, torch.dtype], list[torch.Tensor]]] = None
    # whether every gate has the two-term parameter-shift rule (true when every weight is the angle
    # of one Pauli rotation, the contract above); ``grad: parameter_shift`` refuses an ansatz without
    shift_rule: bool = True
    # the per-wire matrix as Pauli rotations, weight i the angle of the i-th applied (``matrices`` =
    # A_{k-1}(w_{k-1}) .. A_0(w_0), each "rx" | "ry" | "rz"): the compiled kernels (circuits.kernels)
    # then build the matrices and their derivatives in one compiled call. None: ``matrices_np`` and the
    # shift rule (circuits.adjoint.rotations_and_generators)
    pauli_axes: Optional[Callable[[LayerOptions], tuple[str, ...]]] = None

    def __post_init__(self) -> None:
        if self.matrices_np is None:
            object.__setattr__(self, "matrices_np", _matrices_np_from_torch(self))

    def gates(self, weights: torch.Tensor, options: LayerOptions, dtype: torch.dtype) -> list[torch.Tensor]:
        """The layer's single-qubit gates per wire, in the order they act (see ``gate_matrices``)."""
        if self.gate_matrices is None:
            return [self.matrices(weights, options, dtype)]
        return self.gate_matrices(weights, options, dtype)


@dataclass(frozen=True)
class Encoding:
    """Angle encoding: feature x_i enters as R_axis(x_i) on qubit i (after a Hadamard with
    ``hadamard: true``). The dense path folds the encoded qubit F (cos(t/2), sin(t/2)) into its
    matrix (``gates.encoding_state_map``), which holds for a rotation about any Pauli axis."""

    registry = "ENCODINGS"

    name: str
    axis: str  # "rx" | "ry" | "rz" (``gates.ROTATION_AXES``)
    help: str


@dataclass(frozen=True)
class Observable:
    """A family of diagonal readouts: readout j = value(prod_{i in wires_j} Z_i) in the Z basis."""

    registry = "OBSERVABLES"

    name: str
    help: str
    wires: Callable[[int], list[tuple[int, ...]]]  # n_qubits -> the wires each readout measures
    # (qml, wires of one readout) -> a PennyLane measurement of it
    pennylane: Callable[[Any, tuple[int, ...]], Any]
    # the readout as a function of the Z-product eigenvalue (+1 / -1), elementwise on an array
    value: Callable[[np.ndarray], np.ndarray] = lambda z: z


Block = TypeVar("Block", Ansatz, Encoding, Observable)

class BlockTable(MutableMapping):
    """The blocks of one kind by name: a view of their registry in ``marl_q.registry`` (the one table),
    holding the blocks registered so far (every block module is imported with its package), in the
    order they were. Setting a name replaces that block in the registry (a test's stand-in)."""

    def __init__(self, reg: components.Registry) -> None:
        self.registry = reg
        self._entries = reg.registered  # live and read-only: a lookup is one mapping read

    def __getitem__(self, name: str) -> Any:
        return self._entries[name].obj

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __setitem__(self, name: str, block: Any) -> None:
        self.registry.replace(name, block, help=block.help)

    def __delitem__(self, name: str) -> None:
        self.registry.remove(name)

    def __repr__(self) -> str:
        return f"BlockTable({self.registry.kind}: {', '.join(self)})"


ANSATZE = BlockTable(components.ANSATZE)
ENCODINGS = BlockTable(components.ENCODINGS)
OBSERVABLES = BlockTable(components.OBSERVABLES)
PACKAGES = ("circuits.ansatze", "circuits.encodings", "circuits.observables")


def register(block: Block) -> Block:
    """Register an ansatz, encoding or observable under its name (the spec key's value) in its registry
    (``marl_q.registry``, the one named by its class's ``registry``; a subclass counts as its kind);
    returns it. Bind it to a module-level name (``ANSATZ = register(Ansatz(...))``): ``marl_q.plugins``
    finds a module's blocks among its names. A second block under a name is an error."""
    getattr(components, type(block).registry).add(block.name, block, help=block.help)
    return block


def discover(package: str, path: Sequence[str] = ()) -> None:
    """Import every module of ``package`` (not those starting with '_'), in name order: their
    imports register their blocks. Called by each block package's ``__init__``; the modules are found
    as every plugin package's are (``marl_q.plugins.import_package``)."""
    from marl_q.plugins import import_package

    import_package(package)


def lookup(table: dict[str, Block], key: str, name: str) -> Block:
    """``table[name]``, or a CircuitConfigError naming the key and the choices."""
    try:
        return table[name]
    except KeyError:
        raise CircuitConfigError(f"{key}: unknown value {name!r}; choices: {', '.join(table)}") from None


def load_all() -> None:
    """Import the three block packages (which fill ANSATZE, ENCODINGS and OBSERVABLES)."""
    import importlib

    for package in PACKAGES:
        importlib.import_module(package)

