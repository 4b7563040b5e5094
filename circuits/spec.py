"""The declarative VQC spec: registered building blocks and the config dataclass heads are built from.

One spec drives both the PennyLane reference (``circuits.reference``) and the native torch engine
(``circuits.engine``), so the two can be tested against each other.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Literal, NamedTuple, Optional

import numpy as np

PAULI_X = np.array([[0, 1], [1, 0]], dtype=np.complex128)
PAULI_Y = np.array([[0, -1j], [1j, 0]], dtype=np.complex128)
PAULI_Z = np.array([[1, 0], [0, -1]], dtype=np.complex128)
HADAMARD = np.array([[1, 1], [1, -1]], dtype=np.complex128) / np.sqrt(2.0)

ROTATION_AXES: dict[str, np.ndarray] = {"rx": PAULI_X, "ry": PAULI_Y, "rz": PAULI_Z}
ENTANGLING_GATES = ("cnot", "cz")


class CircuitConfigError(ValueError):
    """A user-supplied circuit spec is invalid; the message names the key, the value and the choices."""


class Encoding(NamedTuple):
    """Angle encoding: each feature x_i enters as the rotation exp(-i x_i P / 2) on qubit i."""

    axis: str
    help: str


class Ansatz(NamedTuple):
    """A trainable layer family: weights per layer and qubit, and whether entangling comes first."""

    weights_per_qubit: int
    entangle_first: bool
    help: str


class Observable(NamedTuple):
    """A family of diagonal readouts (Z-basis measurements)."""

    help: str


ENCODINGS: dict[str, Encoding] = {
    "angle_x": Encoding("rx", "RX(x_i) on qubit i"),
    "angle_y": Encoding("ry", "RY(x_i) on qubit i"),
    "angle_z": Encoding("rz", "RZ(x_i) on qubit i (a global phase unless hadamard: true)"),
}
ANSATZE: dict[str, Ansatz] = {
    "strongly_entangling": Ansatz(3, False, "PennyLane StronglyEntanglingLayers: Rot per qubit, CNOT(i, i+r) with r = l mod (n-1) + 1"),
    "basic_entangler": Ansatz(1, False, "one rotation (key `rotation`) per qubit, then a ring of `entangler` gates"),
    "rzryrz_ring": Ansatz(3, True, "Koelle et al.: CNOT ring 0->1->..->0, then RZ RY RZ on every qubit"),
}
OBSERVABLES: dict[str, Observable] = {
    "z": Observable("<Z_i> for every qubit i"),
    "zz": Observable("<Z_i Z_(i+1 mod n)> for neighbouring pairs (one pair for n = 2)"),
    "p0": Observable("P(qubit i = 0) = (<Z_i> + 1) / 2 for every qubit i"),
}
SCALINGS = ("none", "bound", "atan", "trainable")
OUTPUTS = ("raw", "sum", "scaled", "linear", "relu_linear")

EncodingName = Literal["angle_x", "angle_y", "angle_z"]
AnsatzName = Literal["strongly_entangling", "basic_entangler", "rzryrz_ring"]
ObservableName = Literal["z", "zz", "p0"]


@dataclass
class VQCConfig:
    """The keys of a VQC head (``actor.head: vqc``); the same keys are accepted by ``circuits.VQC``.

    Features map to qubits one to one (feature i -> qubit i); with fewer features than qubits the
    remaining qubits are left unencoded. More features than qubits need ``preprocess: linear``.
    ``scaling: bound`` maps feature i to pi x_i / bounds[i]; a ``null`` bound means the feature is
    unbounded and is mapped by 2 atan(x_i) instead (Koelle et al.'s CartPole encoding).
    ``output``: raw = the first out_dim readouts; sum = readout i added into output i mod out_dim;
    scaled = raw times a trainable per-output scale; linear / relu_linear = a classical Linear
    post-layer (on ReLU of the readouts for relu_linear, Koelle et al.'s hybrid head).
    ``dense_grad``: on the dense CPU path (n <= 8, batches <= 64), analytic = the weight gradient
    contracted from prefix and suffix products of the layer matrices, built once per weight update
    with the cached matrix (the same gradient as autograd up to float rounding, and cheaper at RL
    batch sizes); autograd = backpropagate through every gate (the earlier path; CUDA, larger n and
    larger batches always use it).
    """

    n_qubits: int = 4
    layers: int = 2
    encoding: EncodingName = "angle_x"
    hadamard: bool = False
    scaling: Literal["none", "bound", "atan", "trainable"] = "none"
    bounds: list[Optional[float]] = field(default_factory=list)
    ansatz: AnsatzName = "strongly_entangling"
    rotation: Literal["rx", "ry", "rz"] = "rx"
    entangler: Literal["cnot", "cz"] = "cnot"
    reupload: bool = False
    observable: ObservableName = "z"
    output: Literal["raw", "sum", "scaled", "linear", "relu_linear"] = "raw"
    preprocess: Literal["none", "linear"] = "none"
    backend: Literal["torch", "pennylane"] = "torch"
    engine: Literal["auto", "dense", "gates"] = "auto"
    dense_max_qubits: int = 10
    device: Literal["cpu", "cuda"] = "cpu"
    pennylane_device: str = "default.qubit"
    diff_method: str = "backprop"
    dtype: Literal["complex64", "complex128"] = "complex64"
    dense_grad: Literal["analytic", "autograd"] = "analytic"
    init_scale: float = float(np.pi)
    seed: Optional[int] = None


_CHOICES: dict[str, tuple[str, ...]] = {
    "encoding": tuple(ENCODINGS),
    "ansatz": tuple(ANSATZE),
    "observable": tuple(OBSERVABLES),
    "scaling": SCALINGS,
    "output": OUTPUTS,
    "rotation": tuple(ROTATION_AXES),
    "entangler": ENTANGLING_GATES,
    "preprocess": ("none", "linear"),
    "backend": ("torch", "pennylane"),
    "engine": ("auto", "dense", "gates"),
    "device": ("cpu", "cuda"),
    "dtype": ("complex64", "complex128"),
    "dense_grad": ("analytic", "autograd"),
}


def make_config(**spec: object) -> VQCConfig:
    """Build a VQCConfig from keyword keys, rejecting unknown keys with the closest valid one."""
    known = {f.name for f in fields(VQCConfig)}
    for key in spec:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CircuitConfigError(f"unknown VQC key {key!r}{hint}; valid keys: {', '.join(sorted(known))}")
    cfg = VQCConfig(**spec)  # type: ignore[arg-type]
    validate_config(cfg)
    return cfg


def validate_config(cfg: object) -> None:
    """Check the choice-valued and numeric keys of a VQC config; raise CircuitConfigError naming the key."""
    for key, choices in _CHOICES.items():
        value = getattr(cfg, key)
        if value not in choices:
            raise CircuitConfigError(f"{key}: unknown value {value!r}; choices: {', '.join(choices)}")
    if not isinstance(cfg.n_qubits, int) or cfg.n_qubits < 1:
        raise CircuitConfigError(f"n_qubits: expected an integer >= 1, got {cfg.n_qubits!r}")
    if not isinstance(cfg.layers, int) or cfg.layers < 1:
        raise CircuitConfigError(f"layers: expected an integer >= 1, got {cfg.layers!r}")
    for i, bound in enumerate(cfg.bounds):
        if bound is not None and not (np.isfinite(bound) and bound > 0):
            raise CircuitConfigError(f"bounds[{i}]: expected a positive finite number or null, got {bound!r}")


def feature_count(cfg: VQCConfig, in_dim: int) -> int:
    """Number of features entering the circuit (after the optional pre-layer); validates in_dim."""
    if cfg.preprocess == "linear":
        return cfg.n_qubits
    if in_dim > cfg.n_qubits:
        raise CircuitConfigError(
            f"in_dim {in_dim} > n_qubits {cfg.n_qubits}: each feature needs its own qubit; "
            f"set n_qubits >= {in_dim} or preprocess: linear (a classical Linear({in_dim}, n_qubits) pre-layer)"
        )
    return in_dim


def readout_count(observable: str, n_qubits: int) -> int:
    """Number of readouts an observable family produces on n qubits."""
    return len(readout_qubits(observable, n_qubits))


def readout_qubits(observable: str, n_qubits: int) -> list[tuple[int, ...]]:
    """The qubits each readout of an observable family measures (one tuple per readout)."""
    if observable in ("z", "p0"):
        return [(i,) for i in range(n_qubits)]
    if observable == "zz":
        if n_qubits < 2:
            raise CircuitConfigError("observable zz needs n_qubits >= 2")
        if n_qubits == 2:
            return [(0, 1)]
        return [(i, (i + 1) % n_qubits) for i in range(n_qubits)]
    raise CircuitConfigError(f"observable: unknown value {observable!r}; choices: {', '.join(OBSERVABLES)}")
