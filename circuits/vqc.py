"""``VQC``: a variational quantum circuit as a torch module (B, in_dim) -> (B, out_dim).

The classical pieces (optional pre-layer, feature scaling, output layer) are ordinary torch; the
circuit runs on the executor the planner names for each call shape (``circuits.planner``: dense,
statevector, torch_autograd, density, pennylane, or one added in its own file). ``to_qnode`` hands
back the same function evaluated by PennyLane.
"""
from __future__ import annotations

import importlib
import math
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from circuits import pauli, statevector
from circuits.blocks import ANSATZE
from circuits.engine import COMPLEX_TO_REAL, CompiledCircuit, DenseGradient
from circuits.gradients import Hardware, count, needs_hardware, new_counts
from circuits.planner import ADDED, ANALYTIC_MAX_BATCH, STATEVECTOR_MIN_QUBITS, Facts, Plan, Planner, analytic_fits, dense_applies
from circuits.program import kept_on_circuit
from circuits.policies import born_log_probs, born_partition, observable_grouping
from circuits.reference import build_qnode, check_device, qnode_function, qnode_diff_method, readouts_from_qnode
from circuits.shots import child_seed
from circuits.spec import CircuitConfigError, VQCConfig, feature_count, make_config, readout_count, validate_config

COMPLEX_DTYPES = {"complex64": torch.complex64, "complex128": torch.complex128}
ADJOINT_MIN_QUBITS = STATEVECTOR_MIN_QUBITS  # (the bench's name for it)


def resolve_device(name: str) -> torch.device:
    """The torch device of a config's ``device`` key; a clear error when CUDA is asked for but absent."""
    if name == "cuda" and not torch.cuda.is_available():
        raise CircuitConfigError("device: 'cuda' was requested but torch sees no CUDA GPU (torch.cuda.is_available() is False); use device: cpu")
    return torch.device(name)


class VQC(nn.Module):
    """A VQC head built from a spec (the keys of ``VQCConfig``); see the module docstring."""

    def __init__(self, in_dim: int, out_dim: int, config: VQCConfig | None = None, **spec: Any) -> None:
        super().__init__()
        if config is None:
            config = make_config(**spec)
        elif spec:
            raise TypeError("pass either config or spec keys, not both")
        else:
            validate_config(config)
        cfg = config
        self.cfg = cfg
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.n_features = feature_count(cfg, in_dim)
        if cfg.engine == "dense" and cfg.reupload:
            raise CircuitConfigError("engine: 'dense' needs all data to enter before the trainable part; reupload: true needs engine statevector or auto")
        self.use_dense = dense_applies(Facts(cfg.n_qubits, engine=cfg.engine, reupload=cfg.reupload,
                                             dense_max_qubits=cfg.dense_max_qubits))
        device = resolve_device(cfg.device)
        complex_dtype = COMPLEX_DTYPES[cfg.dtype]
        real_dtype = COMPLEX_TO_REAL[complex_dtype]
        generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None

        self.pre = nn.Linear(in_dim, cfg.n_qubits, dtype=real_dtype) if cfg.preprocess == "linear" else None
        blocks = cfg.layers if cfg.reupload else 1
        self.input_scale = nn.Parameter(torch.ones(blocks, self.n_features, dtype=real_dtype)) if cfg.scaling == "trainable" else None
        self.register_buffer("bound_factor", self._bound_factors(cfg).to(real_dtype), persistent=False)
        # the same, split once here rather than on every call: which features are bounded, their factors
        self.register_buffer("bounded", ~torch.isnan(self.bound_factor), persistent=False)
        self.register_buffer("bound_scale", torch.nan_to_num(self.bound_factor), persistent=False)
        shape = (cfg.layers, cfg.n_qubits, ANSATZE[cfg.ansatz].weights_per_qubit)
        self.weights = nn.Parameter((torch.rand(shape, generator=generator, dtype=real_dtype) * 2.0 - 1.0) * cfg.init_scale)
        self.circuit = CompiledCircuit(cfg, complex_dtype)
        self.n_readouts = readout_count(cfg.observable, cfg.n_qubits)
        self._check_output(cfg)
        if cfg.output == "born":  # the readout is the bitstring -> action partition (circuits/policies.py)
            partition = torch.as_tensor(born_partition(cfg.n_qubits, out_dim), dtype=real_dtype)
            self.circuit.readout, self.circuit.readout_stacked = partition, torch.cat([partition, partition])
            self.n_readouts = out_dim
        self.output_scale = nn.Parameter(torch.ones(out_dim, dtype=real_dtype)) if cfg.output == "scaled" else None
        # softmax (Jerbi et al.): a trainable inverse temperature and observable weights
        self.beta = nn.Parameter(torch.ones((), dtype=real_dtype)) if cfg.output == "softmax" else None
        self.observable_weights = (nn.Parameter(observable_grouping(self.n_readouts, out_dim).to(real_dtype))
                                   if cfg.output == "softmax" else None)
        self.post = nn.Linear(self.n_readouts, out_dim, dtype=real_dtype) if cfg.output in ("linear", "relu_linear") else None
        if cfg.output == "sum":
            groups = torch.zeros(self.n_readouts, out_dim, dtype=real_dtype)
            groups[torch.arange(self.n_readouts), torch.arange(self.n_readouts) % out_dim] = 1.0
            self.register_buffer("sum_groups", groups, persistent=False)
        # (weights, dense, DenseGradient or None) at the weights they were built for
        self._dense_cache: tuple[torch.Tensor, torch.Tensor, DenseGradient | None] | None = None
        # the weights of the last call without a gradient that took the statevector executor (see plan)
        self._act_weights: torch.Tensor | None = None
        # (the weights, what calls without a gradient built from them: "blocks", the state vector's
        # statevector.BlockMatrices; "pauli <dtype>", the pauli executor's weights side) (statevector.built_for_weights)
        self._act_blocks: statevector.WeightsCache | None = None
        self.analytic_grad = analytic_fits(Facts(cfg.n_qubits, cfg.backend, device.type, cfg.engine, cfg.reupload,
                                                 cfg.dense_max_qubits, cfg.dense_grad == "analytic"))
        # set by mark_acting_only: a copy that is never differentiated builds the dense matrix alone on a
        # weight change, not also what the analytic gradient needs (several times the cost at n = 8)
        self.acting_only = False
        self._qnode_function: Callable[[torch.Tensor], torch.Tensor] | None = None
        if cfg.backend == "pennylane":
            check_device(cfg.pennylane_device)
        # shots, noise, hardware gradients (circuits/gradients.py); the analytic dense gradient (and the
        # numpy twins of circuits/twins.py) is then off
        self.resource_counts = new_counts()
        self.hardware = None
        self._sampling_seed = child_seed(cfg.seed if cfg.seed is not None else torch.initial_seed())
        if cfg.backend == "torch" and needs_hardware(cfg):
            self.hardware = Hardware(cfg, complex_dtype, self._sampling_seed)
            self.analytic_grad = False
        self.to(device=device)
        if cfg.engine == "pauli":
            self._check_pauli(cfg)

    def _check_pauli(self, cfg: VQCConfig) -> None:
        """``engine: pauli`` asked for by name: a clear error where it cannot run this circuit."""
        why = ("reupload: true (the data enters mid-circuit)" if cfg.reupload
               else "backend: pennylane" if cfg.backend != "torch"
               else "output: born (its readout is a partition of the 2^n bitstrings)" if cfg.output == "born"
               else "device: cuda (it runs on the CPU; on CUDA engine auto takes torch_autograd)" if cfg.device != "cpu"
               else "shots, noise or a gradient rule (it computes exact expectations)" if self.hardware is not None
               else None)
        if why is None and self.pauli_program() is None:
            why = (f"its readouts pushed back through {cfg.layers} layers of {cfg.ansatz!r} on {cfg.n_qubits} qubits fan out "
                   f"past {pauli.MAX_STRINGS} Pauli strings or {pauli.MAX_TRANSITIONS} transitions")
        if why is not None:
            raise CircuitConfigError(f"engine: 'pauli' cannot run this circuit: {why}; use engine auto")

    def _bound_factors(self, cfg: VQCConfig) -> torch.Tensor:
        """pi / bound per feature for scaling: bound (NaN marks an unbounded feature: 2 atan(x))."""
        if cfg.scaling != "bound":
            return torch.zeros(0)
        if len(cfg.bounds) != self.n_features:
            raise CircuitConfigError(
                f"bounds: scaling 'bound' needs one entry per encoded feature ({self.n_features}), got {len(cfg.bounds)}; use null for an unbounded feature"
            )
        return torch.tensor([math.pi / b if b is not None else math.nan for b in cfg.bounds])

    def _check_output(self, cfg: VQCConfig) -> None:
        if cfg.output in ("raw", "scaled") and self.out_dim > self.n_readouts:
            raise CircuitConfigError(
                f"output: {cfg.output!r} reads out_dim={self.out_dim} readouts but observable {cfg.observable!r} on "
                f"{cfg.n_qubits} qubits gives {self.n_readouts}; use output: linear, sum, or more qubits"
            )
        if cfg.output == "born" and self.out_dim > 2**cfg.n_qubits:
            raise CircuitConfigError(f"output: 'born' partitions the {2**cfg.n_qubits} bitstrings of {cfg.n_qubits} qubits "
                                     f"into out_dim={self.out_dim} actions; some would get none: use more qubits")

    def angles(self, x: torch.Tensor) -> torch.Tensor:
        """Encoding angles: (B, n) or, with trainable scaling and reupload, (B, layers, n)."""
        features = self.pre(x) if self.pre is not None else x
        scaling = self.cfg.scaling
        if scaling == "atan":
            features = 2.0 * torch.atan(features)
        elif scaling == "bound":
            features = torch.where(self.bounded, features * self.bound_scale, 2.0 * torch.atan(features))
        elif scaling == "trainable":
            features = features.unsqueeze(1) * self.input_scale
            if not self.cfg.reupload:
                features = features[:, 0]
        missing = self.cfg.n_qubits - self.n_features
        if missing:
            features = nn.functional.pad(features, (0, missing))
        return features

    def dense_matrix(self) -> torch.Tensor:
        """The circuit's dense matrix; reused across no-grad calls until the weights change (rollouts)."""
        if torch.is_grad_enabled() and self.weights.requires_grad:
            return self.circuit.dense_matrix(self.weights)
        if (self.analytic_grad and not getattr(self, "acting_only", False)
                and self.plan(ANALYTIC_MAX_BATCH, True).backward == "analytic"):
            return self.dense_with_gradient()[0]
        cache = self._cached()
        if cache is not None:
            return cache[1]
        weights = self.weights.detach().clone()
        dense = self.circuit.dense_matrix(weights)
        self._dense_cache = (weights, dense, None)
        return dense

    def dense_with_gradient(self) -> tuple[torch.Tensor, DenseGradient]:
        """The dense matrix and what its weight gradient needs, cached like ``dense_matrix``. With the
        analytic gradient, no-grad calls build both: an A2C step acts and then differentiates at the
        same weights, and one build serves both (the no-grad and grad forwards then agree exactly)."""
        cache = self._cached()
        if cache is not None and cache[2] is not None:
            return cache[1], cache[2]
        weights = self.weights.detach().clone()
        dense, analytic = self.circuit.dense_with_gradient(weights)
        self._dense_cache = (weights, dense, analytic)
        return dense, analytic

    def _cached(self) -> tuple[torch.Tensor, torch.Tensor, DenseGradient | None] | None:
        cache = self._dense_cache
        if cache is not None and cache[0].device == self.weights.device and torch.equal(cache[0], self.weights):
            return cache
        return None

    def readouts(self, x: torch.Tensor) -> torch.Tensor:
        """Circuit readouts (B, m) before the output layer."""
        angles = self.angles(x)
        count(self, "act", angles.shape[0], self.cfg.shots)
        grad = torch.is_grad_enabled() and self.weights.requires_grad
        plan = self.plan(angles.shape[0], grad)
        if self.hardware is not None:  # shots, noise or a gradient rule: ``plan`` names the executor it runs
            return self.hardware.readouts(self, angles)
        if plan.executor == "pennylane":
            if self._qnode_function is None:
                self._qnode_function = self.to_qnode(self.cfg.pennylane_device, qnode_diff_method(self.cfg), **self._qnode_seed())
                self._restore_qnode_rng()
            return readouts_from_qnode(self._qnode_function.qnode, angles, self.weights, self.born_readout()).to(angles.dtype)  # type: ignore[attr-defined]
        if plan.executor == "dense":
            if plan.backward == "analytic":
                dense, gradient = self.dense_with_gradient()
                return self.circuit.forward_dense_analytic(angles, self.weights, dense, gradient)
            return self.circuit.forward_dense(angles, self.dense_matrix())
        if plan.executor in ADDED:
            return self._run_added(plan.executor, angles)
        if plan.executor == "pauli":
            if not torch.is_grad_enabled():
                return self._act_pauli(angles)
            return pauli.forward(self.pauli_program(), angles, self.weights, self.circuit.complex_dtype)
        if plan.executor == "statevector":
            if not torch.is_grad_enabled():
                return self._act_statevector(angles)
            if not self.weights.requires_grad:
                self._act_weights = self.weights.detach().clone()
            return self.circuit.forward_statevector(angles, self.weights)
        return self.circuit.forward_gates(angles, self.weights)

    def _run_added(self, executor: str, angles: torch.Tensor) -> torch.Tensor:
        """Readouts by an executor added in its own file (``circuits.planner.ADDED``): its forward on the
        head's program. None has a backward yet: a call that needs a gradient is refused."""
        if torch.is_grad_enabled() and (self.weights.requires_grad or angles.requires_grad):
            raise CircuitConfigError(f"engine: {executor!r} has no backward (forward only); use engine auto for "
                                     f"training, or call it under torch.no_grad()")
        forward = importlib.import_module(ADDED[executor]).forward
        readouts = forward(self.circuit.program, angles.detach().cpu().numpy(), self.weights.detach().cpu().numpy())
        return torch.from_numpy(readouts).to(device=angles.device, dtype=angles.dtype)

    def _act_statevector(self, angles: torch.Tensor) -> torch.Tensor:
        """Readouts of a call without any gradient on the statevector executor: its numpy forward
        (``circuits.statevector.readouts_np``, the same arithmetic as the autograd node's forward) with
        the layers' blocks cached per weights; an actor acts many times between weight changes, and at
        one row the blocks and torch's autograd node cost as much as the sweep (12 qubits)."""
        program = self.circuit.program
        self._act_blocks, blocks = statevector.built_for_weights(
            self._act_blocks, self.weights.detach(), "blocks", lambda w: statevector.BlockMatrices(program, w, False))
        self._act_weights = self._act_blocks.weights
        return torch.from_numpy(statevector.readouts_np(program, angles.detach().numpy(), blocks))

    def _act_pauli(self, angles: torch.Tensor) -> torch.Tensor:
        """Readouts of a call without any gradient on the pauli executor: its weights side (the strings'
        coefficients and the first layer's matrices, ``pauli.weights_side``) kept per weights, as the blocks
        are for the state vector, then the data side. The same ops as a training call's forward, so an act
        and the learner's recomputation at the same weights give the same bits."""
        program = self.pauli_program()
        weights = self.weights.detach()
        self._act_blocks, (coefficients, first) = statevector.built_for_weights(
            self._act_blocks, weights, f"pauli {angles.dtype}",
            lambda _: pauli.weights_side(program, weights, self.circuit.complex_dtype, angles.dtype))
        return pauli.data_side(program, angles, coefficients, first)

    def _qnode_seed(self) -> dict[str, int]:
        """With shots on PennyLane's own simulators, their sampling seed (a child stream of the head's
        seed key or torch's initial seed): reruns are reproducible. The state of the device's generator
        travels with a snapshot (``__getstate__``), so a resumed run continues its stream."""
        if self.cfg.shots is None or self.cfg.pennylane_device not in ("default.qubit", "default.mixed"):
            return {}
        return {"seed": self._sampling_seed}

    def _qnode_rng(self) -> Any:
        """The numpy generator PennyLane's device samples shots with (None: no QNode yet, or a device
        without one)."""
        function = self.__dict__.get("_qnode_function")
        rng = getattr(getattr(getattr(function, "qnode", None), "device", None), "_rng", None)
        return rng if isinstance(rng, np.random.Generator) else None

    def _restore_qnode_rng(self) -> None:
        """After a snapshot: the rebuilt device's generator continues where the pickled one was."""
        saved = self.__dict__.pop("_qnode_rng_state", None)
        rng = self._qnode_rng()
        if saved is not None and rng is not None:
            rng.bit_generator.state = saved

    def facts(self) -> Facts:
        """What the planner knows of this head (``circuits.planner.Facts``)."""
        cfg, hardware = self.cfg, self._modules.get("hardware")
        program = self.pauli_program()
        return Facts(cfg.n_qubits, cfg.backend, self._parameters["weights"].device.type, cfg.engine, cfg.reupload,
                     cfg.dense_max_qubits, self.analytic_grad, hardware is not None,
                     getattr(hardware, "density", None) is not None, cfg.layers,
                     0 if program is None else program.cost)

    def pauli_program(self) -> pauli.PauliProgram | None:
        """The pauli executor's structure (``circuits.pauli.compile_pauli``), compiled on first use and kept on
        the circuit; None where it does not apply (re-uploading, shots, noise or a gradient rule, PennyLane's
        backend, a Born readout (a partition of the 2^n bitstrings), a circuit of up to 4 qubits under engine
        auto, or strings past its limits)."""
        cfg = self.cfg
        if (cfg.reupload or cfg.backend != "torch" or self._modules.get("hardware") is not None or cfg.output == "born"
                or cfg.engine not in ("auto", "pauli") or (cfg.engine == "auto" and cfg.n_qubits < STATEVECTOR_MIN_QUBITS)):
            return None
        return kept_on_circuit(self.circuit, "_pauli", lambda circuit: pauli.compile_circuit(circuit, cfg.observable))

    def plan(self, rows: int, grad: bool) -> Plan:
        """The executor a call on ``rows`` rows runs, with (``grad``) or without a weight gradient: the
        planner's answer (``circuits.planner.plan``, kept per call shape), given whether the dense matrix
        is built for reuse at these weights (it is cached, or this is the second call without a gradient
        at the same weights: a rollout), which it asks only where the answer depends on it."""
        planner = self.__dict__.get("_planner")
        device = self._parameters["weights"].device.type
        if planner is None or planner.facts.device != device:
            planner = self.__dict__["_planner"] = Planner(self.facts())
        return planner(rows, grad, self._dense_ready)

    def _dense_ready(self) -> bool:
        return self._cached() is not None or (self._act_weights is not None and torch.equal(self._act_weights, self.weights))

    def path(self, batch: int, grad: bool) -> str:
        """``plan`` in the bench's words: dense_analytic, dense, adjoint (the statevector executor), gates
        (torch_autograd), pennylane, density."""
        plan = self.plan(batch, grad)
        if plan.executor == "dense":
            return "dense_analytic" if plan.backward == "analytic" else "dense"
        return {"statevector": "adjoint", "torch_autograd": "gates"}.get(plan.executor, plan.executor)

    def head_output(self, readouts: torch.Tensor) -> torch.Tensor:
        """Map readouts (B, m) to outputs (B, out_dim) as the ``output`` key says."""
        kind = self.cfg.output
        if kind == "raw":
            return readouts[:, : self.out_dim]
        if kind == "scaled":
            return readouts[:, : self.out_dim] * self.output_scale
        if kind == "sum":
            return readouts @ self.sum_groups
        if kind == "softmax":
            return self.beta * (readouts @ self.observable_weights.T)
        if kind == "born":
            return born_log_probs(readouts)
        if kind == "relu_linear":
            readouts = torch.relu(readouts)
        return self.post(readouts)

    def born_readout(self) -> torch.Tensor | None:
        """The bitstring -> action partition a Born head applies to measured probabilities (else None)."""
        return self.circuit.readout if self.cfg.output == "born" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_dim) -> (B, out_dim), computed on the module's device and returned on x's."""
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"VQC expects input of shape (B, {self.in_dim}), got {tuple(x.shape)}")
        weights = self.weights
        out = self.head_output(self.readouts(x.to(device=weights.device, dtype=weights.dtype)))
        return out.to(device=x.device, dtype=x.dtype if x.is_floating_point() else out.dtype)

    def __getstate__(self) -> dict[str, Any]:
        # the QNode closure of ``backend: pennylane`` does not pickle (a sim snapshot, a deepcopy): it is
        # rebuilt on the next call
        state = dict(self.__dict__)
        rng = self._qnode_rng()
        if rng is not None:  # with shots: the device's sampling stream, so a resume continues it
            state["_qnode_rng_state"] = rng.bit_generator.state
        state["_qnode_function"] = None
        state["_act_blocks"] = None  # numpy caches, rebuilt on the next call
        state.pop("_planner", None)
        return state

    @property
    def sampler(self):
        """The head's seeded generator of shots and SPSA directions (None for an exact head)."""
        return self.hardware.sampler if self.hardware is not None else None

    def to_qnode(self, device: str = "default.qubit", diff_method: str = "best", **device_kwargs: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        """The same function with this module's parameters, the circuit run by a PennyLane QNode on ``device``."""
        qnode = build_qnode(self.cfg, device, diff_method, **device_kwargs)
        return qnode_function(self, qnode)

    def extra_repr(self) -> str:
        cfg = self.cfg
        path = self.plan(1, True).executor
        return f"in={self.in_dim}, out={self.out_dim}, n_qubits={cfg.n_qubits}, layers={cfg.layers}, {cfg.encoding}, {cfg.ansatz}, {cfg.observable}, {cfg.output}, backend={cfg.backend}/{path}"


def mark_acting_only(module: nn.Module) -> int:
    """Mark every VQC inside ``module`` as acting only (never differentiated, e.g. an actor worker's copy
    of the policy); returns how many were marked. Outputs are those of the dense matrix built directly,
    equal to the gradient path's to float rounding."""
    marked = 0
    for sub in module.modules():
        if isinstance(sub, VQC):
            sub.acting_only = True
            marked += 1
    return marked
