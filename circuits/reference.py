"""The PennyLane reference of a VQC spec: a QNode on any PennyLane device, built from the same spec.

Each registered block supplies its PennyLane ops (``Ansatz.pennylane_layer``,
``Observable.pennylane``); the shipped ones use PennyLane's own gates and templates
(StronglyEntanglingLayers, BasicEntanglerLayers, Projector for P(0)). It is an independent check
of the native engine, and the way to run a trained circuit on other simulators or hardware.
"""
from __future__ import annotations

import importlib.metadata
from typing import Any, Callable

import torch

from circuits.blocks import ANSATZE, ENCODINGS, OBSERVABLES, CircuitConfigError, LayerOptions
from circuits.gates import PENNYLANE_GATES
from circuits.spec import NoiseConfig, VQCConfig


class _LazyPennyLane:
    """PennyLane, imported on first use: it takes seconds to import, and every worker process and
    CLI call loads this module while only `to_qnode` and checks of PennyLane devices need it."""

    def __getattr__(self, name: str) -> Any:
        import pennylane

        return getattr(pennylane, name)


qml = _LazyPennyLane()

# Where a device's plugin comes from (pip package), for the error when it is not installed.
DEVICE_PACKAGES: dict[str, str] = {
    "lightning.qubit": "pennylane-lightning",
    "lightning.gpu": "pennylane-lightning-gpu",
    "lightning.kokkos": "pennylane-lightning-kokkos",
    "lightning.tensor": "pennylane-lightning-tensor",
    "qiskit": "pennylane-qiskit",
    "braket": "amazon-braket-pennylane-plugin",
    "cirq": "pennylane-cirq",
    "qulacs": "pennylane-qulacs",
    "ionq": "pennylane-ionq",
    "rigetti": "pennylane-rigetti",
    "quantuminspire": "pennylane-quantuminspire",
    "aqt": "pennylane-aqt",
    "qrack": "pennylane-qrack",
}


def installed_devices() -> list[str]:
    """Names of the PennyLane devices whose plugins are installed."""
    return sorted(e.name for e in importlib.metadata.entry_points(group="pennylane.plugins"))


def check_device(name: str) -> None:
    """Raise CircuitConfigError naming the pip package when device ``name``'s plugin is missing."""
    available = installed_devices()
    if name in available:
        return
    package = DEVICE_PACKAGES.get(name) or DEVICE_PACKAGES.get(name.split(".")[0])
    hint = f"install it with `pip install {package}`" if package else "no known pip package provides it"
    raise CircuitConfigError(
        f"pennylane_device: {name!r} is not installed ({hint}); installed devices: {', '.join(available)}"
    )


def _encoding_block(cfg: VQCConfig, angles: Any) -> None:
    gate = getattr(qml, PENNYLANE_GATES[ENCODINGS[cfg.encoding].axis])
    for wire in range(cfg.n_qubits):
        if cfg.hadamard:
            qml.Hadamard(wires=wire)
        gate(angles[..., wire], wires=wire)


def _measurements(cfg: VQCConfig) -> Any:
    if cfg.output == "born":  # the bitstring distribution; the head partitions it into actions
        return qml.probs(wires=list(range(cfg.n_qubits)))
    family = OBSERVABLES[cfg.observable]
    return [family.pennylane(qml, wires) for wires in family.wires(cfg.n_qubits)]


def qnode_diff_method(cfg: VQCConfig) -> str:
    """The QNode's diff_method for a spec: its ``grad`` rule, or ``diff_method`` when grad is analytic."""
    return {"parameter_shift": "parameter-shift", "spsa": "spsa"}.get(cfg.grad, cfg.diff_method)


def _gate_noise(noise: NoiseConfig) -> Callable[..., None]:
    """The channels queued after every gate on each of its wires (``qml.noise.insert``), in the
    order of ``circuits.density``: amplitude damping, phase damping, depolarizing."""

    def channels(wires: Any) -> None:
        if noise.amplitude_damping:
            qml.AmplitudeDamping(noise.amplitude_damping, wires=wires)
        if noise.phase_damping:
            qml.PhaseDamping(noise.phase_damping, wires=wires)
        if noise.depolarizing:
            qml.DepolarizingChannel(noise.depolarizing, wires=wires)

    return channels


def build_qnode(cfg: VQCConfig, device: str = "default.qubit", diff_method: str = "best", **device_kwargs: Any) -> qml.QNode:
    """A QNode ``qnode(angles, weights)`` of the spec; angles (B, n) or (B, layers, n) with reupload.

    With ``shots`` the QNode samples that many shots per execution; with ``noise`` the gate channels
    follow every gate on each of its wires (``qml.noise.insert(position="all")``, after templates are
    decomposed; the device must be default.mixed) and readout error is a ``qml.BitFlip`` on every
    wire before the measurements.
    """
    check_device(device)
    noise = cfg.noise
    if noise is not None and noise.channels and device != "default.mixed":
        raise CircuitConfigError(f"noise: PennyLane simulates gate channels on device 'default.mixed' only, got {device!r}")
    dev = qml.device(device, wires=cfg.n_qubits, **device_kwargs)

    ansatz = ANSATZE[cfg.ansatz]
    options = LayerOptions(cfg.rotation, cfg.entangler)
    wires = list(range(cfg.n_qubits))

    def gates(angles: Any, weights: Any) -> None:
        per_block = angles.ndim == 3
        for layer in range(cfg.layers):
            if layer == 0 or cfg.reupload:
                _encoding_block(cfg, angles[:, layer] if per_block else angles)
            ansatz.pennylane_layer(qml, weights, layer, wires, options)

    if noise is not None and noise.channels:
        gates = qml.noise.insert(gates, _gate_noise(noise), [], position="all")

    def circuit(angles: Any, weights: Any) -> list[Any]:
        gates(angles, weights)
        if noise is not None and noise.readout:
            for wire in wires:
                qml.BitFlip(noise.readout, wires=wire)
        return _measurements(cfg)

    return qml.QNode(circuit, dev, interface="torch", diff_method=diff_method, shots=cfg.shots)


def readouts_from_qnode(qnode: qml.QNode, angles: torch.Tensor, weights: torch.Tensor,
                        partition: torch.Tensor | None = None) -> torch.Tensor:
    """Run the QNode on a batch (parameter broadcasting) and stack its readouts into (B, m); a Born head's
    QNode measures probabilities (B, 2^n), returned as ``probabilities @ partition``."""
    if angles.device.type == "cuda":
        with torch.device(angles.device):  # default.qubit makes its initial state on the default device
            results = qnode(angles, weights)
    else:
        results = qnode(angles, weights)
    if partition is not None:
        return torch.as_tensor(results).reshape(angles.shape[0], -1).to(partition.dtype) @ partition
    columns = [torch.as_tensor(r).reshape(-1) for r in results]
    batch = angles.shape[0]
    columns = [c.expand(batch) if c.numel() == 1 else c for c in columns]
    return torch.stack(columns, dim=-1)


def qnode_function(module: torch.nn.Module, qnode: qml.QNode) -> Callable[[torch.Tensor], torch.Tensor]:
    """Wrap a VQC's classical pieces around a QNode: f(x) -> (B, out_dim), with ``f.qnode``."""

    def function(x: torch.Tensor) -> torch.Tensor:
        angles = module.angles(x.to(device=module.weights.device, dtype=module.weights.dtype))
        readouts = readouts_from_qnode(qnode, angles, module.weights, module.born_readout())
        return module.head_output(readouts.to(angles.dtype))

    function.qnode = qnode  # type: ignore[attr-defined]
    return function
