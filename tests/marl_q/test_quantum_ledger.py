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


def coma_raw(actor: dict, steps: int = 100, workers: int = 2) -> dict:
    """COMA on team_cue (3 agents, episodes of 5 steps) with a circuit actor; the critic is on the server."""
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False, "checkpoint_every": 0},
            "backend": {"name": "sim", "workers": workers},
            "server": {"aggregation": "buffered", "buffer_k": 2},
            "scenario": {"name": "team_cue", "n_agents": 3, "n_cues": 3, "episode_length": 5},
            "algorithm": {"name": "coma", "eval_episodes": 1, "team_reward": "mean"},
            # input: cue one-hot (3) + agent id one-hot (3) = 6 features, one qubit each
            "actor": {"head": "vqc", "n_qubits": 6, "layers": 1, **actor},
            "critic": {"head": "mlp", "hidden": [16]}}


@pytest.mark.parametrize("actor", [{"output": "linear"},  # acts through the numpy twin (NumpyVQCActing)
                                   {"output": "scaled"},  # no numpy twin: acts through torch
                                   {"output": "linear", "shots": 8}])  # samples: torch
def test_coma_workers_report_their_actor_forwards(tmp_path, actor):
    """A COMA worker plays whole episodes: T transitions take T + 1 forwards (the last row only feeds
    the critic's bootstrap), each of all 3 agents' rows in one job. So after e episodes and s env steps
    the ledger holds 3 (s + e) actor circuits in s + e jobs; nothing is differentiated on a worker."""
    from marl_q.config import build_config

    out = tmp_path / "coma"
    summary = run_experiment(build_config(coma_raw(actor)), out)
    with open(out / "quantum.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out / "metrics.csv", newline="") as f:
        metrics = list(csv.DictReader(f))
    assert len(rows) == len(metrics) == summary["episodes"] > 0
    shots = actor.get("shots", 0)
    for r, m in zip(rows, metrics):
        forwards = int(m["env_steps"]) + int(m["episode"])
        assert int(r["actor_act_circuits"]) == 3 * forwards and int(r["actor_act_jobs"]) == forwards
        assert int(r["actor_act_shots"]) == 3 * forwards * shots
        assert all(int(r[f"{role}_grad_{c}"]) == 0 for role in ("actor", "critic") for c in ("circuits", "jobs"))
        assert int(r["critic_act_circuits"]) == 0  # the critic is on the server
    assert summary["quantum_actor_act_circuits"] == 3 * (summary["env_steps"] + summary["episodes"])
    assert set(summary["quantum_per_worker"]) == {"w0", "w1"}
    assert summary["quantum_exact"] is (shots == 0)


def test_routing_workers_report_what_their_heads_ran(tmp_path, monkeypatch):
    """Routing PPO workers act (1 row per decision) and learn locally (forwards over the rollout,
    epochs x minibatches of forwards and backwards). A brute-force count, from hooks of the test's own
    on every worker head, of the rows and calls of each forward and of the rows with a gradient in each
    backward (x 2 shifts x (12 weights + 4 pre-layer-fed angles)), equals the ledger's totals."""
    from agents.routing import RoutingPPO

    seen = {role: dict.fromkeys(("act_circuits", "act_jobs", "grad_circuits", "grad_jobs"), 0)
            for role in ("actor", "critic")}

    def watch(role: str):
        def hook(module, inputs, output):
            seen[role]["act_circuits"] += inputs[0].shape[0]
            seen[role]["act_jobs"] += 1
            if output.requires_grad:
                def on_grad(grad):
                    rows = int((grad != 0).any(dim=-1).sum())
                    seen[role]["grad_circuits"] += rows * 2 * (4 * 3 + 4)
                    seen[role]["grad_jobs"] += rows > 0
                output.register_hook(on_grad)
        return hook

    make = RoutingPPO.make_worker

    def make_watched(self, index):
        worker = make(self, index)
        for role in ("actor", "critic"):
            vqc, = [m for m in getattr(worker, role).modules() if isinstance(m, VQC)]
            vqc.register_forward_hook(watch(role))
        return worker

    monkeypatch.setattr(RoutingPPO, "make_worker", make_watched)
    head = "{head: vqc, n_qubits: 4, layers: 1, preprocess: linear, output: linear}"
    cfg = load_config(str(ROOT / "scenarios" / "routing_amarl.yaml"),
                      # steps one at a time (every step computed is recorded: none left in flight at the end)
                      QUICK + ["backend.schedule=round_robin", "algorithm.max_clock_skew_s=null",
                               "run.total_env_steps=240", "algorithm.n_steps=32", "algorithm.epochs=2",
                               "algorithm.eval_days=0.005", "algorithm.episode_requests=20",
                               "algorithm.eval_baselines=false", f"actor={head}", f"critic={head}"])
    summary = run_experiment(cfg, tmp_path / "routing")
    for role in ("actor", "critic"):
        assert seen[role]["grad_jobs"] > 0
        assert {k: summary[f"quantum_{role}_{k}"] for k in seen[role]} == seen[role]
    assert summary["quantum_actor_act_circuits"] > summary["env_steps"]  # acting + the updates' forwards
    assert (tmp_path / "routing" / "quantum.csv").is_file()
