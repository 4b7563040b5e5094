"""The declarative VQC spec: the config dataclass heads are built from, its choices drawn from the
registered building blocks (``circuits.blocks``).

One spec drives both the PennyLane reference (``circuits.reference``) and the native torch engine
(``circuits.engine``), so the two can be tested against each other.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Literal, Optional

import numpy as np

from circuits import blocks
from circuits.blocks import ANSATZE, ENCODINGS, OBSERVABLES, CircuitConfigError, lookup
from circuits.planner import ADDED, ENGINES
from circuits.gates import ENTANGLING_GATES, HADAMARD, PAULI_X, PAULI_Y, PAULI_Z, ROTATION_AXES  # noqa: F401 (re-exported)

blocks.load_all()  # every module of circuits/ansatze, circuits/encodings, circuits/observables

SCALINGS = ("none", "bound", "atan", "trainable")
GRADS = ("analytic", "parameter_shift", "spsa")
OUTPUTS = ("raw", "sum", "scaled", "linear", "relu_linear", "softmax", "born")
OutputName = Literal[OUTPUTS]  # type: ignore[valid-type]

# The choices the config loader validates and ``marlq list`` shows: whatever is registered.
EncodingName = Literal[tuple(ENCODINGS)]  # type: ignore[valid-type]
AnsatzName = Literal[tuple(ANSATZE)]  # type: ignore[valid-type]
ObservableName = Literal[tuple(OBSERVABLES)]  # type: ignore[valid-type]


@dataclass
class NoiseConfig:
    """The ``noise`` section of a circuit head (docs/circuits.md, "Shots, noise and hardware gradients").

    After every gate, on every wire the gate acts on (PennyLane's ``qml.noise.insert(..., position="all")``
    after templates are decomposed): amplitude damping (gamma), then phase damping (gamma), then the
    depolarizing channel (p). ``readout``: each measured bit is flipped with this probability (a
    ``qml.BitFlip`` on every wire just before the measurement).
    """

    depolarizing: float = 0.0
    amplitude_damping: float = 0.0
    phase_damping: float = 0.0
    readout: float = 0.0

    def validate(self) -> None:
        """Every probability in [0, 1], naming the key."""
        for key in ("depolarizing", "amplitude_damping", "phase_damping", "readout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise CircuitConfigError(f"{key}: expected a probability in [0, 1], got {value!r}")

    @property
    def channels(self) -> bool:
        """Whether any gate channel is on (these need the density-matrix path; readout error alone does not)."""
        return bool(self.depolarizing or self.amplitude_damping or self.phase_damping)


@dataclass
class VQCConfig:
    """The keys of a VQC head (``actor.head: vqc``); the same keys are accepted by ``circuits.VQC``.

    Features map to qubits one to one (feature i -> qubit i); with fewer features than qubits the
    remaining qubits are left unencoded. More features than qubits need ``preprocess: linear``.
    ``scaling: bound`` maps feature i to pi x_i / bounds[i]; a ``null`` bound means the feature is
    unbounded and is mapped by 2 atan(x_i) instead (Koelle et al.'s CartPole encoding).
    ``output``: raw = the first out_dim readouts; sum = readout i added into output i mod out_dim;
    scaled = raw times a trainable per-output scale; linear / relu_linear = a classical Linear
    post-layer (on ReLU of the readouts for relu_linear, Koelle et al.'s hybrid head); softmax = Jerbi
    et al.'s beta x weighted observables; born = log of the bitstring probabilities partitioned into
    actions (b -> b mod out_dim; ``observable`` is not read). See circuits/policies.py.
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
    output: OutputName = "raw"
    preprocess: Literal["none", "linear"] = "none"
    backend: Literal["torch", "pennylane"] = "torch"
    engine: Literal[ENGINES] = "auto"  # type: ignore[valid-type]  # the executors (circuits.planner)
    dense_max_qubits: int = 10
    device: Literal["cpu", "cuda"] = "cpu"
    pennylane_device: str = "default.qubit"
    diff_method: str = "backprop"
    dtype: Literal["complex64", "complex128"] = "complex64"
    dense_grad: Literal["analytic", "autograd"] = "analytic"
    init_scale: float = float(np.pi)
    seed: Optional[int] = None
    # hardware-like execution (circuits/shots.py, circuits/density.py, circuits/gradients.py):
    # expectation values from this many measured bitstrings per circuit (null: exact)
    shots: Optional[int] = None
    noise: Optional[NoiseConfig] = None
    # analytic: autograd (straight-through past the shot sampling); parameter_shift: two circuits per
    # parameter; spsa: two circuits per step, a random +-1 direction scaled by spsa_step
    grad: Literal["analytic", "parameter_shift", "spsa"] = "analytic"
    spsa_step: float = 0.1


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
    "engine": ENGINES,
    "device": ("cpu", "cuda"),
    "dtype": ("complex64", "complex128"),
    "dense_grad": ("analytic", "autograd"),
    "grad": GRADS,
}


def make_config(**spec: object) -> VQCConfig:
    """Build a VQCConfig from keyword keys, rejecting unknown keys with the closest valid one."""
    known = {f.name for f in fields(VQCConfig)}
    for key in spec:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CircuitConfigError(f"unknown VQC key {key!r}{hint}; valid keys: {', '.join(sorted(known))}")
    if isinstance(spec.get("noise"), dict):
        spec = {**spec, "noise": make_noise(spec["noise"])}
    cfg = VQCConfig(**spec)  # type: ignore[arg-type]
    validate_config(cfg)
    return cfg


def make_noise(keys: dict) -> NoiseConfig:
    """A NoiseConfig from a mapping, rejecting unknown keys with the valid ones."""
    known = [f.name for f in fields(NoiseConfig)]
    for key in keys:
        if key not in known:
            raise CircuitConfigError(f"noise.{key}: unknown key; valid keys: {', '.join(known)}")
    return NoiseConfig(**keys)


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
    validate_hardware(cfg)


def validate_hardware(cfg: VQCConfig) -> None:
    """The keys of hardware-like execution: shots, noise (and whether the chosen path can simulate it),
    grad (and whether the ansatz has a shift rule)."""
    shots = cfg.shots
    if shots is not None and (isinstance(shots, bool) or not isinstance(shots, int) or shots < 1):
        raise CircuitConfigError(f"shots: expected a positive integer or null, got {shots!r}")
    noise = cfg.noise
    if noise is not None:
        if not isinstance(noise, NoiseConfig):
            raise CircuitConfigError(f"noise: expected a mapping of depolarizing, amplitude_damping, phase_damping, readout; got {noise!r}")
        try:
            noise.validate()
        except CircuitConfigError as exc:
            raise CircuitConfigError(f"noise.{exc}") from None
        if noise.channels and cfg.backend == "torch" and cfg.engine != "auto":
            raise CircuitConfigError(
                f"noise: gate channels need the density-matrix path, which engine 'auto' takes; engine "
                f"{cfg.engine!r} is a state-vector path (readout error alone works on any engine)")
        if noise.channels and cfg.backend == "pennylane" and cfg.pennylane_device != "default.mixed":
            raise CircuitConfigError(
                f"noise: backend pennylane simulates gate channels on pennylane_device 'default.mixed' only, "
                f"got {cfg.pennylane_device!r}")
    if cfg.engine in ADDED and (cfg.reupload or cfg.shots is not None or cfg.noise is not None
                                or cfg.grad != "analytic" or cfg.backend != "torch" or cfg.device != "cpu"):
        raise CircuitConfigError(f"engine: {cfg.engine!r} runs exact circuits without re-uploading on the CPU "
                                 "(no reupload, shots, noise, gradient rule, backend pennylane or device cuda)")
    if cfg.grad == "parameter_shift" and not lookup(ANSATZE, "ansatz", cfg.ansatz).shift_rule:
        raise CircuitConfigError(
            f"grad: ansatz {cfg.ansatz!r} has a gate without a two-term parameter-shift rule; "
            "use grad: spsa or analytic")
    if not (isinstance(cfg.spsa_step, (int, float)) and np.isfinite(cfg.spsa_step) and cfg.spsa_step > 0):
        raise CircuitConfigError(f"spsa_step: expected a positive number, got {cfg.spsa_step!r}")
    if cfg.backend == "pennylane" and shots is not None and cfg.grad == "analytic" and cfg.diff_method == "backprop":
        raise CircuitConfigError(
            "grad: backend pennylane cannot backpropagate through sampled expectation values; "
            "use grad: parameter_shift or spsa (or diff_method: parameter-shift)")


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
    return lookup(OBSERVABLES, "observable", observable).wires(n_qubits)
