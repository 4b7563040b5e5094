"""End to end through the runtime: determinism, run directory, checkpoints, the local backend."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from marl_q.cli import main
from marl_q.config import build_config
from marl_q.errors import CheckpointError, RunDirError
from marl_q.experiment import run_experiment
from marl_q.rundir import latest_checkpoint, load_checkpoint, save_checkpoint

SUMMARY_KEYS = {"env_steps", "episodes", "final_return", "steps_to_solve", "wall_s", "virtual_s", "messages",
                "bytes_up", "bytes_down", "rejected", "dropped_stale", "actor_params", "critic_params"}


def test_sim_is_byte_identical_for_one_seed(small_raw, tmp_path):
    small_raw["backend"]["compute"] = {"jitter": 0.3, "stragglers": [1], "straggler_factor": 3.0}
    small_raw["backend"]["network"] = {"jitter": 0.2}
    a = run_experiment(build_config(small_raw), tmp_path / "a")
    b = run_experiment(build_config(small_raw), tmp_path / "b")
    for name in ("metrics.csv", "comm.csv", "train.csv", "config.yaml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a["env_steps"] == b["env_steps"] and a["virtual_s"] == b["virtual_s"]
    small_raw["run"]["seed"] = 1
    run_experiment(build_config(small_raw), tmp_path / "c")
    assert (tmp_path / "a" / "metrics.csv").read_bytes() != (tmp_path / "c" / "metrics.csv").read_bytes()


def test_run_directory_contents_and_summary(small_raw, tmp_path):
    small_raw["run"]["plots"] = True
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    r = tmp_path / "r"
    for name in ("config.yaml", "metrics.csv", "comm.csv", "summary.json"):
        assert (r / name).is_file()
    assert SUMMARY_KEYS <= set(json.loads((r / "summary.json").read_text()))
    assert summary["env_steps"] >= 1200 and summary["status"] == "completed"
    # every message is a ledger row; the summary's totals agree with the file
    rows = (r / "comm.csv").read_text().strip().splitlines()[1:]
    assert len(rows) == summary["messages"]
    assert sum(int(x.split(",")[6]) for x in rows if x.split(",")[3] == "server") == summary["bytes_up"]
    assert {p.name for p in (r / "plots").iterdir()} >= {"return_vs_steps.png", "staleness.png", "traffic.png"}
    arrays, meta = load_checkpoint(latest_checkpoint(r))
    assert meta["env_steps"] == summary["env_steps"]
    assert arrays["service.params"].shape == (summary["actor_params"] + summary["critic_params"],)


def test_existing_run_dir_is_not_overwritten(small_raw, tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "keep.txt").write_text("precious")
    with pytest.raises(RunDirError, match="not empty"):
        run_experiment(build_config(small_raw), tmp_path / "r")
    assert (tmp_path / "r" / "keep.txt").read_text() == "precious"


def test_checkpoint_round_trip_and_truncation(tmp_path):
    arrays = {"params": np.arange(1000, dtype=np.float32), "step": np.array(3)}
    path = tmp_path / "ckpt_3.npz"
    save_checkpoint(path, arrays, {"updates": 3})
    got, meta = load_checkpoint(path)
    np.testing.assert_array_equal(got["params"], arrays["params"])
    assert meta == {"updates": 3}
    data = path.read_bytes()
    cut = tmp_path / "ckpt_cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(cut)
    assert cut.read_bytes() == data[: len(data) // 2]  # nothing overwritten
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError):
        load_checkpoint(junk)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "none.npz")


def test_checkpoint_never_unpickles(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, __meta__=np.frombuffer(b"{}", dtype=np.uint8), obj=np.array([object()], dtype=object))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_sync_and_stragglers_change_virtual_time_not_determinism(small_raw):
    small_raw["backend"]["compute"] = {"stragglers": [1], "straggler_factor": 10.0}
    hog = run_experiment(build_config(small_raw), None)
    small_raw["server"]["aggregation"] = "sync"
    syn = run_experiment(build_config(small_raw), None)
    # with a 10x straggler the barrier makes the same env steps take longer in virtual time
    assert syn["virtual_s"] > 2 * hog["virtual_s"]
    # sync: every accepted update is fresh; all but a last, unfinished round were applied in pairs
    assert list(syn["staleness_hist"]) == ["0"]
    assert syn["staleness_hist"]["0"] - 2 * syn["updates"] in (0, 1)


def test_local_backend_runs_and_survives_a_dead_worker(small_raw, tmp_path):
    small_raw["backend"].update({"name": "local", "crash_after_steps": {1: 3}, "max_restarts": 1})
    small_raw["server"]["aggregation"] = "sync"  # the barrier needs w1, so the run cannot finish without it
    small_raw["run"]["total_env_steps"] = 600  # w1 dies at its 3rd step (2 pushes): 600 needs its restart
    summary = run_experiment(build_config(small_raw), tmp_path / "loc")
    assert summary["status"] == "completed" and summary["env_steps"] >= 600
    assert [f["kind"] for f in summary["faults"]] == ["worker_restarted"]
    assert "exited with code 3" in summary["faults"][0]["detail"]
    assert (tmp_path / "loc" / "summary.json").is_file()


def test_local_backend_out_of_restarts_ends_with_what_was_learned(small_raw, tmp_path, capsys):
    small_raw["backend"].update({"name": "local", "crash_after_steps": {0: 2}, "max_restarts": 0})
    small_raw["server"]["aggregation"] = "sync"
    small_raw["run"]["total_env_steps"] = 100_000
    summary = run_experiment(build_config(small_raw), tmp_path / "loc")
    assert summary["status"] == "worker_failed"
    assert summary["faults"][0]["kind"] == "worker_failed"
    assert latest_checkpoint(tmp_path / "loc") is not None  # what was learned is saved
    assert "worker_failed w0" in capsys.readouterr().err


def test_cli_run_plot_list(small_raw, tmp_path, capsys):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_raw))
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--seed", "3", "--set", "run.total_env_steps=400"]) == 0
    out = capsys.readouterr().out
    assert '"status": "completed"' in out
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["run"]["seed"] == 3
    assert main(["plot", str(tmp_path / "r"), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "return_vs_steps.png").is_file()
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in ("a3c", "mlp", "cartpole", "sim", "local", "hogwild", "buffered", "sync", "poly", "inv_sqrt"):
        assert name in listing


def test_sweep_runs_grid_and_skips_completed(small_raw, tmp_path, capsys):
    import yaml

    small_raw["run"]["total_env_steps"] = 300
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_raw))
    args = ["sweep", str(cfg), "--seeds", "1", "--grid", "server.aggregation=sync,hogwild", "--out",
            str(tmp_path / "sw"), "--jobs", "2", "--no-plot"]
    assert main(args) == 0
    runs = sorted(p.parent.relative_to(tmp_path / "sw").as_posix() for p in (tmp_path / "sw").rglob("summary.json"))
    assert runs == ["server.aggregation=hogwild/seed0", "server.aggregation=sync/seed0"]
    # an interrupted run (no summary) is kept aside and run again; completed ones are skipped
    (tmp_path / "sw" / "server.aggregation=sync/seed0" / "summary.json").unlink()
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1 already complete, 1 to run" in out and "kept it as seed0.interrupted" in out
    assert (tmp_path / "sw" / "server.aggregation=sync" / "seed0.interrupted" / "metrics.csv").is_file()
    assert main(["sweep", str(cfg), "--grid", "server.aggregation=nope"]) == 2


def _comm_rows(path):
    import csv

    with open(path / "comm.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_sim_faults_are_in_the_ledger_and_duplicates_apply_once(small_raw, tmp_path):
    small_raw["backend"]["faults"] = {"loss": 0.2, "duplicate": 0.3, "spike_p": 0.1, "crash": {1: 0.02}}
    small_raw["run"]["total_env_steps"] = 2000
    summary = run_experiment(build_config(small_raw), tmp_path / "a")
    rows = _comm_rows(tmp_path / "a")
    kinds = {r["kind"] for r in rows}
    assert {"fault:loss", "fault:duplicate", "fault:delay_spike", "fault:crash"} <= kinds
    assert summary["faults_injected"]["duplicate"] > 0
    assert [f["kind"] for f in summary["faults"]] == ["worker_crashed", "worker_restarted"]
    # at most once: applied updates = distinct accepted (worker, seq) gradients within each life
    grads = [r for r in rows if r["kind"] == "grad"]
    lives: dict[str, int] = {}
    accepted = set()
    for r in rows:
        if r["kind"] == "hello" and r["accepted"] == "1":  # a duplicated hello is refused: not a new life
            lives[r["src"]] = lives.get(r["src"], 0) + 1
        elif r["kind"] == "grad" and r["accepted"] == "1":
            key = (r["src"], lives.get(r["src"], 0), r["seq"])
            assert key not in accepted
            accepted.add(key)
    assert len(accepted) == summary["updates"]
    assert any(r["reason"].startswith("duplicate") for r in grads)
    # every life was greeted once: as many params replies to hellos as accepted hellos (a duplicated
    # hello gets none), and the crashed worker's successor was one of them
    assert lives == {"w0": 1, "w1": 2}
    # faults come from the seeded timing generator: the same seed reproduces the run
    run_experiment(build_config(small_raw), tmp_path / "b")
    assert (tmp_path / "a" / "comm.csv").read_bytes() == (tmp_path / "b" / "comm.csv").read_bytes()


def test_sim_sync_rounds_take_one_push_per_worker_under_duplicates(small_raw, tmp_path):
    """Nearly every message handed to the server twice, the second copy later: a duplicated hello must not
    answer a worker that is already waiting at the barrier. If it did, that worker would push again
    from old parameters and run one round ahead for the rest of the run (staleness 1 under sync)."""
    from marl_q.ledger import ledger_audit

    small_raw["backend"]["faults"] = {"duplicate": 0.9, "dup_delay_s": 0.05}
    small_raw["server"]["aggregation"] = "sync"
    small_raw["run"]["total_env_steps"] = 1000
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    audit = ledger_audit(tmp_path / "r")
    assert audit.lives == {"w0": 1, "w1": 1} and audit.refused_duplicates > 0
    assert audit.distinct_accepted - 2 * summary["updates"] in (0, 1)  # at most the budget's last half round
    grads = [r for r in _comm_rows(tmp_path / "r") if r["kind"] == "grad" and r["accepted"] == "1"]
    assert grads and {r["staleness"] for r in grads} == {"0"}  # the barrier: all from the latest parameters


def test_faults_need_the_event_driven_sim(small_raw):
    from marl_q.errors import ConfigError

    small_raw["backend"].update({"name": "local", "faults": {"loss": 0.1}})
    with pytest.raises(ConfigError, match="need backend.name: sim"):
        build_config(small_raw)
    small_raw["backend"].update({"name": "sim", "faults": {"loss": 1.5}})
    with pytest.raises(ConfigError, match="loss: a probability"):
        build_config(small_raw)


@pytest.mark.parametrize("aggregation", ["hogwild", "sync"])
def test_a_restarted_sim_worker_hears_first_the_reply_to_its_own_hello(small_raw, tmp_path, monkeypatch, aggregation):
    """Replies in flight to a crashed worker are undeliverable; its successor is not confused by them."""
    from agents.actor_critic import ActorCriticWorker
    from marl_q.services import ParameterService

    real_hello, real_deliver, real_start = ParameterService.hello, ActorCriticWorker.deliver, ActorCriticWorker.start
    first_heard: list[bool] = []

    def tagged_hello(self, worker, version):
        msgs = real_hello(self, worker, version)
        for m in msgs:
            m.info["reply_to_hello"] = True
        return msgs

    def start(self):
        self._heard = False
        return real_start(self)

    def deliver(self, msg):
        if not self._heard:
            self._heard = True
            first_heard.append(bool(msg.info.get("reply_to_hello")))
        return real_deliver(self, msg)

    monkeypatch.setattr(ParameterService, "hello", tagged_hello)
    monkeypatch.setattr(ActorCriticWorker, "start", start)
    monkeypatch.setattr(ActorCriticWorker, "deliver", deliver)
    small_raw["server"]["aggregation"] = aggregation
    small_raw["backend"]["faults"] = {"crash": {0: 0.009, 1: 0.015}, "restart_s": 0.0005}
    small_raw["backend"]["network"] = {"latency_s": 0.002}
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed"
    assert [f["kind"] for f in summary["faults"]].count("worker_restarted") == 2
    assert len(first_heard) == 4 and all(first_heard)  # two first lives, two successors
    assert summary["faults_injected"].get("undeliverable", 0) >= 1  # the in-flight replies were dropped


def marked_cartpole(mark: str):
    """A CartPole that a worker process can build only where MARLQ_TEST_MARK is ``mark``
    (test_local_workers_see_the_environment_of_their_start)."""
    import gymnasium

    assert os.environ.get("MARLQ_TEST_MARK") == mark, (os.environ.get("MARLQ_TEST_MARK"), mark)
    return gymnasium.make("CartPole-v1")


def test_local_workers_see_the_environment_of_their_start(tmp_path, monkeypatch):
    """The local backend forks its workers from a fork server that started with the first run's
    environment; each worker must still see the main process's environment as it is at the worker's start
    (a run that sets a variable after an earlier run in the same process: a sweep, a test, a notebook)."""
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    for mark in ("first", "second"):
        monkeypatch.setenv("MARLQ_TEST_MARK", mark)
        raw = {"run": {"seed": 0, "total_env_steps": 60, "plots": False, "progress": False},
               "backend": {"name": "local", "workers": 1, "hello_timeout_s": 300, "max_restarts": 0},
               "scenario": {"name": "gymnasium", "env": "tests.marl_q.test_runtime:marked_cartpole",
                            "kwargs": {"mark": mark}, "num_envs": 1},
               "algorithm": {"name": "a2c", "n_steps": 5},
               "actor": {"head": "mlp", "hidden": [8]}, "critic": {"head": "mlp", "hidden": [8]}}
        summary = run_experiment(build_config(raw), tmp_path / mark)
        assert summary["env_steps"] >= 60 and summary["status"] == "completed", summary
