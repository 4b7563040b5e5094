"""Exact resume on sim, `marlq resume`, and checkpoints that go bad.

The acceptance check of exact resume: a sim run stopped at update N (run.stop_after_updates) and
continued with `marlq resume` writes the same metrics.csv, comm.csv and train.csv, byte for byte, as a run
that was never stopped, for every kind of algorithm and service, and with faults injected.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marl_q.cli import main
from marl_q.config import load_config
from marl_q.errors import CheckpointError, ConfigError, RunDirError
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.rundir import checkpoints, load_checkpoint

QUIET = ["run.progress=false", "run.plots=false"]

# (scenario file, overrides for a small run, update at which the first session stops)
CASES = {
    "a3c_jitter_straggler": ("cartpole_a3c.yaml", ["run.total_env_steps=2500", "run.checkpoint_every=9",
                                                   "backend.compute.jitter=0.3", "backend.compute.stragglers=[2]",
                                                   "backend.network.jitter=0.2"], 23),
    "a3c_faults": ("cartpole_a3c.yaml", ["run.total_env_steps=2500", "backend.faults.loss=0.1",
                                         "backend.faults.duplicate=0.2", "backend.faults.spike_p=0.1",
                                         "backend.faults.crash={1: 0.05}"], 17),
    "ppo_deltas": ("cartpole_a3c.yaml", ["algorithm={name: ppo, n_steps: 16, epochs: 2, minibatches: 2}",
                                         "run.total_env_steps=2500"], 5),
    "sync_a2c": ("cartpole_a2c_sync.yaml", ["run.total_env_steps=2500"], 7),
    "quantum_actor": ("cartpole_qa2c_quantum_actor.yaml", ["run.total_env_steps=600"], 250),
    # (sizes: the stop lands early and the resumed part still has updates: team_cue 24 updates in 300 steps,
    # speaker-listener 4 in 1000, vehicular 28 in 150)
    "coma_trajectories": ("team_cue_coma.yaml", ["run.total_env_steps=300"], 6),
    "lsvi_schedule": ("linear_mdp_regret.yaml", ["run.total_episodes=60", "backend.workers=3"], 20),
    "routing_commits": ("routing_amarl.yaml", ["run.total_env_steps=600"], 8),
    "vehicular": ("vehicular_a3c.yaml", ["run.total_env_steps=150"], 2),
    # mappo: the team rollout over env copies, per-worker value normalisation and minibatch draws
    # (on the native spread: mpe2's own envs pickle by EzPickle, i.e. rebuilt unreset, not resumable)
    "mappo_team": ("cartpole_a3c.yaml",
                   ["scenario={name: spread, n_agents: 2, max_cycles: 10}",
                    "algorithm={name: mappo, envs_per_worker: 2, n_steps: 5, epochs: 2, minibatches: 2}",
                    "actor={head: mlp, hidden: [16]}", "critic={head: mlp, hidden: [16]}",
                    "run.total_env_steps=400"], 6),
    # mpe2's own env (EzPickle: pickled by its full state, not rebuilt from its constructor)
    "mappo_mpe2": ("cartpole_a3c.yaml",
                   ["scenario={name: spread, n_agents: 2, max_cycles: 10, engine: mpe2}",
                    "algorithm={name: mappo, envs_per_worker: 2, n_steps: 5, epochs: 2, minibatches: 2}",
                    "actor={head: mlp, hidden: [16]}", "critic={head: mlp, hidden: [16]}",
                    "run.total_env_steps=400"], 6),
    # the native LBF's batch (its arrays and each copy's generator) in the snapshot
    "mappo_lbf": ("lbf_mappo.yaml", ["run.eval_every=null", "algorithm.envs_per_worker=3", "algorithm.n_steps=20",
                                     "run.total_env_steps=1500"], 12),
    "coma_speaker_listener": ("speaker_listener_coma.yaml", ["run.total_env_steps=1000"], 2),
    # ppo with a Gaussian policy (learned log-std) on a Box action space
    "ppo_gaussian": ("cartpole_a3c.yaml", ["scenario={name: gymnasium, env: Pendulum-v1, num_envs: 2}",
                                           "algorithm={name: ppo, n_steps: 16, epochs: 2, minibatches: 2}",
                                           "run.total_env_steps=1000"], 9),
}


def _scenario(name: str) -> str:
    return str(Path(__file__).resolve().parents[2] / "scenarios" / name)


@pytest.mark.parametrize("case", list(CASES))
def test_stopped_and_resumed_sim_run_equals_the_uninterrupted_one_byte_for_byte(case: str, tmp_path: Path) -> None:
    name, overrides, stop_at = CASES[case]
    full = run_experiment(load_config(_scenario(name), QUIET + overrides), tmp_path / "full")
    cfg = load_config(_scenario(name), QUIET + overrides + [f"run.stop_after_updates={stop_at}"])
    part = run_experiment(cfg, tmp_path / "part")
    assert part["status"] == "stopped" and part["updates"] == stop_at
    assert part["env_steps"] < full["env_steps"] or part["episodes"] < full["episodes"]
    stopped_rows = (tmp_path / "part" / "comm.csv").read_bytes().count(b"\n")
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed"
    # (LSVI writes no train.csv; only the team actor-critics write returns.csv)
    for fname in ("metrics.csv", "comm.csv", "train.csv", "returns.csv"):
        if fname in ("train.csv", "returns.csv") and not (tmp_path / "full" / fname).exists():
            assert not (tmp_path / "part" / fname).exists()
            continue
        assert (tmp_path / "part" / fname).read_bytes() == (tmp_path / "full" / fname).read_bytes(), fname
    assert (tmp_path / "full" / "comm.csv").read_bytes().count(b"\n") > stopped_rows  # it went on
    for key in ("env_steps", "episodes", "updates", "server_version", "messages", "bytes_up", "bytes_down",
                "rejected", "dropped_stale", "faults_injected", "staleness_hist", "final_return"):
        if key in full:
            assert resumed[key] == full[key], key
    assert resumed["resumes"] == [{"from": f"ckpt_{stop_at}.npz", "updates": stop_at,
                                   "env_steps": part["env_steps"], "exact": True}]


def _stopped_run(tmp_path: Path, small_raw: dict, stop_at: int = 20) -> Path:
    from marl_q.config import build_config

    small_raw["run"].update({"checkpoint_every": 5, "stop_after_updates": stop_at})
    run_experiment(build_config(small_raw), tmp_path / "r")
    return tmp_path / "r"


def test_a_corrupt_latest_checkpoint_is_a_clear_error_and_the_previous_good_one_is_kept(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    ckpts = checkpoints(run)
    assert [p.name for p in ckpts] == ["ckpt_15.npz", "ckpt_20.npz"]
    data = bytearray(ckpts[-1].read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\x00" * 64  # corrupt the middle of the archive
    ckpts[-1].write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"ckpt_20\.npz.*ckpt_15\.npz are kept.*--from ckpt_15\.npz"):
        resume_experiment(run)
    assert ckpts[0].is_file() and ckpts[-1].is_file()  # nothing deleted, nothing overwritten
    assert main(["resume", str(run)]) == 2
    summary = resume_experiment(run, checkpoint=Path("ckpt_15.npz"))  # the previous good one works
    assert summary["status"] == "completed" and summary["resumes"][-1]["from"] == "ckpt_15.npz"
    backup = run / "resume_backup_1"
    assert (backup / "ckpt_20.npz").is_file()  # the corrupt newer checkpoint was set aside, not lost


def test_a_truncated_snapshot_is_refused_before_it_is_unpickled(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    snap = run / "checkpoints" / "ckpt_20.sim.pkl"
    snap.write_bytes(snap.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="does not match its checkpoint"):
        resume_experiment(run)


def test_a_truncated_metrics_file_does_not_match_its_checkpoint(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    (run / "metrics.csv").write_text("t,worker\n")
    with pytest.raises(CheckpointError, match="shorter than the checkpoint's position"):
        resume_experiment(run)


def test_a_checkpoint_that_fails_to_read_back_does_not_prune_the_older_ones(small_raw, tmp_path, monkeypatch):
    import marl_q.runtime as runtime

    def unreadable(path):
        raise CheckpointError(f"{path}: simulated bad write")

    monkeypatch.setattr(runtime, "load_checkpoint", unreadable)
    small_raw["run"]["checkpoint_every"] = 5
    from marl_q.config import build_config

    run_experiment(build_config(small_raw), tmp_path / "r")
    assert len(checkpoints(tmp_path / "r")) > 2  # every one kept, since none verified


def test_resume_on_something_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert main(["resume", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["resume", str(tmp_path / "empty")]) == 2
    assert "not a marl-q run directory" in capsys.readouterr().err
    with pytest.raises(RunDirError):
        resume_experiment(tmp_path / "empty")


def test_resume_refuses_changes_that_would_make_it_another_run(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    with pytest.raises(ConfigError, match="only run.total_env_steps"):
        resume_experiment(run, ["algorithm.lr=0.5"])


def test_a_finished_run_is_extended_by_raising_its_budget_exactly(small_raw, tmp_path):
    from marl_q.config import build_config

    small_raw["run"]["total_env_steps"] = 800
    run_experiment(build_config(small_raw), tmp_path / "short")
    with pytest.raises(ConfigError, match="already reached its budget"):
        resume_experiment(tmp_path / "short")
    extended = resume_experiment(tmp_path / "short", ["run.total_env_steps=1600"])
    small_raw["run"]["total_env_steps"] = 1600
    whole = run_experiment(build_config(small_raw), tmp_path / "long")
    assert extended["env_steps"] == whole["env_steps"]
    assert (tmp_path / "short" / "metrics.csv").read_bytes() == (tmp_path / "long" / "metrics.csv").read_bytes()


def test_checkpoints_hold_the_server_core_and_file_positions(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    arrays, meta = load_checkpoint(checkpoints(run)[-1])
    assert meta["updates"] == 20 and meta["snapshot"]["file"] == "ckpt_20.sim.pkl"
    assert meta["server_state"]["version"] == meta["server_version"]
    assert meta["metrics_position"][0] <= (run / "metrics.csv").stat().st_size
    assert meta["ledger_state"]["count"] == sum(1 for _ in open(run / "comm.csv")) - 1
    assert any(k.startswith("service.") for k in arrays)
    assert all(np.all(np.isfinite(v)) for v in arrays.values() if v.dtype.kind == "f")
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"


def _stopped_sweep(small_raw, tmp_path: Path, seeds: int) -> list[str]:
    """A sweep of ``seeds`` short runs, each stopped after 10 updates; its arguments, to run it again."""
    import yaml

    small_raw["run"]["total_env_steps"] = 600
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_raw))
    args = ["sweep", str(cfg), "--seeds", str(seeds), "--out", str(tmp_path / "sw"), "--jobs", "1", "--no-plot"]
    assert main(args + ["--set", "run.stop_after_updates=10"]) == 0
    return args


def test_a_sweep_continues_a_stopped_run_instead_of_starting_it_again(small_raw, tmp_path, capsys):
    args = _stopped_sweep(small_raw, tmp_path, 1)
    run = tmp_path / "sw" / "base" / "seed0"
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    capsys.readouterr()
    assert main(args) == 0
    assert "resuming it from its latest checkpoint" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumes"][0]["updates"] == 10
    assert not (tmp_path / "sw" / "base" / "seed0.interrupted").exists()


def test_a_sweep_leaves_a_run_another_marlq_is_writing_alone(small_raw, tmp_path, capsys):
    """A second sweep into the same folder (a run still going there) stops with exit 2 naming it, before
    it moves or starts anything: moving the folder aside would leave the live run writing into the moved
    folder while a new one starts in its place."""
    from marl_q.rundir import lock_run_dir

    args = _stopped_sweep(small_raw, tmp_path, 2)
    run = tmp_path / "sw" / "base" / "seed1"
    before = sorted(p.name for p in (tmp_path / "sw" / "base").iterdir())
    capsys.readouterr()
    held = lock_run_dir(run)  # as the marlq still writing it would
    try:
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "seed1 is in use by a running marlq (pid" in err[0]
        assert sorted(p.name for p in (tmp_path / "sw" / "base").iterdir()) == before  # nothing moved or started
        assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    finally:
        held.close()
    assert main(args) == 0  # once it is free, the sweep resumes both
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_an_interrupted_run_keeps_its_rows_and_resumes_from_the_last_periodic_checkpoint(small_raw, tmp_path,
                                                                                          monkeypatch):
    from agents.actor_critic import ActorCriticWorker
    from marl_q.config import build_config

    real_step = ActorCriticWorker.step
    calls = {"n": 0}

    def step_then_ctrl_c(self):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
        return real_step(self)

    monkeypatch.setattr(ActorCriticWorker, "step", step_then_ctrl_c)
    small_raw["run"]["checkpoint_every"] = 10
    with pytest.raises(KeyboardInterrupt):
        run_experiment(build_config(small_raw), tmp_path / "r")
    run = tmp_path / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["episodes"] > 0
    assert (run / "metrics.csv").read_bytes().count(b"\n") == summary["episodes"] + 1  # rows flushed
    monkeypatch.setattr(ActorCriticWorker, "step", real_step)
    resumed = resume_experiment(run)
    whole = run_experiment(build_config(small_raw), tmp_path / "whole")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"]
    assert resumed["env_steps"] == whole["env_steps"] and resumed["updates"] == whole["updates"]
    assert (run / "metrics.csv").read_bytes() == (tmp_path / "whole" / "metrics.csv").read_bytes()
    assert (run / "resume_backup_1" / "metrics.csv").read_bytes().count(b"\n") == summary["episodes"] + 1


def test_a_local_run_resumes_from_the_servers_state_with_fresh_workers(small_raw, tmp_path):
    from marl_q.config import build_config

    small_raw["backend"].update({"name": "local", "workers": 1})
    small_raw["run"].update({"total_env_steps": 600, "stop_after_updates": 8})
    part = run_experiment(build_config(small_raw), tmp_path / "r")
    assert part["status"] == "stopped" and part["updates"] >= 8
    arrays, meta = load_checkpoint(checkpoints(tmp_path / "r")[-1])
    assert meta["snapshot"] is None  # local workers are processes: not captured, restarted instead
    resumed = resume_experiment(tmp_path / "r")
    assert resumed["status"] == "completed" and resumed["env_steps"] >= 600
    assert resumed["updates"] > meta["updates"] and resumed["server_version"] > meta["server_version"]
    assert resumed["resumes"] == [{"from": f"ckpt_{meta['updates']}.npz", "updates": meta["updates"],
                                   "env_steps": meta["env_steps"], "exact": False}]
    # the continued ledger counts on from the checkpoint: totals equal the rows of the cut-and-appended file
    rows = (tmp_path / "r" / "comm.csv").read_bytes().count(b"\n") - 1
    assert resumed["messages"] + sum(resumed["faults_injected"].values()) == rows


def test_a_run_directory_in_use_is_not_resumed_a_second_time(small_raw, tmp_path):
    from marl_q.rundir import lock_run_dir

    run = _stopped_run(tmp_path, small_raw)
    held = lock_run_dir(run)  # as a marlq process still running on it would
    try:
        with pytest.raises(RunDirError, match=r"in use by a running marlq \(pid \d+\)"):
            resume_experiment(run)
        assert not (run / "resume_backup_1").exists()  # nothing was cut or moved
    finally:
        held.close()
    assert resume_experiment(run)["status"] == "completed"  # once it is free, resume goes on


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle '_Unpicklable' object")


def test_an_ezpickle_object_is_saved_with_its_state_not_rebuilt_from_its_constructor(tmp_path):
    from gymnasium.utils import EzPickle

    from marl_q.rundir import save_snapshot

    class Counter(EzPickle):
        def __init__(self, start: int) -> None:
            EzPickle.__init__(self, start)
            self.count = start

    globals()["Counter"] = Counter  # picklable by reference
    Counter.__qualname__ = "Counter"
    obj = Counter(3)
    obj.count = 41  # state the constructor would not give back
    sha = save_snapshot(tmp_path / "s.pkl", {"env": obj})
    from marl_q.rundir import load_snapshot

    back = load_snapshot(tmp_path / "s.pkl", sha)["env"]
    assert type(back) is Counter and back.count == 41


def test_a_state_that_cannot_be_pickled_gives_a_checkpoint_without_snapshot_and_an_inexact_resume(
        small_raw, tmp_path, monkeypatch, capsys):
    """An env holding something only its constructor can make (a Box2D world): the run says so once,
    its checkpoints carry no snapshot, and a resume continues from the server's state (exact: false)."""
    import marl_q.runtime as runtime

    real = runtime.save_snapshot

    def refuse(path, obj):
        return real(path, {**obj, "env_handle": _Unpicklable()})

    monkeypatch.setattr(runtime, "save_snapshot", refuse)
    run = _stopped_run(tmp_path, small_raw, stop_at=10)
    err = capsys.readouterr().err
    assert err.count("hold no sim snapshot") == 1 and "_Unpicklable" in err
    assert load_checkpoint(checkpoints(run)[-1])[1]["snapshot"] is None
    resumed = resume_experiment(run)
    assert resumed["status"] == "completed" and resumed["resumes"][-1]["exact"] is False
    assert resumed["env_steps"] >= small_raw["run"]["total_env_steps"]
