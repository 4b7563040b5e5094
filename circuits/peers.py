"""Other simulators running the bench circuit, for `marlq bench quantum --peers`.

The circuit is the default of the bench, Koelle et al.'s hybrid head on n qubits: RX(2 atan x_i) on
qubit i, then per layer a CNOT ring 0->1->..->n-1->0 and RZ RY RZ on every qubit
(``rzryrz_ring``), read out as P(0) = (<Z_i> + 1) / 2, then ReLU and a Linear layer. Each peer is
built from a marl-q ``VQC`` and takes its parameters (weights, post-layer weight and bias), so its
outputs and gradients can be compared with marl-q's before anything is timed.

A peer is a ``Peer``: ``act(x)`` returns outputs without a gradient, ``fwd_bwd(x)`` returns the
gradients of sum(outputs) in every parameter, ``grads(x, coefficients)`` those of
sum(outputs * coefficients) (for the agreement check). Peers whose package is missing are reported
as not installed; ``pip install -e '.[peers]'`` installs them (JAX on the CPU, tensorcircuit-ng).
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


def parameters_np(module: VQC) -> list[np.ndarray]:
    """The bench head's parameters in a fixed order: weights (L, n, 3), post weight (o, n), post bias (o,)."""
    return [p.detach().cpu().numpy().copy() for p in (module.weights, module.post.weight, module.post.bias)]


def torch_peer(name: str, module: VQC, function: Callable[[torch.Tensor], torch.Tensor]) -> Peer:
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

    return Peer(name, act, fwd_bwd, outputs, grads)


def numpy_twin(acting: VQC, training: VQC, name: str = "marl-q numpy") -> Peer:
    """marl-q's numpy twins of a head (``agents.numpy_heads``), outside torch's autograd: ``act`` is
    what COMA's actor workers act through (``NumpyVQCActing``, on ``acting``, which it marks acting
    only), ``fwd_bwd`` the forward and backward of the one-step A2C workers (``NumpyVQC``: the compiled
    kernels up to ``kernels.MAX_ROWS`` rows, past them the dense analytic gradient up to 4 qubits and the
    adjoint sweeps from 5), writing the gradients into ``training``'s .grad; both take float64 numpy
    rows, as the workers do."""
    from agents.numpy_heads import NumpyVQC, NumpyVQCActing

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
                lambda x: actor.forward(x.double().numpy())[0], grads, lambda x: x.double().numpy())


def pennylane_torch(module: VQC) -> Peer:
    """PennyLane default.qubit, torch interface, backprop, parameter broadcasting over the batch."""
    return torch_peer("PL default.qubit+torch", module, module.to_qnode("default.qubit", diff_method="backprop"))


def lightning_adjoint(module: VQC) -> Peer:
    """PennyLane lightning.qubit with the adjoint method (torch interface; it runs one tape per sample)."""
    return torch_peer("PL lightning.qubit adjoint", module, module.to_qnode("lightning.qubit", diff_method="adjoint"))


def jax_peer(name: str, module: VQC, readouts: Callable[[Any, Any], Any]) -> Peer:
    """A peer from a JAX function readouts(angles (B, n), weights) -> P(0) (B, n): the classical
    pieces around it, then jax.jit of the forward and of the gradient."""
    import jax
    import jax.numpy as jnp

    def head(params: list[Any], x: Any) -> Any:
        weights, post_w, post_b = params
        p0 = readouts(2.0 * jnp.arctan(x), weights)
        return jax.nn.relu(p0) @ post_w.T + post_b

    params = [jnp.asarray(p) for p in parameters_np(module)]
    forward = jax.jit(head)
    gradient = jax.jit(jax.grad(lambda ps, x: head(ps, x).sum()))
    weighted = jax.jit(jax.grad(lambda ps, x, c: (head(ps, x) * c).sum()))

    def as_jax(x: torch.Tensor) -> Any:
        return jnp.asarray(x.numpy())

    def act(x: Any) -> Any:
        return forward(params, x).block_until_ready()

    def fwd_bwd(x: Any) -> Any:
        return jax.block_until_ready(gradient(params, x))

    return Peer(name, act, fwd_bwd,
                lambda x: np.asarray(forward(params, as_jax(x)), dtype=np.float64),
                lambda x, c: [np.asarray(g, dtype=np.float64) for g in weighted(params, as_jax(x), jnp.asarray(c, dtype=jnp.float32))],
                as_jax)


def pennylane_jax(module: VQC) -> Peer:
    """PennyLane default.qubit with the JAX interface under jax.jit (backprop, parameter broadcasting)."""
    import pennylane as qml

    from circuits.reference import build_qnode

    cfg = module.cfg
    reference = build_qnode(cfg, "default.qubit", "backprop")
    qnode = qml.QNode(reference.func, qml.device("default.qubit", wires=cfg.n_qubits), interface="jax", diff_method="backprop")

    def readouts(angles: Any, weights: Any) -> Any:
        import jax.numpy as jnp

        return jnp.stack(qnode(angles, weights), axis=-1)

    return jax_peer("PL default.qubit+jax.jit", module, readouts)


def tensorcircuit(module: VQC) -> Peer:
    """tensorcircuit-ng on its JAX backend: one sample's circuit, jax.vmap over the batch, jax.jit."""
    import jax
    import jax.numpy as jnp
    import tensorcircuit as tc

    tc.set_backend("jax")
    tc.set_dtype("complex64")
    cfg = module.cfg
    n = cfg.n_qubits

    def one(angles: Any, weights: Any) -> Any:
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
        z = jnp.stack([c.expectation_ps(z=[i]).real for i in range(n)])
        return (z + 1.0) / 2.0

    return jax_peer("tensorcircuit-ng jax jit+vmap", module, jax.vmap(one, in_axes=(0, None)))


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

    return torch_peer("torchquantum", module, function)


# name -> (the package it needs, what to install, builder)
PEERS: dict[str, tuple[str, str, Callable[[VQC], Peer]]] = {
    "PL default.qubit+torch": ("pennylane", "pennylane", pennylane_torch),
    "PL default.qubit+jax.jit": ("jax", PEERS_EXTRA, pennylane_jax),
    "PL lightning.qubit adjoint": ("pennylane_lightning", "pennylane-lightning", lightning_adjoint),
    "tensorcircuit-ng jax jit+vmap": ("tensorcircuit", PEERS_EXTRA, tensorcircuit),
    "torchquantum": ("torchquantum", "pip install --no-deps torchquantum-ng (it imports qiskit, qiskit-aer, qiskit-ibm-runtime, torchpack)", torchquantum),
}


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
