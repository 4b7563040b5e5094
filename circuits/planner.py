"""The planner: which executor runs a circuit call. One pure function of its inputs, ``plan``.

The executors (docs/circuits.md, "Executors and the planner"), each with its own forward and backward:

| executor | forward | weight gradient (``Plan.backward``) |
|---|---|---|
| ``dense`` | r(x) @ the cached [Re D, Im D], squared, @ readout | ``analytic`` (``engine.DenseGradient``) or ``autograd`` |
| ``statevector`` | ``blocks``: numpy Kronecker-block GEMMs (``circuits.statevector``; re-uploading included); ``kernels``: numba loops per row, ``columns``: numba loops over a batch-last state (``circuits.kernels``; neither takes re-uploading) | the adjoint method of the same family |
| ``pauli`` | the readouts pushed back through the circuit as Pauli strings (``circuits.pauli``): torch ops on the wires' Bloch vectors | autograd |
| ``torch_autograd`` | torch ops gate by gate (``CompiledCircuit.forward_gates``): CUDA, re-uploading there included | autograd |
| ``density`` | Pauli-transfer density matrix (``circuits.density``) | autograd or the hardware rule |
| ``pennylane`` | a QNode (``circuits.reference``) | PennyLane's diff method |
| ``einsum`` | one ``numpy.einsum`` per gate (``circuits.einsum_executor``: the worked example) | none (forward only) |

A call is planned from the head's ``Facts`` (fixed when the head is built: qubits, backend, device,
engine key, re-uploading, shots / noise / gradient rule), the call's shape (rows, whether a weight
gradient is wanted), the entry point (``torch``: ``VQC.forward``; ``numpy``: the twins of
``circuits.twins``) and one cost input: whether the head's dense matrix is built for reuse at these
weights (``dense_ready``: it is cached, or this is the second call without a gradient at the same
weights). Callers keep a plan per call shape (``Planner``); nothing here reads mutable state.

The thresholds were measured with ``marlq bench quantum --peers`` on one shared 2-core machine
(docs/circuits.md); up to 4 qubits the plan is what every shipped scenario's head always ran, so
their runs keep every bit (the goldens).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

STATEVECTOR_MIN_QUBITS = 5  # from here (CPU, exact, engine auto) training takes the statevector executor
DENSE_MIN_BATCH = 2048  # ... except from this many rows up to 8 qubits: one GEMM with the dense matrix
REUSE_MAX_QUBITS = 7  # from 8 qubits a call without a gradient takes the state vector even where the dense
REUSE_MAX_BATCH = 23  # matrix is cached, past this many rows (8 qubits, 2 layers, an actor's call through
# torch, one thread, CPU time: the cached matrix 0.23 / 0.31 / 0.35 / 0.49 / 0.52 ms at 8 / 12 / 16 / 24 / 48
# rows, the blocks 0.28 / 0.32 / 0.36 / 0.45 / 0.35 ms: MAPPO's 16 envs x 3 agents act on 48 rows. Was 63;
# no shipped scenario has a head of 8 or more qubits, so no golden moved)
COLUMNS_QUBITS = (5, 8)  # a twin's call past the kernels' rows at these qubit counts, training or acting: the
# compiled kernels over a batch-last state (``columns``) rather than the numpy blocks. Training: 2 layers of
# rzryrz_ring, the twin's forward + backward, one core, CPU time, interleaved (load 4.6-6), blocks / columns at
# 16 / 64 / 1,024 rows: 5 qubits 1.93 / 3.62 / 1.66, 6 qubits 1.60 / 3.63 / 1.51, 8 qubits - / 1.61 / 1.18,
# 10 qubits 1.12 / 1.12 / 0.96 (docs/circuits.md, "The columns kernels"). Acting (the acting twin's forward,
# 2 layers, one core, CPU time, interleaved, medians of 7 rounds, load 7-9.6; analysis/peers/act_executors.py),
# blocks / columns past the kernels' rows, 24-1,024 rows: rzryrz_ring 1.44-1.71 (5 qubits), 1.29-1.84 (6),
# 1.59-1.89 (7), 1.22-2.08 (8); strongly_entangling 1.10-1.36, 1.05-1.60, 1.05-1.43, 1.15-1.23; the dense
# matrix, cached, 3.2-16x the blocks there (docs/circuits.md, "Acting through the columns kernels")
# the pauli executor against the state vector's blocks (engine auto, from 5 qubits, CPU, exact): a call of B rows
# costs it about PAULI_CALL_NS + B * (PAULI_ROW_NS * n + PAULI_PRODUCT_NS * cost) (cost: its products per row,
# ``PauliProgram.cost``; its tree and sums are compiled loops, ``pauli.TreeReadouts``) and the blocks about
# B * BLOCKS_AMPLITUDE_NS * L * 2^n. Fitted on training calls (fwd + bwd, one thread, CPU time,
# strongly_entangling, interleaved medians of 20, Zen 5, load 2), pauli / blocks ms at (qubits, layers, cost):
# 48 rows: (5, 2, 366) 0.72 / 0.51, (8, 2, 729) 0.79 / 0.69, (9, 2, 3208) 1.00 / 0.87, (10, 2, 2045) 0.94 / 1.34;
# 256 rows: (5, 2, 366) 0.80 / 0.60, (6, 2, 262) 0.77 / 0.70, (8, 1, 36) 0.62 / 0.69, (8, 2, 729) 0.94 / 1.50,
# (10, 2, 2045) 1.71 / 5.36, (12, 2, 5819) 2.99 / 25.8, (6, 3, 6811) 2.84 / 0.99; 1,200 rows: 1.16 / 1.04,
# 1.13 / 1.52, 1.01 / 1.67, (7, 2, 1105) 1.94 / 2.85, 2.02 / 5.47, (9, 2, 3208) 3.96 / 11.0, 3.28 / 26.4,
# 6.67 / 118, 7.59 / 2.55 (docs/circuits.md, "The pauli executor"). Without numba (MARLQ_KERNELS=0) the tree
# runs as torch ops, about twice the cost at 1,200 rows, and the model is not refitted for it.
PAULI_CALL_NS = 650_000
PAULI_ROW_NS = 50.0
PAULI_PRODUCT_NS = 0.75
BLOCKS_AMPLITUDE_NS = 10.0
# A call without a gradient keeps the pauli executor's weights side per weights (``VQC._act_pauli``), as the
# blocks are kept (an actor acts many times between weight changes), so its fixed cost is the compiled data
# side's: about PAULI_ACT_CALL_NS + cost * PAULI_ACT_PRODUCT_CALL_NS + B * (PAULI_ACT_ROW_NS * n +
# PAULI_ACT_PRODUCT_NS * cost), against the blocks' BLOCKS_ACT_CALL_NS + B * BLOCKS_ACT_AMPLITUDE_NS * L * 2^n.
# Fitted on the torch module's calls under inference_mode, both caches warm (one thread, CPU time, medians of
# 5, Zen 5), pauli / blocks ms at (qubits, layers, cost) and 1 / 48 / 256 rows: (5, 2, 366) 0.028 / 0.031 /
# 0.040 against 0.038 / 0.047 / 0.077; (8, 2, 729) 0.032 / 0.037 / 0.053 against 0.042 / 0.105 / 0.354;
# (10, 2, 2045) 0.050 / 0.061 / 0.090 against 0.060 / 0.305 / 1.35; (8, 2, 41069: rzryrz_ring) 0.82 / 0.91 /
# 1.21 against 0.044 / 0.146 / 0.580; (6, 3, 6811) 0.147 / 0.165 / 0.218 against 0.042 / 0.066 / 0.149.
# Up to REUSE_MAX_QUBITS such a call keeps the plan it had (the blocks, then the cached dense matrix).
PAULI_ACT_CALL_NS = 25_000
PAULI_ACT_PRODUCT_CALL_NS = 18.0
PAULI_ACT_ROW_NS = 5.0
PAULI_ACT_PRODUCT_NS = 0.06
BLOCKS_ACT_CALL_NS = 40_000
BLOCKS_ACT_AMPLITUDE_NS = 2.4
ANALYTIC_MAX_QUBITS = 8  # the dense analytic gradient keeps n + 2 matrices of 2^n x 2^n per layer
ANALYTIC_MAX_BATCH = 64  # ... and its numpy contraction beats autograd's torch kernels up to this many rows
# Executors added in one file each (docs/circuits.md, "Adding an executor"): one row per executor,
# the spec's ``engine`` key that selects it -> the module whose forward(program, angles, weights) runs
ADDED = {"einsum": "circuits.einsum_executor"}
EXECUTORS = ("dense", "statevector", "pauli", "torch_autograd", "density", "pennylane", *ADDED)
ENGINES = ("auto", "dense", "statevector", "gates", "pauli", *ADDED)  # the spec's engine choices (gates: statevector's old name)


@dataclass(frozen=True)
class Facts:
    """What the plan depends on that is fixed for a head (``circuits.vqc.VQC.facts``)."""

    n_qubits: int
    backend: str = "torch"  # torch | pennylane
    device: str = "cpu"
    engine: str = "auto"  # the spec's engine key (``ENGINES``)
    reupload: bool = False
    dense_max_qubits: int = 10
    analytic: bool = True  # dense_grad: analytic, and no shots, noise or gradient rule
    hardware: bool = False  # shots, noise or a gradient rule (circuits.gradients.Hardware)
    noise: bool = False  # gate channels: only the density executor represents them
    layers: int = 0  # (the pauli executor's cost rule reads it)
    pauli_cost: int = 0  # the pauli executor's products per row (``circuits.pauli``); 0: it does not apply


@dataclass(frozen=True)
class Plan:
    executor: str  # one of EXECUTORS
    backward: str  # analytic | autograd | adjoint | rule | none
    variant: str = ""  # statevector: blocks | kernels | columns; dense: cached


def dense_applies(facts: Facts) -> bool:
    """Whether the dense executor can run this circuit at all: all data before the trainable part."""
    if facts.engine == "dense":
        return True
    return facts.engine == "auto" and not facts.reupload and facts.n_qubits <= facts.dense_max_qubits


def analytic_fits(facts: Facts) -> bool:
    """Whether the dense executor's weight gradient may be the analytic contraction (CPU, numpy builds it)."""
    return (facts.analytic and not facts.hardware and facts.device == "cpu" and facts.backend == "torch"
            and facts.n_qubits <= ANALYTIC_MAX_QUBITS and dense_applies(facts))


def pauli_pays(facts: Facts, rows: int, grad: bool = True) -> bool:
    """Whether the pauli executor runs this call under engine auto: from 5 qubits (up to 4 the plan is what
    every shipped head ran), on the CPU, where its cost model beats the state vector's blocks: a training
    call's (``PAULI_CALL_NS``), or, without a gradient, from REUSE_MAX_QUBITS + 1 qubits, an act's with the
    weights side kept (``PAULI_ACT_CALL_NS``)."""
    if not (facts.engine == "auto" and facts.device == "cpu" and facts.backend == "torch" and not facts.reupload
            and facts.n_qubits >= STATEVECTOR_MIN_QUBITS):
        return False
    n, cost, amplitudes = facts.n_qubits, facts.pauli_cost, max(facts.layers, 1) * 2**facts.n_qubits
    if not grad and n > REUSE_MAX_QUBITS:
        pauli = (PAULI_ACT_CALL_NS + cost * PAULI_ACT_PRODUCT_CALL_NS
                 + rows * (PAULI_ACT_ROW_NS * n + PAULI_ACT_PRODUCT_NS * cost))
        return pauli < BLOCKS_ACT_CALL_NS + rows * BLOCKS_ACT_AMPLITUDE_NS * amplitudes
    pauli = PAULI_CALL_NS + rows * (PAULI_ROW_NS * n + PAULI_PRODUCT_NS * cost)
    return pauli < rows * BLOCKS_AMPLITUDE_NS * amplitudes


def without_pauli(facts: Facts) -> Facts:
    """The same facts with the pauli executor out of the question: what the numpy twins (which do not run it)
    plan by, and how they ask whether the state vector's executor serves a head."""
    return replace(facts, pauli_cost=0) if facts.pauli_cost else facts


def reuse_matters(facts: Facts, grad: bool) -> bool:
    """Whether ``plan`` reads ``dense_ready`` for this call (callers compute it only then)."""
    return (not grad and dense_applies(facts) and facts.engine != "dense" and facts.device == "cpu"
            and facts.backend == "torch" and facts.n_qubits >= STATEVECTOR_MIN_QUBITS and not facts.hardware)


def plan(facts: Facts, rows: int, grad: bool, entry: str = "torch", dense_ready: bool = False,
         kernel_rows: int = 0, pinned: frozenset[str] = frozenset()) -> Plan:
    """The executor of one call. ``entry``: ``torch`` (the module's forward) or ``numpy`` (a twin);
    ``kernel_rows``: the most rows the compiled kernels take at this qubit count (0: none here);
    ``pinned``: executor variants a numpy twin pickled by an earlier version never ran (``kernels``,
    ``blocks``, ``columns``), so a resumed run computes what the snapshot's would have."""
    if facts.backend == "pennylane":
        return Plan("pennylane", "autograd")
    if facts.engine in ADDED:
        return Plan(facts.engine, "none")
    if facts.noise:
        return Plan("density", "rule" if facts.hardware and grad else "autograd")
    dense = dense_applies(facts)
    if facts.hardware:  # shots or a gradient rule, exact: the torch executors under the rule
        return Plan("dense" if dense else "torch_autograd", "rule" if grad else "none")
    if entry == "torch" and facts.pauli_cost and (facts.engine == "pauli" or pauli_pays(facts, rows, grad)):
        return Plan("pauli", "autograd")
    if entry == "numpy":
        if rows <= kernel_rows and not facts.reupload and "kernels" not in pinned:
            return Plan("statevector", "adjoint" if grad else "none", "kernels")
        columns = (kernel_rows > 0 and not facts.reupload and COLUMNS_QUBITS[0] <= facts.n_qubits <= COLUMNS_QUBITS[1]
                   and "columns" not in pinned and "kernels" not in pinned)
        if not grad:
            if columns:  # (from 5 qubits, where the blocks would run)
                return Plan("statevector", "none", "columns")
            blocks = facts.n_qubits >= STATEVECTOR_MIN_QUBITS or not dense
            return (Plan("statevector", "none", "blocks") if blocks and "blocks" not in pinned
                    else Plan("dense", "none", "cached"))
        torch_plan = plan(without_pauli(facts), ANALYTIC_MAX_BATCH, True)
        if torch_plan.executor == "statevector" and columns:
            return Plan("statevector", "adjoint", "columns")
        if torch_plan.executor == "statevector" and "blocks" not in pinned:
            return Plan("statevector", "adjoint", "blocks")
        return Plan("dense", "analytic", "cached")
    if dense:
        few_qubits = (facts.engine == "dense" or facts.n_qubits < STATEVECTOR_MIN_QUBITS
                      or facts.device != "cpu")
        if not grad:
            reuse = dense_ready and (facts.n_qubits <= REUSE_MAX_QUBITS or rows <= REUSE_MAX_BATCH)
            if few_qubits or facts.backend != "torch" or reuse:
                return Plan("dense", "none", "cached")
            return Plan("statevector", "none", "blocks")
        if few_qubits:
            if analytic_fits(facts) and rows <= ANALYTIC_MAX_BATCH:
                return Plan("dense", "analytic", "cached")
            return Plan("dense", "autograd")
        if facts.n_qubits <= ANALYTIC_MAX_QUBITS and rows >= DENSE_MIN_BATCH:
            return Plan("dense", "autograd")
        return Plan("statevector", "adjoint", "blocks")
    if facts.device != "cpu":
        return Plan("torch_autograd", "autograd")
    return Plan("statevector", "adjoint" if grad else "none", "blocks")


class Planner:
    """``plan`` kept per call shape for one head: a head calls it on every forward, and the plan of a
    shape never changes while its facts do not (a new ``Facts`` starts a new table)."""

    __slots__ = ("facts", "entry", "kernel_rows", "pinned", "_reuse", "_table")

    def __init__(self, facts: Facts, entry: str = "torch", kernel_rows: int = 0,
                 pinned: frozenset[str] = frozenset()) -> None:
        self.facts, self.entry, self.kernel_rows, self.pinned = facts, entry, kernel_rows, pinned
        self._reuse = (reuse_matters(facts, False) and entry == "torch", reuse_matters(facts, True) and entry == "torch")
        self._table: dict[tuple[int, bool, bool], Plan] = {}

    def __call__(self, rows: int, grad: bool, dense_ready: Callable[[], bool] | None = None) -> Plan:
        """The plan of a call; ``dense_ready`` is asked only where the plan depends on it."""
        ready = self._reuse[grad] and dense_ready is not None and dense_ready()
        key = (rows, grad, ready)
        found = self._table.get(key)
        if found is None:
            found = self._table[key] = plan(self.facts, rows, grad, self.entry, ready, self.kernel_rows, self.pinned)
        return found
