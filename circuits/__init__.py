"""Variational quantum circuits: the declarative spec, the PennyLane reference, the native engine, heads.

``circuits.VQC(in_dim, out_dim, **spec)`` is the entry point; ``circuits.heads.HEADS`` and
``circuits.bench.BENCHES`` are what the runtime registers (see marl_q/PLUGINS.md).
"""
from circuits.spec import CircuitConfigError, VQCConfig
from circuits.vqc import VQC

__all__ = ["VQC", "VQCConfig", "CircuitConfigError"]
