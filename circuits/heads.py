"""The quantum heads the runtime registers (``actor.head`` / ``critic.head``): vqc, hybrid, diffqas.

Each entry is a HeadSpec(config, build, help); ``build(cfg, in_dim, out_dim)`` returns a torch
module mapping (B, in_dim) -> (B, out_dim). Bad keys raise CircuitConfigError (a ValueError) naming
the key, which the config loader reports as a ConfigError.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from torch import nn

from circuits.diffqas import DiffQAS, DiffQASConfig
from circuits.spec import AnsatzName, ObservableName, OutputName, VQCConfig, validate_config
from circuits.reference import check_device
from circuits.vqc import VQC, resolve_device


class HeadSpec(NamedTuple):
    """How to build one head: its config dataclass, ``build(cfg, in_dim, out_dim)`` and a one-line help."""

    config: type
    build: Callable[[Any, int, int], nn.Module]
    help: str


@dataclass
class VQCHeadConfig(VQCConfig):
    """The ``vqc`` head: every key of circuits.spec.VQCConfig."""

    def validate(self) -> None:
        """Check choices and numbers, the CUDA device and the PennyLane plugin (called by the config loader)."""
        validate_config(self)
        resolve_device(self.device)
        if self.backend == "pennylane":
            check_device(self.pennylane_device)


@dataclass
class HybridHeadConfig(VQCHeadConfig):
    """The ``hybrid`` head (Koelle et al.): a VQC read out as P(0) per qubit, then ReLU -> Linear."""

    ansatz: AnsatzName = "rzryrz_ring"
    observable: ObservableName = "p0"
    output: OutputName = "relu_linear"


def build_vqc(cfg: VQCConfig, in_dim: int, out_dim: int) -> nn.Module:
    """A VQC head from its config section."""
    return VQC(in_dim, out_dim, config=cfg)


def build_diffqas(cfg: DiffQASConfig, in_dim: int, out_dim: int) -> nn.Module:
    """A DiffQAS ensemble head; ``module.selected_architecture()`` reports the chosen candidates."""
    return DiffQAS(cfg, in_dim, out_dim)


HEADS: dict[str, HeadSpec] = {
    "vqc": HeadSpec(VQCHeadConfig, build_vqc, "variational quantum circuit (native torch engine or PennyLane)"),
    "hybrid": HeadSpec(HybridHeadConfig, build_vqc, "VQC with P(0) readout, ReLU and a Linear post-layer (Koelle et al.)"),
    "diffqas": HeadSpec(DiffQASConfig, build_diffqas, "DiffQAS: weighted ensemble of candidate circuits, trainable structure weights, top-k pruning"),
}
