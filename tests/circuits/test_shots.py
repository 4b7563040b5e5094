"""Finite shots (circuits/shots.py): the multinomial sampler, statistics against PennyLane's shot
results, the analytic limit, determinism and pickling of the head's generator.

Statistical tests are z-tests at 5 sigma (a false alarm about once in 3.5 million runs per
comparison); their generators are seeded, so each run is also reproducible.
"""
from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
import torch

from circuits import VQC
from circuits.shots import ShotSampler, sampling_heads, seed_heads

torch.set_num_threads(1)
Z = 5.0  # sigmas


def assert_z(diff: torch.Tensor, stderr: torch.Tensor, what: str) -> None:
    z = (diff.abs() / stderr).max()
    assert float(z) < Z, f"{what}: |z| = {float(z):.2f} >= {Z}"


def exact_and_sampled(module: VQC, x: torch.Tensor, repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact readouts of one input and ``repeats`` independent shot estimates of them."""
    exact = VQC(module.in_dim, module.out_dim, config=dataclasses.replace(module.cfg, shots=None))
    exact.load_state_dict(module.state_dict())
    with torch.no_grad():
        return exact(x)[0], module(x.expand(repeats, -1))


def mean_of(r: torch.Tensor) -> torch.Tensor:
    return r.mean(0)


def mean_error(r: torch.Tensor) -> torch.Tensor:
    return (r.var(0) / r.shape[0]).sqrt()


def variance_of(r: torch.Tensor) -> torch.Tensor:
    return r.var(0)


def variance_error(r: torch.Tensor) -> torch.Tensor:
    """Standard error of the sample variance, (mu_4 - sigma^4) / R, with no normality assumed."""
    centred = r - r.mean(0)
    return ((centred**4).mean(0) - centred.square().mean(0).square()).clamp_min(0).div(r.shape[0]).sqrt()


def products(r: torch.Tensor) -> torch.Tensor:
    return (r[:, 0] - r[:, 0].mean()) * (r[:, 1] - r[:, 1].mean())


def covariance_of(r: torch.Tensor) -> torch.Tensor:
    return products(r).mean()


def covariance_error(r: torch.Tensor) -> torch.Tensor:
    return (products(r).var() / r.shape[0]).sqrt()


def test_counts_are_multinomial():
    """Bitstring counts: each row sums to the shots, with the multinomial's mean s p and covariance
    s (diag p - p p^T) (sample moments over 20000 rows, z-tests)."""
    sampler = ShotSampler(1)
    p = torch.tensor([0.05, 0.1, 0.0, 0.25, 0.15, 0.2, 0.2, 0.05], dtype=torch.float64)
    rows, shots = 20000, 37
    counts = sampler.counts(p.expand(rows, -1), shots)
    assert torch.all(counts.sum(-1) == shots) and torch.all(counts >= 0) and torch.all(counts[:, 2] == 0)
    cov = shots * (torch.diag(p) - torch.outer(p, p))
    assert_z(counts.mean(0) - shots * p, (torch.diag(cov).clamp_min(1e-12) / rows).sqrt(), "mean")
    centred = counts - shots * p
    sample_cov = centred.T @ centred / rows
    fourth = (centred[:, :, None] * centred[:, None, :]).var(0)  # variance of each product
    assert_z(sample_cov - cov, (fourth / rows).sqrt().clamp_min(1e-12), "covariance")


@pytest.mark.parametrize("observable", ["z", "zz", "p0"])
def test_shot_statistics_match_pennylane(observable):
    """Mean, variance and the covariance of two readouts over 3000 repeats of a 50-shot execution:
    native vs PennyLane default.qubit with shots=50 (two-sample z-tests), and native vs the exact
    moments (Var = (<O^2> - <O>^2) / s, Cov = (<O_0 O_1> - <O_0><O_1>) / s from the exact outcome
    probabilities). PennyLane takes every Pauli-Z product from the same bitstrings, as the native
    sampler takes every readout; but it samples each ``qml.Projector`` (the p0 readouts) on its own,
    so for p0 its readouts are independent and only the means and variances are compared with it."""
    torch.manual_seed(11)
    n, shots, repeats = 3, 50, 3000
    module = VQC(n, n, n_qubits=n, layers=2, observable=observable, ansatz="strongly_entangling", shots=shots, seed=3)
    x = torch.randn(1, n)
    exact, native = exact_and_sampled(module, x, repeats)
    with torch.no_grad():
        reference = module.to_qnode("default.qubit", diff_method=None, seed=4)(x.expand(repeats, -1))
    native, reference = native.double(), reference.double()
    checks = [("mean", mean_of, mean_error), ("variance", variance_of, variance_error)]
    if observable != "p0":
        checks.append(("covariance of readouts 0 and 1", covariance_of, covariance_error))
    for name, stat, spread in checks:
        assert_z(stat(native) - stat(reference), (spread(native) ** 2 + spread(reference) ** 2).sqrt().clamp_min(1e-9),
                 f"{observable} {name}: native vs PennyLane")
    with torch.no_grad():
        probs = module.hardware.probabilities(module, module.angles(x), module.weights)[0].double()
    readout = module.circuit.readout.double()
    second = probs @ readout.square()
    variance = (second - exact.double().square()) / shots
    covariance = (probs @ (readout[:, 0] * readout[:, 1]) - exact[0] * exact[1]) / shots
    assert_z(mean_of(native) - exact, (variance / repeats).sqrt().clamp_min(1e-9), f"{observable} mean vs exact")
    assert_z(variance_of(native) - variance, variance_error(native).clamp_min(1e-9), f"{observable} variance vs exact")
    assert_z(covariance_of(native) - covariance, covariance_error(native), f"{observable} covariance vs exact")
    if observable != "p0":
        assert abs(float(covariance)) * shots > 0.05  # the readouts are correlated: the check has teeth


@pytest.mark.parametrize("ansatz", ["strongly_entangling", "basic_entangler"])
def test_the_dense_probabilities_are_the_gate_by_gate_state(ansatz):
    """The shots path's exact probabilities on the dense executor (``CompiledCircuit.dense_amplitudes``,
    the dense forward before its readout) against the torch_autograd executor's final state, |psi|^2
    (tests/circuits/test_parity.py holds that executor to PennyLane)."""
    torch.manual_seed(5)
    n = 3
    module = VQC(n, n, n_qubits=n, layers=2, ansatz=ansatz, shots=20, seed=1)
    x = torch.randn(4, n)
    assert module.plan(4, False).executor == "dense"
    with torch.no_grad():
        angles = module.angles(x)
        probs = module.hardware.probabilities(module, angles, module.weights)
        by_gates = torch.view_as_real(module.circuit.final_state(angles, module.weights)).square().sum(-1)
    assert torch.allclose(probs, by_gates, atol=1e-5) and torch.allclose(probs.sum(-1), torch.ones(4), atol=1e-5)


def test_the_analytic_limit_error_shrinks_like_one_over_sqrt_shots():
    """<Z_i> estimated with s shots: E[(est - exact)^2] s / (1 - exact^2) = 1 at every s, so the RMS
    error falls 10x from 100 to 10^4 shots (and the estimate converges to the exact value)."""
    torch.manual_seed(12)
    rms = {}
    for shots in (100, 10_000):
        module = VQC(4, 4, n_qubits=4, layers=2, ansatz="rzryrz_ring", shots=shots, seed=5)
        exact, sampled = exact_and_sampled(module, torch.randn(1, 4), 2000)
        normalised = ((sampled - exact).square() * shots / (1 - exact.square())).double()
        assert_z(normalised.mean() - 1.0, normalised.std() / normalised.numel() ** 0.5, f"normalised error at {shots} shots")
        rms[shots] = float((sampled - exact).square().mean().sqrt())
    assert abs(rms[100] / rms[10_000] - 10.0) < 0.7  # 5 sigma of the ratio of two RMS over 8000 terms each
    assert rms[10_000] < 0.01


def test_shots_compose_with_noise():
    """Shots sample the noisy distribution: the mean of 4000 estimates equals the exact noisy readout."""
    torch.manual_seed(13)
    module = VQC(2, 2, n_qubits=2, layers=2, ansatz="ry_cz", shots=64, seed=6,
                 noise={"depolarizing": 0.05, "amplitude_damping": 0.1, "readout": 0.03})
    exact, sampled = exact_and_sampled(module, torch.randn(1, 2), 4000)
    assert_z(sampled.mean(0) - exact, ((1 - exact.square()) / 64 / 4000).sqrt(), "noisy mean")


def test_straight_through_gradient_is_the_exact_one():
    """grad: analytic with shots: the value is sampled, the gradient that of the exact expectation."""
    torch.manual_seed(14)
    sampled = VQC(3, 2, n_qubits=3, layers=2, output="linear", shots=10, seed=7)
    exact = VQC(3, 2, n_qubits=3, layers=2, output="linear")
    exact.load_state_dict(sampled.state_dict())
    x = torch.randn(5, 3)
    out_sampled, out_exact = sampled(x), exact(x)
    assert not torch.allclose(out_sampled, out_exact)
    for got, want in zip(torch.autograd.grad(out_sampled.sum(), list(sampled.parameters())[:1]),
                         torch.autograd.grad(out_exact.sum(), list(exact.parameters())[:1])):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_the_generator_is_seeded_and_travels_with_the_module():
    """Same seed, same draws; another seed, others; a pickled or deep-copied head continues the
    stream exactly where the original is (the sim snapshot's exact resume)."""
    x = torch.randn(8, 3)
    make = lambda seed: VQC(3, 3, n_qubits=3, layers=1, shots=20, seed=seed)
    a, b, c = make(1), make(1), make(2)
    with torch.no_grad():
        first = a(x)
        assert torch.equal(first, b(x)) and not torch.equal(first, c(x))
        restored, copied = pickle.loads(pickle.dumps(a)), copy.deepcopy(a)
        after = a(x)
        assert torch.equal(after, restored(x)) and torch.equal(after, copied(x))
        assert not torch.equal(after, first)


def test_seed_heads_gives_each_sampling_head_its_own_stream():
    """seed_heads finds the heads that draw (not an exact head) and seeds the k-th with seed_of(k)."""
    actor = VQC(2, 2, n_qubits=2, layers=1, shots=16, seed=0)
    critic = VQC(2, 1, n_qubits=2, layers=1, shots=16, seed=0)
    exact = VQC(2, 1, n_qubits=2, layers=1)
    assert sampling_heads([actor, exact, critic]) == [actor.hardware, critic.hardware]
    assert seed_heads([actor, exact, critic], lambda k: 100 + k) == 2
    assert (actor.sampler.seed, critic.sampler.seed) == (100, 101)
    twin = VQC(2, 2, n_qubits=2, layers=1, shots=16, seed=0)
    twin.sampler.reseed(100)
    x = torch.randn(4, 2)
    with torch.no_grad():
        assert torch.equal(actor(x), twin(x))


def test_sim_reruns_and_resumes_are_exact_with_shots(tmp_path):
    """Koelle's quantum critic with shots, noise and SPSA on sim: a rerun and a stopped-and-resumed
    run end at bit-identical parameters (the shot stream is seeded from run.seed and its state is in
    the snapshot); a different shot stream (other shots) ends elsewhere, so the check has teeth. (One-step
    A2C: one update per env step, so 50 steps are 50 shot-and-SPSA updates, 30 of them after the resume.)"""
    from pathlib import Path

    from marl_q.config import load_config
    from marl_q.experiment import resume_experiment, run_experiment
    from marl_q.rundir import checkpoints, load_checkpoint

    scenario = str(Path(__file__).resolve().parents[2] / "scenarios" / "cartpole_qa2c_quantum_critic.yaml")
    base = ["run.progress=false", "run.plots=false", "run.total_env_steps=50", "critic.grad=spsa",
            "critic.noise={depolarizing: 0.01, readout: 0.02}"]

    def final(name: str, extra: list[str], resume: bool = False) -> dict[str, np.ndarray]:
        run_experiment(load_config(scenario, base + extra), tmp_path / name)
        if resume:
            resume_experiment(tmp_path / name)
        arrays, _ = load_checkpoint(checkpoints(tmp_path / name)[-1])
        return {k: v for k, v in arrays.items() if v.dtype.kind == "f"}

    full = final("full", ["critic.shots=64"])
    for other in (final("again", ["critic.shots=64"]), final("part", ["critic.shots=64", "run.stop_after_updates=20"], resume=True)):
        assert full.keys() == other.keys() and all(np.array_equal(full[k], other[k]) for k in full)
    different = final("other", ["critic.shots=65"])
    assert any(not np.array_equal(full[k], different[k]) for k in full)


@pytest.mark.parametrize("device, noise", [("default.qubit", None), ("default.mixed", {"depolarizing": 0.05})])
def test_pennylane_backend_snapshot_continues_the_device_stream(device, noise):
    """A pickled pennylane-backend head with shots (a sim snapshot) rebuilds its QNode with the device's
    generator where it was: the draws after a round trip equal those the original makes next."""
    import pickle

    keys = dict(n_qubits=2, layers=1, shots=10, seed=3, backend="pennylane", pennylane_device=device, noise=noise,
                grad="parameter_shift")
    head = VQC(2, 2, **keys)
    x = torch.randn(50, 2)
    with torch.no_grad():
        head(x)  # the stream has moved
        copy = pickle.loads(pickle.dumps(head))
        following = head(x)
        assert torch.equal(copy(x), following)
        assert not torch.equal(VQC(2, 2, **keys)(x), following)  # a fresh head restarts: different draws


@pytest.mark.parametrize("device, noise", [("default.qubit", None), ("default.mixed", {"depolarizing": 0.05})])
def test_pennylane_backend_with_shots_is_seeded(device, noise):
    """backend: pennylane samples with PennyLane (shots passed to the QNode, its device seeded from
    the head's seed): the same seed gives the same draws, and the mean of 2000 rows matches the
    native head's exact value (z-test at 5 sigma)."""
    keys = dict(n_qubits=2, layers=1, shots=20, seed=1, backend="pennylane", pennylane_device=device,
                grad="parameter_shift", noise=noise)
    a, b = VQC(2, 2, **keys), VQC(2, 2, **keys)
    native = VQC(2, 2, config=dataclasses.replace(a.cfg, backend="torch", shots=None, grad="analytic"))
    native.load_state_dict(a.state_dict())
    x = torch.randn(1, 2).expand(2000, -1)
    with torch.no_grad():
        draws = a(x)
        assert torch.equal(draws, b(x))
        exact = native(x[:1])[0]
    assert_z(draws.double().mean(0) - exact, ((1 - exact.double().square()) / 20 / 2000).sqrt(), f"{device} mean")
