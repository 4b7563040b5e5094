"""Gradients as hardware computes them (circuits/gradients.py), the resource counters, and the bad
input of shots, noise and grad (each a one-line error naming the key; exit 2 from `marlq run`).

Parameter shift without shots equals the analytic gradient (which test_parity and test_noise check
against PennyLane) to 1e-5; with shots it is unbiased, and SPSA is unbiased to first order: z-tests
at 5 sigma on the mean of seeded repeats.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import pytest
import torch
import yaml

from circuits import VQC, spec
from circuits.ansatze import ry_cz
from circuits.blocks import ANSATZE, Ansatz
from circuits.spec import CircuitConfigError
from marl_q.cli import main

torch.set_num_threads(1)
Z = 5.0


def twins(**keys) -> tuple[VQC, VQC]:
    """A head with the given keys and its exact twin (same parameters, grad analytic, no shots)."""
    head = VQC(keys.pop("in_dim"), keys.pop("out_dim"), **keys)
    exact_cfg = dataclasses.replace(head.cfg, shots=None, grad="analytic")
    exact = VQC(head.in_dim, head.out_dim, config=exact_cfg)
    exact.load_state_dict(head.state_dict())
    return head, exact


def gradients(module: VQC, x: torch.Tensor, coefficients: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad((module(x) * coefficients).sum(), list(module.parameters())))


@pytest.mark.parametrize("ansatz", list(ANSATZE))
@pytest.mark.parametrize("variant", ["plain", "trainable_inputs_reupload", "noise"])
def test_parameter_shift_equals_the_analytic_gradient(ansatz, variant, param_seed):
    """Every parameter (weights, and through the encoding angles the input scaling and pre-layer)."""
    torch.manual_seed(param_seed)
    keys = dict(in_dim=3, out_dim=2, n_qubits=3, layers=2, ansatz=ansatz, output="linear", grad="parameter_shift", dtype="complex128")
    if variant == "trainable_inputs_reupload":
        keys.update(scaling="trainable", reupload=True, hadamard=True)
    if variant == "noise":
        keys.update(preprocess="linear", in_dim=5, noise={"depolarizing": 0.03, "amplitude_damping": 0.05, "phase_damping": 0.02, "readout": 0.02})
    head, exact = twins(**keys)
    x = torch.randn(4, keys["in_dim"], dtype=torch.float64)
    coefficients = torch.randn(4, 2, dtype=torch.float64)
    torch.testing.assert_close(head(x), exact(x), atol=1e-12, rtol=0)
    for (name, _), got, want in zip(head.named_parameters(), gradients(head, x, coefficients), gradients(exact, x, coefficients)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")


def mean_and_error(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(samples).double()
    return stacked.mean(0), stacked.std(0) / len(samples) ** 0.5


def test_parameter_shift_with_shots_is_unbiased():
    """The mean of 400 parameter-shift gradients, each from 2 x 100-shot circuits per parameter,
    equals the analytic gradient (z-test at 5 sigma per component)."""
    torch.manual_seed(21)
    head, exact = twins(in_dim=2, out_dim=2, n_qubits=2, layers=2, ansatz="ry_cz", shots=100, grad="parameter_shift", seed=1)
    x = torch.randn(1, 2)
    coefficients = torch.tensor([[1.0, -0.5]])
    want = gradients(exact, x, coefficients)[0]
    mean, error = mean_and_error([gradients(head, x, coefficients)[0] for _ in range(400)])
    assert float(((mean - want).abs() / error.clamp_min(1e-9)).max()) < Z
    assert float(error.max()) > 0  # the shots did vary the estimates


@pytest.mark.parametrize("shots", [None, 200])
def test_spsa_is_unbiased_to_first_order(shots):
    """E over the +-1 directions (and the shots) of SPSA's estimate is the gradient up to O(c^2):
    with c = 0.02 (a relative bias of order (k c)^2 / 6 < 1e-3 for the few frequencies k along a
    direction, far below the standard error) the mean of 3000 estimates, of the weights and of the
    pre-layer through the encoding angles, matches the analytic gradient at 5 sigma."""
    torch.manual_seed(22)
    head, exact = twins(in_dim=3, out_dim=2, n_qubits=2, layers=1, ansatz="strongly_entangling", preprocess="linear",
                        grad="spsa", spsa_step=0.02, shots=shots, seed=2)
    x = torch.randn(2, 3)
    coefficients = torch.randn(2, 2)
    want = gradients(exact, x, coefficients)
    samples = [gradients(head, x, coefficients) for _ in range(3000)]
    for k, (name, _) in enumerate(head.named_parameters()):
        mean, error = mean_and_error([s[k] for s in samples])
        assert float(((mean - want[k]).abs() / error.clamp_min(1e-9)).max()) < Z, name


def test_spsa_directions_come_from_the_seeded_generator():
    a = VQC(2, 1, n_qubits=2, layers=1, grad="spsa", seed=3)
    b = VQC(2, 1, n_qubits=2, layers=1, grad="spsa", seed=3)
    x = torch.randn(3, 2)
    ga, gb = (torch.autograd.grad(m(x).sum(), m.weights)[0] for m in (a, b))
    assert torch.equal(ga, gb)
    assert not torch.equal(torch.autograd.grad(a(x).sum(), a.weights)[0], ga)  # a new direction each step


@pytest.mark.parametrize("grad, per_row", [("parameter_shift", 2 * (2 * 2 * 3)), ("spsa", 2)])
def test_resource_counters(grad, per_row):
    """act: one execution per batch row per forward; grad: parameter shift 2 per weight (here 2 layers
    x 2 qubits x 3 = 12 weights) per row, SPSA 2 per row; shots = executions x shots."""
    head = VQC(2, 2, n_qubits=2, layers=2, ansatz="strongly_entangling", shots=10, grad=grad, seed=4)
    x = torch.randn(3, 2)
    with torch.no_grad():
        head(x)
    assert head.resource_counts == {"act_circuits": 3, "act_shots": 30, "grad_circuits": 0, "grad_shots": 0}
    head(x).sum().backward()
    assert head.resource_counts == {"act_circuits": 6, "act_shots": 60,
                                    "grad_circuits": 3 * per_row, "grad_shots": 30 * per_row}


def test_exact_heads_count_executions_without_shots():
    head = VQC(2, 2, n_qubits=2, layers=1)
    head(torch.randn(5, 2)).sum().backward()
    assert head.resource_counts == {"act_circuits": 5, "act_shots": 0, "grad_circuits": 0, "grad_shots": 0}


# ----------------------------------------------------------------------------- bad input
NO_SHIFT = "no_shift_rule_test"


@pytest.fixture
def ansatz_without_shift_rule(monkeypatch):
    """A test-only ansatz whose gates claim no two-term rule (every registered one has it), made a
    valid choice of the config loader for the duration of the test."""
    block = dataclasses.replace(ry_cz.ANSATZ, name=NO_SHIFT, shift_rule=False)
    monkeypatch.setitem(ANSATZE, NO_SHIFT, block)
    monkeypatch.setitem(spec._CHOICES, "ansatz", tuple(ANSATZE))
    monkeypatch.setattr(spec, "AnsatzName", Literal[tuple(ANSATZE)])
    return block


BAD = [
    ({"shots": 0}, "shots: expected a positive integer or null, got 0"),
    ({"shots": -5}, "shots: expected a positive integer or null, got -5"),
    ({"shots": 2.5}, "shots: expected a positive integer or null, got 2.5"),
    ({"noise": {"depolarizing": 1.5}}, "noise.depolarizing: expected a probability in [0, 1], got 1.5"),
    ({"noise": {"readout": -0.1}}, "noise.readout: expected a probability in [0, 1], got -0.1"),
    ({"noise": {"amplitude_damping": 0.1}, "engine": "gates"}, "noise: gate channels need the density-matrix path"),
    ({"noise": {"phase_damping": 0.1}, "backend": "pennylane"}, "noise: backend pennylane simulates gate channels on pennylane_device 'default.mixed' only"),
    ({"grad": "parameter_shift", "ansatz": NO_SHIFT}, f"grad: ansatz '{NO_SHIFT}' has a gate without a two-term parameter-shift rule"),
    ({"grad": "spsa", "spsa_step": 0}, "spsa_step: expected a positive number, got 0"),
]


@pytest.mark.parametrize("keys, message", BAD)
def test_bad_hardware_keys_name_the_key(keys, message, ansatz_without_shift_rule):
    with pytest.raises(CircuitConfigError) as exc:
        VQC(2, 2, n_qubits=2, layers=1, **keys)
    assert str(exc.value).startswith(message)


def test_a_path_that_cannot_simulate_noise_is_refused_by_to_qnode():
    head = VQC(2, 2, n_qubits=2, layers=1, noise={"depolarizing": 0.1})
    with pytest.raises(CircuitConfigError, match="noise: PennyLane simulates gate channels on device 'default.mixed' only"):
        head.to_qnode("default.qubit")


CLI_BAD = [
    (["critic.shots=0"], "critic.shots: expected a positive integer or null, got 0"),
    (["critic.shots=1.5"], "critic.shots: expected an integer, got 1.5"),
    (["critic.noise={depolarizing: 1.5}"], "critic.noise.depolarizing: expected a probability in [0, 1], got 1.5"),
    (["critic.noise={phase_damping: -0.2}"], "critic.noise.phase_damping: expected a probability in [0, 1], got -0.2"),
    (["critic.noise={depolarizing: 0.01}", "critic.engine=dense"], "critic.noise: gate channels need the density-matrix path"),
    (["critic.noise={depolarizing: 0.01}", "critic.backend=pennylane"],
     "critic.noise: backend pennylane simulates gate channels on pennylane_device 'default.mixed' only, got 'default.qubit'"),
    (["critic.grad=parameter_shift", f"critic.ansatz={NO_SHIFT}"], f"critic.grad: ansatz '{NO_SHIFT}' has a gate without a two-term parameter-shift rule"),
]


@pytest.mark.parametrize("overrides, message", CLI_BAD)
def test_bad_hardware_keys_exit_2_from_marlq_run(overrides, message, tmp_path, capsys, ansatz_without_shift_rule):
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "scenarios" / "cartpole_qa2c_quantum_critic.yaml").read_text())
    config["critic"]["head"] = "vqc"  # the hybrid head's ansatz annotation lives in circuits.heads; vqc's in circuits.spec
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["run", str(path), "--out", str(tmp_path / "out")]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marlq: error: "), err
    assert message in err[0], err[0]
    assert not (tmp_path / "out").exists()
