"""Other simulators running the bench circuit, for `marlq bench quantum --peers`.

The circuit is the default of the bench, Koelle et al.'s hybrid head on n qubits: RX(2 atan x_i) on
qubit i, then per layer a CNOT ring 0->1->..->n-1->0 and RZ RY RZ on every qubit
(``rzryrz_ring``), read out as P(0) = (<Z_i> + 1) / 2, then ReLU and a Linear layer. Each peer is
built from a marl-q ``VQC`` and takes its parameters (weights, post-layer weight and bias), so its
outputs and gradients can be compared with marl-q's before anything is timed.

A peer is a ``Peer``: ``act(x)`` returns outputs without a gradient, ``fwd_bwd(x)`` returns the
gradients of sum(outputs) in every parameter, ``grads(x, coefficients)`` those of
sum(outputs * coefficients) (for the agreement check); ``about`` says in a line what it computes and
how. Peers whose package is missing are reported as not installed; ``pip install -e '.[peers]'``
installs them (JAX on the CPU, tensorcircuit-ng).

Each JAX peer is written as its own documentation recommends for speed: one jitted function of
tensors in and tensors out, the batch by ``jax.vmap`` (tensorcircuit-ng) or parameter broadcasting
(PennyLane), the classical pieces in JAX inside the same jit, and the training call one jitted
``jax.value_and_grad``. tensorcircuit-ng reads its P(0) from |psi|^2 of the circuit's state
(``c.state()``), one contraction, where the ``LEGACY`` peer kept for comparison contracts one
``expectation_ps`` network per qubit (3-10x slower at 8 qubits); legacy peers run only when
``--sims`` names ``legacy``.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from circuits.vqc import VQC

PEERS_EXTRA = "pip install -e '.[peers]'"


@dataclass
class Peer:
    """One simulator's version of the bench circuit, with marl-q's parameters."""

    name: str
    act: Callable[[torch.Tensor], Any]
    fwd_bwd: Callable[[torch.Tensor], Any]
    outputs: Callable[[torch.Tensor], np.ndarray]
    grads: Callable[[torch.Tensor, np.ndarray], list[np.ndarray]]
    convert: Callable[[torch.Tensor], Any] = lambda x: x  # the input as the timed calls take it
    about: str = ""  # what it computes, and how (printed by the bench)


def parameters_np(module: VQC) -> list[np.ndarray]:
    """The bench head's parameters in a fixed order: weights (L, n, 3), post weight (o, n), post bias (o,)."""
    return [p.detach().cpu().numpy().copy() for p in (module.weights, module.post.weight, module.post.bias)]


def torch_peer(name: str, module: VQC, function: Callable[[torch.Tensor], torch.Tensor], about: str = "") -> Peer:
    """A peer that is a torch function of x using ``module``'s parameters (PennyLane with torch,
    torchquantum, and marl-q itself)."""
    params = [module.weights, module.post.weight, module.post.bias]

    def act(x: torch.Tensor) -> Any:
        with torch.no_grad():
            return function(x)

    def fwd_bwd(x: torch.Tensor) -> Any:
        # training differentiates at new weights every call: no circuit matrix cached by marl-q's
        # dense path may carry over from the previous call
        module._dense_cache = None
        return torch.autograd.grad(function(x).sum(), params)

    def outputs(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return function(x).double().numpy()

    def grads(x: torch.Tensor, coefficients: np.ndarray) -> list[np.ndarray]:
        out = function(x)
        got = torch.autograd.grad((out * torch.as_tensor(coefficients, dtype=out.dtype)).sum(), params)
        return [g.double().numpy() for g in got]

    return Peer(name, act, fwd_bwd, outputs, grads, about=about)


def numpy_twin(acting: VQC, training: VQC, name: str = "marl-q numpy", about: str = "") -> Peer:
    """marl-q's numpy twins of a head (``agents.numpy_heads``), outside torch's autograd: ``act`` is
    what COMA's actor workers act through (``NumpyVQCActing``, on ``acting``, which it marks acting
    only), ``fwd_bwd`` the forward and backward of the one-step A2C workers (``NumpyVQC``: the compiled
    kernels up to ``kernels.MAX_ROWS`` rows, past them the dense analytic gradient up to 4 qubits and the
    adjoint sweeps from 5), writing the gradients into ``training``'s .grad; both take float64 numpy
    rows, as the workers do."""
    from circuits.twins import NumpyVQC, NumpyVQCActing

    actor, learner = NumpyVQCActing(acting), NumpyVQC(training)
    params = [training.weights, training.post.weight, training.post.bias]
    for p in params:
        p.grad = torch.zeros_like(p)

    def fwd_bwd(x: np.ndarray) -> list[np.ndarray]:
        # new weights every call, as in training (where the cache misses on the changed weights); written
        # past nn.Module.__setattr__, whose microsecond a training step does not pay
        training.__dict__["_dense_cache"] = None
        out, cache = learner.forward(x)
        learner.backward(cache, np.ones_like(out))
        return [p.grad for p in params]

    def grads(x: torch.Tensor, coefficients: np.ndarray) -> list[np.ndarray]:
        training.__dict__["_dense_cache"] = None
        out, cache = learner.forward(x.double().numpy())
        learner.backward(cache, coefficients.astype(np.float64))
        return [p.grad.double().numpy().copy() for p in params]

    return Peer(name, lambda x: actor.forward(x)[0], fwd_bwd,
                lambda x: actor.forward(x.double().numpy())[0], grads, lambda x: x.double().numpy(),
                about=about or "marl-q's numpy twins outside autograd: act = the COMA actor workers' forward, "
                               "fwd_bwd = the one-step A2C workers' forward + backward (compiled kernels for few "
                               "rows, else the dense matrix up to 4 qubits, the compiled kernels over the batch at "
                               "5-8 qubits, the adjoint sweeps' blocks past them), float64")


def pennylane_torch(module: VQC) -> Peer:
    """PennyLane default.qubit, torch interface, backprop, parameter broadcasting over the batch."""
    return torch_peer("PL default.qubit+torch", module, module.to_qnode("default.qubit", diff_method="backprop"),
                      "PennyLane default.qubit, torch interface, backprop, parameter broadcasting over the batch")


def lightning_adjoint(module: VQC) -> Peer:
    """PennyLane lightning.qubit with the adjoint method (torch interface; it runs one tape per sample)."""
    return torch_peer("PL lightning.qubit adjoint", module, module.to_qnode("lightning.qubit", diff_method="adjoint"),
                      "PennyLane lightning.qubit (C++), torch interface, adjoint gradient, one tape per sample")


def jax_peer(name: str, module: VQC, readouts: Callable[[Any, Any], Any], about: str = "") -> Peer:
    """A peer from a JAX function readouts(angles (B, n), weights) -> P(0) (B, n): the classical
    pieces around it in JAX (atan scaling, ReLU, the Linear layer), then one ``jax.jit`` of the
    forward and one of ``jax.value_and_grad`` of sum(outputs) (the loss and every parameter's
    gradient, what a training step takes)."""
    import jax
    import jax.numpy as jnp

    def head(params: list[Any], x: Any) -> Any:
        weights, post_w, post_b = params
        p0 = readouts(2.0 * jnp.arctan(x), weights)
        return jax.nn.relu(p0) @ post_w.T + post_b

    params = [jnp.asarray(p) for p in parameters_np(module)]
    forward = jax.jit(head)
    train = jax.jit(jax.value_and_grad(lambda ps, x: head(ps, x).sum()))
    weighted = jax.jit(jax.grad(lambda ps, x, c: (head(ps, x) * c).sum()))

    def as_jax(x: torch.Tensor) -> Any:
        return jnp.asarray(x.numpy())

    def act(x: Any) -> Any:
        return forward(params, x).block_until_ready()

    def fwd_bwd(x: Any) -> Any:
        return jax.block_until_ready(train(params, x))[1]

    return Peer(name, act, fwd_bwd,
                lambda x: np.asarray(forward(params, as_jax(x)), dtype=np.float64),
                lambda x, c: [np.asarray(g, dtype=np.float64) for g in weighted(params, as_jax(x), jnp.asarray(c, dtype=jnp.float32))],
                as_jax, about)


def p0_table(n: int) -> np.ndarray:
    """(2^n, n) float32: entry (k, i) is 1 where basis state k has qubit i in |0> (qubit 0 the most
    significant bit, as PennyLane and tensorcircuit-ng order the state), so probabilities @ it are the
    P(0) of every qubit."""
    bits = (np.arange(2 ** n)[:, None] >> (n - 1 - np.arange(n))[None, :]) & 1
    return (1 - bits).astype(np.float32)


def pennylane_jax(module: VQC) -> Peer:
    """PennyLane default.qubit with the JAX interface under jax.jit: backprop (PennyLane's fastest
    method for simulators at a few qubits), parameter broadcasting over the batch, one expval(Z) per
    qubit, as PennyLane's JAX guide writes it."""
    import pennylane as qml

    from circuits.reference import build_qnode

    cfg = module.cfg
    reference = build_qnode(cfg, "default.qubit", "backprop")
    qnode = qml.QNode(reference.func, qml.device("default.qubit", wires=cfg.n_qubits), interface="jax", diff_method="backprop")

    def readouts(angles: Any, weights: Any) -> Any:
        import jax.numpy as jnp

        return jnp.stack(qnode(angles, weights), axis=-1)

    return jax_peer("PL default.qubit+jax.jit", module, readouts,
                    "PennyLane default.qubit, JAX interface, backprop, parameter broadcasting, expval(Z_i); "
                    "jax.jit of the forward and of value_and_grad, float32")


def _tc_circuit(module: VQC) -> Callable[[Any, Any], Any]:
    """tensorcircuit-ng on its JAX backend (complex64): one sample's circuit, angles (n,), weights (L, n, 3)."""
    import tensorcircuit as tc

    tc.set_backend("jax")
    tc.set_dtype("complex64")
    cfg = module.cfg
    n = cfg.n_qubits

    def circuit(angles: Any, weights: Any) -> Any:
        c = tc.Circuit(n)
        for i in range(n):
            c.rx(i, theta=angles[i])
        for layer in range(cfg.layers):
            for i in range(n):
                c.cnot(i, (i + 1) % n)
            for i in range(n):
                c.rz(i, theta=weights[layer, i, 0])
                c.ry(i, theta=weights[layer, i, 1])
                c.rz(i, theta=weights[layer, i, 2])
        return c

    return circuit


def tensorcircuit(module: VQC) -> Peer:
    """tensorcircuit-ng as its documentation recommends for speed: JAX backend, complex64, one sample's
    circuit under jax.vmap over the batch, jax.jit; P(0) of every qubit from |psi|^2 of ``c.state()``
    (one contraction of the circuit's network by the default greedy contractor, the fastest of
    greedy / plain / plain-experimental measured here) times a 0/1 table."""
    import jax
    import jax.numpy as jnp

    circuit = _tc_circuit(module)
    table = jnp.asarray(p0_table(module.cfg.n_qubits))

    def one(angles: Any, weights: Any) -> Any:
        psi = circuit(angles, weights).state()
        return (jnp.real(psi) ** 2 + jnp.imag(psi) ** 2) @ table

    return jax_peer("tensorcircuit-ng state jit+vmap", module, jax.vmap(one, in_axes=(0, None)),
                    "tensorcircuit-ng, JAX backend, complex64, jax.vmap of one sample's circuit, P(0) from "
                    "|psi|^2 of c.state(); jax.jit of the forward and of value_and_grad")


def tensorcircuit_legacy(module: VQC) -> Peer:
    """The bench's first tensorcircuit-ng peer, kept to check the rewrite against: P(0) from one
    ``expectation_ps(z=[i])`` per qubit, each its own network contraction (jit + vmap as above)."""
    import jax
    import jax.numpy as jnp

    circuit = _tc_circuit(module)
    n = module.cfg.n_qubits

    def one(angles: Any, weights: Any) -> Any:
        c = circuit(angles, weights)
        z = jnp.stack([c.expectation_ps(z=[i]).real for i in range(n)])
        return (z + 1.0) / 2.0

    return jax_peer("tensorcircuit-ng expectation_ps legacy", module, jax.vmap(one, in_axes=(0, None)),
                    "LEGACY: the first tensorcircuit-ng peer, as the new one but <Z_i> from one "
                    "expectation_ps contraction per qubit")


def torchquantum(module: VQC) -> Peer:
    """torchquantum: a batched QuantumDevice, gates from torchquantum.functional, torch autograd."""
    import torchquantum as tq
    import torchquantum.functional as tqf

    cfg = module.cfg
    n = cfg.n_qubits

    def function(x: torch.Tensor) -> torch.Tensor:
        angles = 2.0 * torch.atan(x)
        device = tq.QuantumDevice(n_wires=n, bsz=x.shape[0], device="cpu")
        for i in range(n):
            tqf.rx(device, wires=i, params=angles[:, i])
        weights = module.weights
        for layer in range(cfg.layers):
            for i in range(n):
                tqf.cnot(device, wires=[i, (i + 1) % n])
            for i in range(n):
                tqf.rz(device, wires=i, params=weights[layer, i, 0].expand(x.shape[0]))
                tqf.ry(device, wires=i, params=weights[layer, i, 1].expand(x.shape[0]))
                tqf.rz(device, wires=i, params=weights[layer, i, 2].expand(x.shape[0]))
        z = tq.measurements.expval(device, list(range(n)), [tq.PauliZ()] * n)
        return module.post(torch.relu((z + 1.0) / 2.0))

    return torch_peer("torchquantum", module, function, "torchquantum, batched QuantumDevice, torch autograd")


# name -> (the package it needs, what to install, builder)
PEERS: dict[str, tuple[str, str, Callable[[VQC], Peer]]] = {
    "PL default.qubit+torch": ("pennylane", "pennylane", pennylane_torch),
    "PL default.qubit+jax.jit": ("jax", PEERS_EXTRA, pennylane_jax),
    "PL lightning.qubit adjoint": ("pennylane_lightning", "pennylane-lightning", lightning_adjoint),
    "tensorcircuit-ng state jit+vmap": ("tensorcircuit", PEERS_EXTRA, tensorcircuit),
    "tensorcircuit-ng expectation_ps legacy": ("tensorcircuit", PEERS_EXTRA, tensorcircuit_legacy),
    "torchquantum": ("torchquantum", "pip install --no-deps torchquantum-ng (it imports qiskit, qiskit-aer, qiskit-ibm-runtime, torchpack)", torchquantum),
}


# peers kept only to check a rewrite against; the bench runs them when --sims names "legacy"
LEGACY = {name for name in PEERS if name.endswith("legacy")}


def peer_status(name: str) -> str | None:
    """None when the peer can be built, else why not (its package, and how to install it)."""
    package, install, _ = PEERS[name]
    if importlib.util.find_spec(package) is None:
        return f"not installed ({install})"
    return None


def build_peer(name: str, module: VQC) -> tuple[Peer | None, str | None]:
    """The peer, or None and why: not installed, or failing to import or build."""
    status = peer_status(name)
    if status is not None:
        return None, status
    try:
        return PEERS[name][2](module), None
    except Exception as exc:  # a broken optional install: report it in the table, keep benching the rest
        return None, f"not available ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"


def agreement(peer: Peer, reference: Peer, x: torch.Tensor, coefficients: np.ndarray) -> dict[str, float]:
    """Largest differences between a peer and marl-q: outputs (absolute) and gradients (relative to the
    largest entry of marl-q's gradient of each parameter)."""
    out = float(np.abs(peer.outputs(x) - reference.outputs(x)).max())
    grad = 0.0
    for got, want in zip(peer.grads(x, coefficients), reference.grads(x, coefficients)):
        grad = max(grad, float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)))
    return {"output_max_abs_diff": out, "grad_max_rel_diff": grad}
