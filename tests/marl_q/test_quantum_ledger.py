"""The quantum-resource ledger: counts against a hand computation for tiny runs, the two update paths
agreeing, byte-identical sim runs, the QPU-time model, resume, and a bad ``qpu:`` profile."""
from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch

from circuits.resources import HeadResources, shift_angles
from circuits.vqc import VQC
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.quantum import QPU_PROFILES, QPUProfile, qpu_seconds

ROOT = Path(__file__).resolve().parents[2]
BOTH = str(ROOT / "scenarios" / "cartpole_qa2c_quantum_both.yaml")
QUICK = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0"]


def run(tmp_path: Path, name: str, overrides: list[str], config: str = BOTH) -> tuple[dict, list[dict]]:
    out = tmp_path / name
    summary = run_experiment(load_config(config, QUICK + overrides), out)
    with open(out / "metrics.csv", newline="") as f:
        metrics = list(csv.DictReader(f))
    return summary, metrics


def worker_steps(summary: dict, metrics: list[dict]) -> int:
    """One-step A2C on one env: a worker step per env step, plus one reset-only step after every episode
    that ended before the last step (next-step autoreset)."""
    final = summary["env_steps"]
    return final + sum(1 for r in metrics if int(r["env_steps"]) < final)


@pytest.mark.parametrize("fast_path", [True, False])
def test_one_step_a2c_counts_match_a_hand_computation(tmp_path, fast_path):
    # Koelle's hybrid heads: 4 qubits, 2 layers, RZ RY RZ per qubit = 24 weights, bound scaling (no
    # trainable input). Per worker step: the actor's forward on 1 row, the critic's on 2 (s_t, s_t+1),
    # one job each; per valid step a backward through 1 row of each head: 2 x 24 circuits, one job each.
    summary, metrics = run(tmp_path, f"r{fast_path}", ["run.total_env_steps=150", f"algorithm.fast_path={str(fast_path).lower()}"])
    steps, valid = worker_steps(summary, metrics), summary["env_steps"]
    assert steps > valid  # some episodes ended, so reset-only steps are in the count
    assert summary["quantum_actor_act_circuits"] == steps and summary["quantum_actor_act_jobs"] == steps
    assert summary["quantum_critic_act_circuits"] == 2 * steps and summary["quantum_critic_act_jobs"] == steps
    for role in ("actor", "critic"):
        assert summary[f"quantum_{role}_grad_circuits"] == 2 * 24 * valid
        assert summary[f"quantum_{role}_grad_jobs"] == valid
        assert summary[f"quantum_{role}_act_shots"] == summary[f"quantum_{role}_grad_shots"] == 0
    assert summary["quantum_exact"] is True
    assert summary["quantum_circuits"] == 3 * steps + 2 * 48 * valid
    assert summary["quantum_circuits_per_env_step"] == pytest.approx(summary["quantum_circuits"] / valid)
    assert summary["quantum_per_worker"]["w0"]["actor_grad_circuits"] == 48 * valid
    assert "qpu_hours" not in summary  # no qpu: profile, no estimate


def test_quantum_csv_has_a_row_per_metrics_row_with_cumulative_counts(tmp_path):
    summary, metrics = run(tmp_path, "r", ["run.total_env_steps=150", "qpu.profile=superconducting"])
    with open(tmp_path / "r" / "quantum.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["t"], r["worker"], r["env_steps"], r["episode"]) for r in rows] == \
        [(m["t"], m["worker"], m["env_steps"], m["episode"]) for m in metrics]
    p = QPU_PROFILES["superconducting"]
    for r, m in zip(rows, metrics):
        # at the end of an episode at env step s, the worker has taken s + (episodes before it) steps
        steps = int(m["env_steps"]) + int(m["episode"]) - 1
        assert int(r["actor_act_circuits"]) == steps and int(r["critic_act_circuits"]) == 2 * steps
        assert int(r["actor_grad_circuits"]) == 48 * int(m["env_steps"])
        circuits = int(r["circuits"])
        assert circuits == 3 * steps + 96 * int(m["env_steps"])
        jobs = 2 * steps + 2 * int(m["env_steps"])
        assert float(r["qpu_s"]) == pytest.approx(circuits * (1024 * p.shot_s + p.circuit_s) + jobs * p.job_s)
    assert summary["qpu_hours"] * 3600 == pytest.approx(
        qpu_seconds({k.removeprefix("quantum_"): v for k, v in summary.items() if k.startswith("quantum_")},
                    {"actor": True, "critic": True}, p, 1024))


def test_trainable_input_scaling_with_reuploading_counts_encoding_angles():
    # 5 re-uploading blocks of 4 encoded features, each angle x_i * lambda_(l,i) trainable: 20 angles,
    # besides 5 x 4 x 3 weights
    vqc = VQC(4, 2, n_qubits=4, layers=5, reupload=True, scaling="trainable", ansatz="rzryrz_ring", output="scaled")
    assert shift_angles(vqc) == 60 + 20
    fixed = VQC(4, 2, n_qubits=4, layers=5, reupload=True, scaling="atan", ansatz="rzryrz_ring")
    assert shift_angles(fixed) == 60
    res = HeadResources.of({"actor": vqc})
    out = vqc(torch.zeros(3, 4))
    grad = torch.zeros_like(out)
    grad[[0, 2]] = 1.0  # two rows with a gradient, one without: only two need shifted circuits
    out.backward(grad)
    with torch.no_grad():
        vqc(torch.zeros(5, 4))
    counts = res.take()["counts"]["actor"]
    assert counts == {"act_circuits": 8, "act_shots": 0, "act_jobs": 2, "grad_circuits": 2 * 2 * 80,
                      "grad_shots": 0, "grad_jobs": 1}
    assert res.take()["counts"]["actor"] == dict.fromkeys(counts, 0)  # take() reports deltas


@pytest.mark.parametrize("grad, per_row", [("parameter_shift", 2 * 4 * 3), ("spsa", 2)])
def test_hardware_gradients_count_the_circuits_the_head_really_ran(grad, per_row):
    """grad: parameter_shift runs 2 circuits per weight (4 qubits x 3 angles, 1 layer) per row; SPSA 2 per
    row: the ledger reads those from the head, and its forwards and jobs from its own counter."""
    vqc = VQC(4, 2, n_qubits=4, layers=1, grad=grad, shots=10, seed=0)
    res = HeadResources.of({"critic": vqc})
    vqc(torch.zeros(3, 4)).sum().backward()
    counts = res.take()["counts"]["critic"]
    assert counts["act_circuits"] == 3 and counts["act_shots"] == 30 and counts["act_jobs"] == 1
    assert counts["grad_circuits"] == 3 * per_row == vqc.resource_counts["grad_circuits"]
    assert counts["grad_shots"] == 3 * per_row * 10


def test_qpu_seconds_by_hand():
    timing = QPUProfile(shot_s=1e-3, circuit_s=0.5, job_s=10.0, help="")
    counts = {"actor_act_circuits": 4, "actor_act_shots": 400, "actor_act_jobs": 2, "critic_grad_circuits": 6,
              "critic_grad_shots": 600, "critic_grad_jobs": 1}
    # with shots: 1000 shots x 1 ms + 10 circuits x 0.5 s + 3 jobs x 10 s
    assert qpu_seconds(counts, {"actor": False, "critic": False}, timing, 1024) == pytest.approx(1.0 + 5.0 + 30.0)
    # an exact actor is estimated at assumed_shots per circuit: 4 x 50 shots instead of 400
    assert qpu_seconds(counts, {"actor": True, "critic": False}, timing, 50) == pytest.approx(0.2 + 0.6 + 5.0 + 30.0)


def test_the_ledger_leaves_a_sim_run_byte_identical(tmp_path):
    digests = []
    for name, extra in (("a", []), ("b", ["qpu.profile=trapped_ion"])):
        run(tmp_path, name, ["run.total_env_steps=120"] + extra)
        digests.append({f: hashlib.sha256((tmp_path / name / f).read_bytes()).hexdigest()
                        for f in ("metrics.csv", "comm.csv")})
    assert digests[0] == digests[1]
    # the counts columns are deterministic too (qpu_s differs with the profile; a has none)
    a, b = ((tmp_path / n / "quantum.csv").read_text().splitlines() for n in "ab")
    assert [line.rsplit(",", 1)[0] for line in a] == [line.rsplit(",", 1)[0] for line in b]


def test_a_classical_run_writes_no_quantum_file(tmp_path):
    summary, _ = run(tmp_path, "c", ["run.total_env_steps=50"], config=str(ROOT / "scenarios" / "cartpole_qa2c.yaml"))
    assert not (tmp_path / "c" / "quantum.csv").exists()
    assert not any(k.startswith("quantum_") for k in summary)


def test_resume_continues_the_ledger_exactly(tmp_path):
    whole, _ = run(tmp_path, "whole", ["run.total_env_steps=200"])
    run(tmp_path, "part", ["run.total_env_steps=200", "run.stop_after_updates=90"])
    resumed = resume_experiment(tmp_path / "part", plots=False)
    keys = [k for k in whole if k.startswith("quantum_")]
    assert {k: resumed[k] for k in keys} == {k: whole[k] for k in keys}
    assert (tmp_path / "part" / "quantum.csv").read_bytes() == (tmp_path / "whole" / "quantum.csv").read_bytes()


@pytest.mark.parametrize("override, needle", [
    ("qpu.profile=ibm_nope", "qpu.profile: unknown QPU profile 'ibm_nope'; choices: superconducting, trapped_ion"),
    ("qpu.shot_s=-1", "qpu.shot_s: must be >= 0, got -1"),
    ("qpu.assumed_shots=0", "qpu.assumed_shots: must be at least 1, got 0"),
])
def test_a_bad_qpu_section_exits_2_with_one_line(tmp_path, capsys, override, needle):
    assert main(["run", BOTH, "--out", str(tmp_path / "r"), "--set", override, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "r").exists()


def test_marlq_plot_draws_the_quantum_figure_when_quantum_csv_exists(tmp_path):
    from analysis.plots import load_run, plot_paths

    run(tmp_path, "q", ["run.total_env_steps=120", "qpu.profile=superconducting"])
    run(tmp_path, "c", ["run.total_env_steps=50"], config=str(ROOT / "scenarios" / "cartpole_qa2c.yaml"))
    made = plot_paths([tmp_path / "q"], out=tmp_path / "plots_q")
    assert tmp_path / "plots_q" / "quantum.png" in made
    assert not any(p.name == "quantum.png" for p in plot_paths([tmp_path / "c"], out=tmp_path / "plots_c"))
    loaded = load_run(tmp_path / "q")
    assert loaded.quantum["env_steps"][-1] == loaded.metrics["env_steps"][-1]
