"""Fault injection on the local backend: kill schedules, duplicated messages, and their config checks."""
from __future__ import annotations

import pytest

from marl_q.ledger import ledger_audit
from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment


def test_a_killed_worker_is_restarted_and_duplicates_apply_once(small_raw, tmp_path):
    small_raw["backend"].update({"name": "local", "kill": [{"worker": 1, "at_s": 0.02}], "max_restarts": 2,
                                 "faults": {"duplicate": 0.3}})
    small_raw["server"]["aggregation"] = "sync"  # the barrier needs w1: the run cannot end without its restart
    # a budget the run cannot finish within 0.02 s of every worker's hello, so the kill always lands
    small_raw["run"]["total_env_steps"] = 8000
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed" and summary["env_steps"] >= 8000
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
    small_raw["run"]["total_env_steps"] = 8000
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
