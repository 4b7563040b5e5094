"""Fault injection on the local backend: kill schedules, duplicated messages, and their config checks."""
from __future__ import annotations

import uuid

import pytest

from marl_q.ledger import ledger_audit
from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment


def test_a_killed_worker_is_restarted_and_duplicates_apply_once(small_raw, tmp_path):
    small_raw["backend"].update({"name": "local", "kill": [{"worker": 1, "at_s": 0.02}], "max_restarts": 2,
                                 "faults": {"duplicate": 0.3}})
    small_raw["server"]["aggregation"] = "sync"  # the barrier needs w1: the run cannot end without its restart
    # a budget the run cannot finish within 0.02 s of every worker's hello, so the kill always lands (3000
    # steps are 75 sync rounds of two 20-step pushes: to be done in 0.02 s, a round would take under 0.27 ms)
    small_raw["run"]["total_env_steps"] = 3000
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed" and summary["env_steps"] >= 3000
    assert [f["kind"] for f in summary["faults"]] == ["worker_restarted"]
    assert "killed by backend.kill at 0.02 s (SIGKILL)" in summary["faults"][0]["detail"]
    audit = ledger_audit(tmp_path / "r")
    assert audit.faults["kill"] == 1 and audit.faults["duplicate"] == summary["faults_injected"]["duplicate"] > 0
    # what the server sent the killed worker before its successor's hello is dropped (and recorded)
    assert set(audit.faults) <= {"kill", "duplicate", "undeliverable"}
    # the killed worker came back: a second hello from w1, and accepted pushes after it
    assert audit.lives["w1"] == 2 and audit.accepted_after_restart["w1"] > 0
    # at most once: applied updates = distinct accepted (worker, incarnation, seq); duplicates refused
    assert audit.repeated_keys == []
    # sync: one update per round of 2 pushes; beyond that, perhaps half a round left when the budget ran
    # out, and per kill at most one push of the dead worker that its successor's push replaced in the round.
    # (A worker answered twice, by a duplicated hello or a reply meant for its dead predecessor, would
    # push twice in a round and break this: the server answers a hello once per incarnation, and the
    # backend drops replies to a restarted worker until its hello.)
    assert 0 <= audit.distinct_accepted - 2 * summary["updates"] <= 1 + audit.faults["kill"]
    assert audit.refused_duplicates > 0
    for worker, row in audit.workers.items():  # no push lost or invented: what arrived = sent + duplicated
        assert row["received"] == row["sent"] + row["duplicated"], worker
        assert row["received"] == row["accepted"] + row["rejected"] + row["dropped_stale"], worker


def test_under_hogwild_every_distinct_accepted_push_is_exactly_one_update(small_raw, tmp_path):
    """The accounting, literally: applied updates = distinct accepted (worker, incarnation, seq),
    with a worker killed and duplicates injected (hogwild applies every accepted push, once)."""
    small_raw["backend"].update({"name": "local", "kill": [{"worker": 0, "at_s": 0.02}], "max_restarts": 2,
                                 "faults": {"duplicate": 0.3}})
    small_raw["run"]["total_env_steps"] = 3000  # 150 pushes: not done within 0.02 s, so the kill lands
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed"
    assert [f["kind"] for f in summary["faults"]] == ["worker_restarted"]
    audit = ledger_audit(tmp_path / "r")
    assert audit.faults["kill"] == 1 and audit.refused_duplicates > 0 and audit.repeated_keys == []
    assert audit.distinct_accepted == summary["updates"]
    # the workers started together: no push before both first hellos were in
    import csv

    with open(tmp_path / "r" / "comm.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if not r["kind"].startswith("fault:")]
    first_hellos = [next(i for i, r in enumerate(rows) if r["kind"] == "hello" and r["src"] == w) for w in ("w0", "w1")]
    first_push = next(i for i, r in enumerate(rows) if r["kind"] == "grad")
    assert max(first_hellos) < first_push


@pytest.mark.parametrize("backend, kill, match", [
    ("sim", [{"worker": 0, "at_s": 1.0}], "backend.faults.crash"),
    ("local", [{"worker": 2, "at_s": 1.0}], r"backend.kill\[0\].worker: index 2 out of range"),
    ("local", [{"worker": 0, "at_s": -1.0}], r"backend.kill\[0\].at_s: must be >= 0"),
    ("local", [{"worker": 0}], "at_s"),
])
def test_kill_schedule_is_validated(small_raw, backend, kill, match):
    small_raw["backend"].update({"name": backend, "kill": kill})
    with pytest.raises(ConfigError, match=match):
        build_config(small_raw)


def test_only_duplicates_are_injected_on_real_backends(small_raw):
    small_raw["backend"].update({"name": "local", "faults": {"duplicate": 0.1, "spike_p": 0.1}})
    with pytest.raises(ConfigError, match="spike_p need backend.name: sim"):
        build_config(small_raw)
    small_raw["backend"]["faults"] = {"duplicate": 0.1}
    assert build_config(small_raw).backend.faults.duplicate == 0.1


# ----------------------------------------------------------------------------- overload
def test_far_more_workers_than_cores_is_refused_before_anything_is_written(small_raw, tmp_path, monkeypatch):
    from marl_q.backends import local

    monkeypatch.setattr(local, "cpu_cores", lambda: 2)
    small_raw["backend"].update({"name": "local", "workers": 64})
    with pytest.raises(ConfigError, match=r"backend.workers=64 on 2 CPU cores.*backend.oversubscribe=true"):
        run_experiment(build_config(small_raw), tmp_path / "r")
    assert not (tmp_path / "r").exists()  # the same --out works once the command is fixed
    small_raw["backend"]["workers"] = 8  # 4 per core is allowed
    local.check_overload(build_config(small_raw))


def test_oversubscribe_runs_with_a_warning(small_raw, monkeypatch, capsys):
    from marl_q.backends import local

    monkeypatch.setattr(local, "cpu_cores", lambda: 2)
    small_raw["backend"].update({"name": "local", "workers": 64, "oversubscribe": True})
    local.check_overload(build_config(small_raw))
    err = capsys.readouterr().err
    assert "warning: backend.workers=64 on 2 CPU cores" in err and len(err.strip().splitlines()) == 1


def test_workers_that_never_say_hello_fail_fast_and_the_run_stops_when_all_keep_failing(small_raw, tmp_path,
                                                                                         capsys, monkeypatch):
    """A hello timeout far shorter than start-up: every worker fails, is restarted (one console line
    each, as it happens), fails again, and the run stops with worker_failed and what to do, long
    before reply_timeout_s x max_restarts. The env (the user's own, by import path) takes 2 s to build, so
    no worker can say hello before the first liveness check: a worker forked from the warm fork server
    otherwise could, within the 0.5 s between checks, and the run then completed (1 run in 4)."""
    name = f"slow_env_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import time\n\nimport gymnasium\n\n\ndef make():\n"
                                         "    time.sleep(2.0)\n    return gymnasium.make('CartPole-v1')\n")
    monkeypatch.chdir(tmp_path)  # the own-env module is found in the current directory, as `python -m` does
    small_raw["scenario"] = {"name": "gymnasium", "env": f"{name}:make", "num_envs": 1}
    small_raw["backend"].update({"name": "local", "hello_timeout_s": 0.01, "reply_timeout_s": 600, "max_restarts": 5})
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "worker_failed" and summary["env_steps"] == 0
    kinds = [f["kind"] for f in summary["faults"]]
    # each worker fails twice: one restart each, one more of the first to fail, then the run stops
    assert kinds == ["worker_restarted"] * 3 + ["worker_failed"]
    assert all("never said hello within 0.01 s" in f["detail"] for f in summary["faults"])
    assert "every worker has now failed twice" in summary["faults"][-1]["detail"]
    assert "fewer backend.workers or raise backend.hello_timeout_s" in summary["faults"][-1]["detail"]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("marlq: worker_")]
    assert len(lines) == 4 and sum("worker_restarted" in ln for ln in lines) == 3


@pytest.mark.parametrize("key", ["hello_timeout_s", "reply_timeout_s"])
def test_timeouts_must_be_positive(small_raw, key):
    small_raw["backend"].update({"name": "local", key: 0})
    with pytest.raises(ConfigError, match=f"backend.{key}: must be positive"):
        build_config(small_raw)


def test_a_fault_shows_on_the_console_as_one_line():
    from marl_q.runtime import one_line

    assert one_line("raised an exception:\nTraceback (most recent call last):\n  File x\nValueError: bad") == \
        "raised an exception: ... ValueError: bad"
    assert one_line("killed by backend.kill at 1 s") == "killed by backend.kill at 1 s"
