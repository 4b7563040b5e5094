"""A circuit compiled once into an immutable program: what every numpy executor reads.

``Program`` holds a circuit's fixed structure as numpy arrays: the encoding (the fixed 2 x 2 F of
``gates.encoding_state_map``, as a phase per basis state when F is diagonal, else its Kronecker
blocks), per layer the signed permutation of its CNOT/CZ gates and the Pauli axes of its wires'
rotations, and the readout matrix. The torch module ``circuits.engine.CompiledCircuit`` holds the same
structure as buffers (for the torch executors); ``program_of`` compiles its ``Program`` on first use
and keeps it on the module, compiling again only when a buffer it was read from was replaced
(``output: born`` replaces the readout after construction, ``.to()`` replaces every buffer).

This module imports no executor: the executors (``circuits.kernels``, ``circuits.statevector``, the
engine) import it, so the import graph has no cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from circuits.blocks import ANSATZE, LayerOptions

BLOCK_WIDTH = 4  # wires per Kronecker block of the numpy state-vector executor: a 16 x 16 GEMM per block
AXES = {"rx": 0, "ry": 1, "rz": 2}  # the Pauli axes' codes in ``Program.axes`` (circuits.numba_kernels)


def block_layout(n_qubits: int, width: int = BLOCK_WIDTH) -> list[tuple[int, int]]:
    """(first wire, width) of each block: ceil(n / width) blocks of near-equal width, wire 0 first."""
    count = -(-n_qubits // width)
    base, extra = divmod(n_qubits, count)
    layout, first = [], 0
    for b in range(count):
        w = base + (1 if b < extra else 0)
        layout.append((first, w))
        first += w
    return layout


def kron_matrices(matrices: Any) -> Any:
    """Kronecker product over wires of per-wire matrices: (..., n, 2, 2) -> (..., 2^n, 2^n), wire 0 first;
    torch tensors or numpy arrays."""
    out = matrices[..., 0, :, :]
    for wire in range(1, matrices.shape[-3]):
        size = out.shape[-1] * 2
        out = (out[..., :, None, :, None] * matrices[..., wire, None, :, None, :]).reshape(*out.shape[:-2], size, size)
    return out


_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (complex64 -> complex64, ...)."""
    if dtype not in _NUMPY_DTYPES:
        _NUMPY_DTYPES[dtype] = torch.empty((), dtype=dtype).numpy().dtype
    return _NUMPY_DTYPES[dtype]


@dataclass(frozen=True, eq=False)
class Program:
    """One circuit's structure (see the module docstring). Arrays are read-only.

    Two forms of the permutations and readouts, one per numpy executor family member: the compiled
    kernels take float64 / int64 / complex128 rows (``inverse``, ``forward``, ``sign``, ``readout_rows``,
    ``state_map``); the block GEMMs take the state's own dtype (``sign_columns``, ``readout``,
    ``phase``, ``encoders``), so a complex64 head computes in complex64.
    """

    n_qubits: int
    layers: int
    ansatz: str
    options: LayerOptions
    entangle_first: bool
    complex_dtype: np.dtype  # the state's dtype on the block path (the head's ``dtype``)
    layout: tuple[tuple[int, int], ...]  # the Kronecker blocks (``block_layout``)
    inverse: np.ndarray  # (L, 2^n) int64: layer l maps psi to psi[inverse[l]] * sign[l]
    forward: np.ndarray  # (L, 2^n) int64: its inverse permutation (undoing a layer's gates)
    sign: np.ndarray  # (L, 2^n) float64
    sign_columns: tuple[np.ndarray | None, ...]  # per layer: None when every sign is 1, else (2^n, 1) real
    readout: np.ndarray  # (2^n, m) in the state's real dtype
    readout_rows: np.ndarray  # (m, 2^n) float64
    state_map: np.ndarray  # (2, 2) complex128: the encoding's F
    phase: np.ndarray | None  # (2^n, 1): F^(x)n as a phase per basis state when F is diagonal, else None
    encoders: tuple[np.ndarray, ...]  # F^(x)w per block (the state's dtype)
    axes: np.ndarray | None  # (k,) int64 Pauli axis codes of each weight's rotation, or None
    reupload: bool = False  # data re-uploading: the encoding block again before every layer from 1 on
    upload_gate: np.ndarray | None = None  # (2, 2, 2) [h, -i P h] (the state's dtype): the encoding's gate is
    # cos(t/2) [0] + sin(t/2) [1] (``gates.encoding_gate_parts``); None without re-uploading
    upload_generator: np.ndarray | None = None  # (2, 2) -i P / 2 (the state's dtype, ``gates.encoding_generator``)

    @staticmethod
    def compile(circuit: Any) -> "Program":
        """The program of a ``circuits.engine.CompiledCircuit``, read from its buffers (a circuit pickled
        by an earlier version may not know its spec's every key, but its buffers hold the structure)."""
        layers, n = circuit.layers, circuit.n_qubits
        buffers = circuit._buffers
        return Program.assemble(
            n, circuit.ansatz, circuit.options, numpy_dtype(circuit.complex_dtype),
            [buffers[f"inverse_{l}"].cpu().numpy() for l in range(layers)],
            [buffers[f"sign_{l}"].cpu().numpy() for l in range(layers)],
            buffers["readout"].cpu().numpy(), buffers["state_map"].cpu().numpy().astype(np.complex128),
            _upload(circuit.encoding, circuit.hadamard) if getattr(circuit, "reupload", False) else None)

    @staticmethod
    def from_spec(cfg: Any, complex_dtype: Any = np.complex128, readout: np.ndarray | None = None) -> "Program":
        """The program of a ``VQCConfig`` (no torch module: nothing of size 4^n is built), optionally with
        another readout matrix (2^n, m) than the spec's observable."""
        from circuits import gates

        options = LayerOptions(cfg.rotation, cfg.entangler)
        real = np.empty(0, dtype=complex_dtype).real.dtype
        permutations = [gates.signed_permutation(ANSATZE[cfg.ansatz].pairs(cfg.n_qubits, layer, options), cfg.n_qubits)
                        for layer in range(cfg.layers)]
        if readout is None:
            readout = gates.readout_matrix(cfg.observable, cfg.n_qubits)
        return Program.assemble(
            cfg.n_qubits, cfg.ansatz, options, np.dtype(complex_dtype),
            [np.asarray(inverse) for inverse, _ in permutations], [np.asarray(sign, dtype=real) for _, sign in permutations],
            np.asarray(readout, dtype=real), gates.encoding_state_map(cfg.encoding, cfg.hadamard).astype(np.complex128),
            _upload(cfg.encoding, cfg.hadamard) if cfg.reupload else None)

    @staticmethod
    def assemble(n: int, ansatz_name: str, options: LayerOptions, complex_dtype: np.dtype, inverses: list[np.ndarray],
                 signs: list[np.ndarray], readout: np.ndarray, state_map: np.ndarray,
                 upload: tuple[np.ndarray, np.ndarray] | None = None) -> "Program":
        """The program from its parts: per layer the inverse permutation and the signs (the state's real
        dtype), the readout matrix (2^n, m), the encoding's 2 x 2 F and, with re-uploading, the encoding
        gate's parts and generator (``_upload``)."""
        layers = len(inverses)
        inverse = np.stack(inverses).astype(np.int64) if layers else np.zeros((0, 2**n), np.int64)
        forward = np.stack([np.argsort(row) for row in inverse]).astype(np.int64) if layers else inverse
        sign = np.stack(signs).astype(np.float64) if layers else np.ones((0, 2**n))
        ansatz = ANSATZE[ansatz_name]
        names = None if ansatz.pauli_axes is None else ansatz.pauli_axes(options)
        layout = tuple(block_layout(n))
        program = Program(
            n_qubits=n, layers=layers, ansatz=ansatz_name, options=options,
            entangle_first=bool(ansatz.entangle_first), complex_dtype=complex_dtype, layout=layout,
            inverse=inverse, forward=forward, sign=sign,
            sign_columns=tuple(None if bool(np.all(row == 1.0)) else row[:, None] for row in signs),
            readout=readout, readout_rows=np.ascontiguousarray(readout.T, dtype=np.float64),
            state_map=state_map,
            phase=_diagonal_phase(state_map, n, complex_dtype),
            encoders=tuple(kron_matrices(np.broadcast_to(state_map, (width, 2, 2))).astype(complex_dtype)
                           for _, width in layout),
            axes=None if names is None else np.array([AXES[a] for a in names], dtype=np.int64),
            reupload=upload is not None,
            upload_gate=None if upload is None else upload[0].astype(complex_dtype),
            upload_generator=None if upload is None else upload[1].astype(complex_dtype),
        )
        for value in vars(program).values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        return program


def _upload(encoding: str, hadamard: bool) -> tuple[np.ndarray, np.ndarray]:
    """A re-uploading program's encoding gate: its parts and generator (complex128)."""
    from circuits import gates

    return gates.encoding_gate_parts(encoding, hadamard), gates.encoding_generator(encoding)


def _diagonal_phase(state_map: np.ndarray, n_qubits: int, dtype: np.dtype) -> np.ndarray | None:
    """F^(x)n as a phase per basis state (2^n, 1) when F is diagonal, else None."""
    if not np.allclose(state_map, np.diag(np.diag(state_map))):
        return None
    phase = np.ones(1, dtype=np.complex128)
    for _ in range(n_qubits):
        phase = np.kron(phase, np.diag(state_map))
    return phase.astype(dtype)[:, None]


def kept_on_circuit(circuit: Any, attribute: str, make: Callable[[Any], Any]) -> Any:
    """make(circuit), kept on the circuit under ``attribute`` (the circuit leaves it out of its pickles)
    and made again when the buffers it was made from were replaced: a head may replace its readout after
    construction (``output: born``), and ``.to()`` replaces every buffer."""
    buffers = circuit._buffers  # (nn.Module's attribute lookup of a buffer costs a microsecond: a call's cost)
    kept = circuit.__dict__.get(attribute)
    if kept is None or kept[0] is not buffers["readout"] or kept[1] is not buffers.get("inverse_0"):
        kept = (buffers["readout"], buffers.get("inverse_0"), make(circuit))
        circuit.__dict__[attribute] = kept
    return kept[2]


def program_of(circuit: Any) -> Program:
    """The circuit's ``Program``, compiled on first use and kept (``kept_on_circuit``)."""
    return kept_on_circuit(circuit, "_program", Program.compile)
