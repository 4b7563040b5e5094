"""DiffQAS (Chen, arXiv 2407.18202): a weighted ensemble of candidate circuits with trainable structure weights.

Model: classical pre-layer -> sum_j w_j f_j(x; theta_j) over a pool of candidate circuits -> Linear.
The pool is encodings {RX, RY, RZ} x {with, without a Hadamard layer} x variational blocks
{RX, RY, RZ} x {CNOT ring, CZ ring} (36 candidates by default), all on the same qubits and layers.
Structure weights w and all theta_j are trained together by gradient. With ``top_k`` > 0, after
``prune_after`` gradient-carrying forward passes only the k candidates of largest |w_j| are
evaluated (the others get no gradient and stay frozen), which bounds the cost. The selection is a
function of the parameters alone, so every asynchronous worker holding the same parameters agrees.

All candidates share the encoded real product vector r(x) (the encoding's fixed map F_j is folded
into each candidate's dense matrix), so the whole pool is one batched matmul.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from circuits import gates
from circuits.engine import COMPLEX_TO_REAL, apply_signed_permutation, kron_matrices
from circuits.blocks import ANSATZE, ENCODINGS, CircuitConfigError, LayerOptions
from circuits.gates import ENTANGLING_GATES, ROTATION_AXES
from circuits.spec import EncodingName, ObservableName, readout_count

COMPLEX_DTYPES = {"complex64": torch.complex64, "complex128": torch.complex128}


@dataclass
class DiffQASConfig:
    """Keys of the ``diffqas`` head: the candidate pool, readout, pruning, placement."""

    n_qubits: int = 4
    layers: int = 2
    encodings: list[EncodingName] = field(default_factory=lambda: ["angle_x", "angle_y", "angle_z"])
    hadamard: list[bool] = field(default_factory=lambda: [False, True])
    rotations: list[Literal["rx", "ry", "rz"]] = field(default_factory=lambda: ["rx", "ry", "rz"])
    entanglers: list[Literal["cnot", "cz"]] = field(default_factory=lambda: ["cnot", "cz"])
    observable: ObservableName = "z"
    scaling: Literal["none", "atan"] = "atan"
    top_k: int = 0
    prune_after: int = 0
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["complex64", "complex128"] = "complex64"
    init_scale: float = float(np.pi)

    def validate(self) -> None:
        """Reject empty pools and out-of-range numbers, naming the key."""
        for key in ("encodings", "hadamard", "rotations", "entanglers"):
            if not getattr(self, key):
                raise CircuitConfigError(f"{key}: the candidate pool needs at least one entry")
        for name in self.encodings:
            if name not in ENCODINGS:
                raise CircuitConfigError(f"encodings: unknown value {name!r}; choices: {', '.join(ENCODINGS)}")
        for name in self.rotations:
            if name not in ROTATION_AXES:
                raise CircuitConfigError(f"rotations: unknown value {name!r}; choices: {', '.join(ROTATION_AXES)}")
        for name in self.entanglers:
            if name not in ENTANGLING_GATES:
                raise CircuitConfigError(f"entanglers: unknown value {name!r}; choices: {', '.join(ENTANGLING_GATES)}")
        if self.n_qubits < 2 or self.n_qubits > 10:
            raise CircuitConfigError(f"n_qubits: DiffQAS needs 2..10 qubits (dense candidates), got {self.n_qubits}")
        if self.layers < 1:
            raise CircuitConfigError(f"layers: expected an integer >= 1, got {self.layers}")
        if self.top_k < 0 or self.prune_after < 0:
            raise CircuitConfigError(f"top_k and prune_after must be >= 0, got {self.top_k}, {self.prune_after}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise CircuitConfigError("device: 'cuda' was requested but torch sees no CUDA GPU (torch.cuda.is_available() is False); use device: cpu")


class Candidate(dict):
    """One pool member: encoding, hadamard, rotation, entangler (a dict, so it serialises as JSON)."""


def candidate_pool(cfg: DiffQASConfig) -> list[Candidate]:
    """Every combination of the configured encodings, Hadamard options, rotations and entanglers."""
    return [
        Candidate(encoding=e, hadamard=h, rotation=r, entangler=g)
        for e, h, r, g in itertools.product(cfg.encodings, cfg.hadamard, cfg.rotations, cfg.entanglers)
    ]


class DiffQAS(nn.Module):
    """(B, in_dim) -> (B, out_dim) through the weighted candidate ensemble; see the module docstring."""

    def __init__(self, cfg: DiffQASConfig, in_dim: int, out_dim: int) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.in_dim, self.out_dim = in_dim, out_dim
        n = cfg.n_qubits
        complex_dtype = COMPLEX_DTYPES[cfg.dtype]
        real_dtype = COMPLEX_TO_REAL[complex_dtype]
        self.complex_dtype = complex_dtype
        self.candidates = candidate_pool(cfg)
        count = len(self.candidates)
        if cfg.top_k > count:
            raise CircuitConfigError(f"top_k: {cfg.top_k} exceeds the pool size {count}")
        self.pre = nn.Linear(in_dim, n, dtype=real_dtype)
        self.structure = nn.Parameter(torch.full((count,), 1.0 / count, dtype=real_dtype))
        self.weights = nn.Parameter((torch.rand(count, cfg.layers, n, dtype=real_dtype) * 2 - 1) * cfg.init_scale)
        self.n_readouts = readout_count(cfg.observable, n)
        self.post = nn.Linear(self.n_readouts, out_dim, dtype=real_dtype)

        dim = 2**n
        encoded, paulis, inverses, signs = [], [], [], []
        for cand in self.candidates:
            state_map = gates.encoding_state_map(cand["encoding"], cand["hadamard"])
            kron = np.ones((1, 1), dtype=np.complex128)
            for _ in range(n):
                kron = np.kron(kron, state_map)
            encoded.append(kron.T)
            paulis.append(ROTATION_AXES[cand["rotation"]])
            ring = LayerOptions(cand["rotation"], cand["entangler"])
            per_layer = [gates.signed_permutation(ANSATZE["basic_entangler"].pairs(n, l, ring), n) for l in range(cfg.layers)]
            inverses.append([p[0] for p in per_layer])
            signs.append([p[1] for p in per_layer])
        self.register_buffer("encoded_basis", torch.as_tensor(np.stack(encoded), dtype=complex_dtype), persistent=False)
        self.register_buffer("paulis", torch.as_tensor(np.stack(paulis), dtype=complex_dtype), persistent=False)
        self.register_buffer("inverses", torch.as_tensor(np.array(inverses)), persistent=False)  # (J, L, 2^n)
        self.register_buffer("signs", torch.as_tensor(np.array(signs), dtype=real_dtype), persistent=False)
        readout = gates.readout_matrix(cfg.observable, n)
        self.register_buffer("readout_stacked", torch.as_tensor(np.concatenate([readout, readout]), dtype=real_dtype), persistent=False)
        self.dim = dim
        self.gradient_calls = 0
        self._cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.to(torch.device(cfg.device))

    def active(self) -> torch.Tensor:
        """Indices of the candidates evaluated now: all, or the top_k by |w| once pruning has begun."""
        count = len(self.candidates)
        if self.cfg.top_k == 0 or self.gradient_calls < self.cfg.prune_after:
            return torch.arange(count, device=self.structure.device)
        return torch.topk(self.structure.detach().abs(), self.cfg.top_k).indices.sort().values

    def dense_matrices(self, active: torch.Tensor) -> torch.Tensor:
        """Real (k, 2^n, 2^(n+1)) matrices [Re D_j | Im D_j] of the active candidates.

        Each layer is the Kronecker product of the candidate's rotations, then its CNOT/CZ ring.
        """
        half = self.weights[active, ..., None, None] * 0.5  # (k, L, n, 1, 1)
        cos, sin = torch.cos(half), torch.sin(half)
        paulis = self.paulis[active][:, None, None]  # (k, 1, 1, 2, 2): broadcasts over layers and wires
        eye = torch.eye(2, dtype=cos.dtype, device=cos.device)
        rotations = torch.complex(cos * eye + sin * paulis.imag, -sin * paulis.real)  # -i s P = s Im P - i s Re P
        kron_transposed = kron_matrices(rotations).transpose(-1, -2)  # (k, L, 2^n, 2^n)
        psi = self.encoded_basis[active]  # (k, 2^n, 2^n), rows are encoded basis states
        for layer in range(self.cfg.layers):
            inverse = self.inverses[active, layer][:, None, :]
            sign = self.signs[active, layer][:, None, :]
            psi = apply_signed_permutation(psi @ kron_transposed[:, layer], inverse, sign)
        return torch.cat([psi.real, psi.imag], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_dim) -> (B, out_dim)."""
        device, dtype = self.structure.device, self.structure.dtype
        features = self.pre(x.to(device=device, dtype=dtype))
        if self.cfg.scaling == "atan":
            features = 2.0 * torch.atan(features)
        grad = torch.is_grad_enabled()
        if grad:
            self.gradient_calls += 1
        active = self.active()
        dense = self.dense_matrices(active) if grad else self._cached_dense(active)
        product = gates.product_state(features)  # (B, 2^n), shared by all candidates
        readouts = (product @ dense).square() @ self.readout_stacked  # (k, B, m)
        mixed = torch.einsum("k,kbm->bm", self.structure[active], readouts)
        out = self.post(mixed)
        return out.to(device=x.device, dtype=x.dtype if x.is_floating_point() else out.dtype)

    def _cached_dense(self, active: torch.Tensor) -> torch.Tensor:
        cache = self._cache
        if cache is not None and torch.equal(cache[0], self.weights) and torch.equal(cache[1], active):
            return cache[2]
        dense = self.dense_matrices(active)
        self._cache = (self.weights.detach().clone(), active.clone(), dense)
        return dense

    def selected_architecture(self) -> dict[str, Any]:
        """The candidates ranked by |structure weight| (the top_k, or all): JSON-able, for summary.json."""
        weights = self.structure.detach().cpu().tolist()
        order = sorted(range(len(weights)), key=lambda j: -abs(weights[j]))
        keep = order[: self.cfg.top_k] if self.cfg.top_k else order
        return {
            "pool_size": len(weights),
            "top_k": self.cfg.top_k,
            "pruning_active": bool(self.cfg.top_k and self.gradient_calls >= self.cfg.prune_after),
            "selected": [dict(self.candidates[j], weight=round(weights[j], 6)) for j in keep],
        }

    def extra_repr(self) -> str:
        return f"in={self.in_dim}, out={self.out_dim}, n_qubits={self.cfg.n_qubits}, layers={self.cfg.layers}, pool={len(self.candidates)}, top_k={self.cfg.top_k}"

