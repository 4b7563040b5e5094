"""The circuit heads every worker kind holds (agents.heads.worker_heads): COMA, MAPPO and routing
workers give each sampling head (shots, SPSA) its own stream derive(run.seed, "shots", worker, k), as
the actor-critic worker does; a rerun is still byte-identical; and COMA and routing workers pickled
before they reported circuit executions resume and report from then on."""
from __future__ import annotations

import copy
import csv
import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from circuits.shots import sampling_heads
from circuits.vqc import VQC
from marl_q.config import build_config, load_config
from marl_q.experiment import run_experiment
from marl_q.messages import SERVER, Message
from marl_q.registry import ALGORITHMS
from marl_q.seeding import derive
from marl_q.state_format import upgrade

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
# a small sampling circuit for any input size (the pre-layer maps the features to the 4 qubits)
SHOTS = {"head": "vqc", "n_qubits": 4, "layers": 1, "preprocess": "linear", "output": "linear", "shots": 16}
QUICK = {"progress": False, "plots": False, "checkpoint_every": 0}


def team_cue_raw(algorithm: dict[str, Any], steps: int, heads: dict[str, dict]) -> dict:
    return {"run": {"seed": 3, "total_env_steps": steps, **QUICK},
            "backend": {"name": "sim", "workers": 2},
            "server": {"aggregation": "buffered", "buffer_k": 2},
            "scenario": {"name": "team_cue", "n_agents": 3, "n_cues": 3, "episode_length": 5},
            "algorithm": algorithm, **heads}


def coma_cfg(steps: int = 60, actor: dict | None = None):
    return build_config(team_cue_raw({"name": "coma", "eval_episodes": 1, "team_reward": "mean"}, steps,
                                     {"actor": actor or SHOTS, "critic": {"head": "mlp", "hidden": [16]}}))


def mappo_cfg(steps: int = 60):
    return build_config(team_cue_raw({"name": "mappo", "envs_per_worker": 2, "n_steps": 5, "epochs": 2}, steps,
                                     {"actor": SHOTS, "critic": dict(SHOTS, shots=8)}))


def routing_cfg(steps: int = 60, heads: dict | None = None):
    head = "{" + ", ".join(f"{k}: {v}" for k, v in SHOTS.items()) + "}"
    return load_config(str(ROOT / "scenarios" / "routing_amarl.yaml"),
                       ["run.progress=false", "run.plots=false", "run.checkpoint_every=0", "run.seed=3",
                        f"run.total_env_steps={steps}", "algorithm.n_steps=16", "algorithm.epochs=1",
                        "algorithm.minibatches=2", "algorithm.eval_days=0.002", "algorithm.episode_requests=10",
                        "algorithm.eval_baselines=false", f"actor={head}", f"critic={head}"])


KINDS = {"coma": coma_cfg, "mappo": mappo_cfg, "routing": routing_cfg}


@pytest.mark.parametrize("kind, heads", [("coma", ["actor"]), ("mappo", ["actor", "critic"]),
                                         ("routing", ["actor", "critic"])])
def test_each_worker_samples_from_its_own_streams(kind, heads):
    """Worker i's k-th sampling head is seeded with derive(run.seed, "shots", i, k). Workers 0 and 1 start
    from the same parameters, yet their heads measure different shots on the same inputs (before,
    every worker's head kept the same default stream and drew the very same shots)."""
    cfg = KINDS[kind]()
    algo = ALGORITHMS.get(cfg.algorithm.name).obj(cfg)
    workers = [algo.make_worker(i) for i in range(2)]
    outputs = []
    for i, worker in enumerate(workers):
        found = sampling_heads([getattr(worker, role) for role in heads])
        assert len(found) == len(heads)
        assert [h.sampler.seed for h in found] == [derive(3, "shots", i, k) for k in range(len(heads))]
        vqcs = [m for role in heads for m in getattr(worker, role).modules() if isinstance(m, VQC)]
        with torch.no_grad():
            outputs.append([v(torch.linspace(-1.0, 1.0, 64 * v.in_dim).reshape(64, -1)) for v in vqcs])
    assert np.array_equal(workers[0].flat.numpy(), workers[1].flat.numpy())
    for mine, theirs in zip(*outputs):
        assert not torch.equal(mine, theirs)


def test_a_sampling_coma_actor_acts_through_torch():
    """The numpy acting twin computes exact outputs: a COMA actor with shots must not act through it
    (it would draw no shots at all), an exact one still does."""
    from agents.coma import ComaWorker
    from agents.numpy_heads import NumpyVQCActing

    assert ComaWorker(coma_cfg(), 0)._np_actor is None
    exact = {k: v for k, v in SHOTS.items() if k != "shots"}
    assert isinstance(ComaWorker(coma_cfg(actor=exact), 0)._np_actor, NumpyVQCActing)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_same_config_with_shots_twice_on_sim_is_byte_identical(kind, tmp_path):
    digests = []
    for name in ("a", "b"):
        run_experiment(copy.deepcopy(KINDS[kind]()), tmp_path / name)
        digests.append({f: hashlib.sha256((tmp_path / name / f).read_bytes()).hexdigest()
                        for f in ("metrics.csv", "comm.csv", "quantum.csv")})
    assert digests[0] == digests[1]
    with open(tmp_path / "a" / "quantum.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    assert int(last["actor_act_shots"]) > 0  # the heads sampled, and were counted


def as_before_the_ledger(worker: Any) -> Any:
    """``worker`` as a snapshot pickled before workers of its kind reported circuit executions: no
    ``resources``, no counting hook on its heads (their own counters were there already)."""
    for module in (worker.actor, getattr(worker, "critic", worker.actor)):
        for vqc in module.modules():
            if isinstance(vqc, VQC):
                vqc._forward_hooks.clear()
    state = dict(worker.__dict__)
    del state["resources"]
    old = type(worker).__new__(type(worker))
    old.__dict__.update(state)
    return upgrade({"workers": [pickle.loads(pickle.dumps(old))]}, 0)["workers"][0]  # a version-0 snapshot's migration


def test_an_old_coma_worker_snapshot_resumes_and_reports_from_then_on():
    cfg = coma_cfg(actor={k: v for k, v in SHOTS.items() if k != "shots"})
    worker = ALGORITHMS.get("coma").obj(cfg).make_worker(0)
    params = Message(SERVER, "w0", "params", {"params": worker.flat.numpy()}, base_version=0)
    worker.deliver(params)
    worker.step()  # the head's own counters hold this episode's forwards
    back = as_before_the_ledger(worker)
    back.deliver(params)
    work = back.step()
    steps = len(work.messages[0].payload["rewards"])
    # one episode after the resume: steps + 1 forwards of the 3 agents' rows, one job each
    assert work.resources["counts"]["actor"] == {"act_circuits": 3 * (steps + 1), "act_shots": 0,
                                                 "act_jobs": steps + 1, "grad_circuits": 0, "grad_shots": 0,
                                                 "grad_jobs": 0}


def test_an_old_routing_worker_snapshot_resumes_and_reports_from_then_on():
    from marl_q.ledger import Ledger
    from marl_q.server import Server

    cfg = routing_cfg()
    algo = ALGORITHMS.get(cfg.algorithm.name).obj(cfg)
    server = Server(algo.make_service(), ["w0", "w1", "w2"], cfg.server, Ledger(None))
    worker = algo.make_worker(0)
    [snapshot] = server.receive(worker.start()[0], 0.0)
    worker.deliver(snapshot)
    [reply] = server.receive(worker.step().messages[-1], 0.0)
    back = as_before_the_ledger(worker)
    assert back.resources is not None
    back.deliver(reply)
    counts = back.step().resources["counts"]
    # one decision (n_steps 16: no update yet): one actor row with 16 shots; the critic ran nothing
    assert counts["actor"] == {"act_circuits": 1, "act_shots": 16, "act_jobs": 1, "grad_circuits": 0,
                               "grad_shots": 0, "grad_jobs": 0}
    assert counts["critic"] == dict.fromkeys(counts["critic"], 0)
