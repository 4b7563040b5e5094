"""`marlq bench soak`: its invariant checks on small hand-made ledgers (a good one and a broken one each),
the RSS slope against hand-computed fits, the kill schedule, its bad input, and one short soak on local."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from marl_q.bench.soak import kill_list, soak_config
from marl_q.bench.soak_checks import (accounted, applied_once, checkpoint_facts, first_row_at, metrics_continuous,
                                      read_metrics_columns, resumed_from_checkpoint, rss_slope)
from marl_q.cli import main
from marl_q.ledger import COLUMNS, ledger_audit
from marl_q.rundir import save_checkpoint


def _row(i, src, kind, seq=0, accepted=1, reason="", dst="server", version=0):
    return [i, f"{i * 0.1:.6f}", src, dst, kind, seq, 16, version, version, "", accepted, reason]


def _write_comm(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "comm.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return path


def _good_rows():
    """w0: a life with pushes 1..4 (accepted, rejected, stale, accepted), killed, a second life with push 1;
    w1: one life, pushes 1..2 accepted. A reply and a fault row in between, which are not pushes."""
    return [_row(0, "w0", "hello"), _row(1, "w1", "hello"),
            _row(2, "w0", "grad", 1), _row(3, "server", "ack", 0, dst="w0"),
            _row(4, "w0", "grad", 2, accepted=0, reason="non-finite values in grad"),
            _row(5, "w0", "grad", 3, accepted=0, reason="stale: 9 > max_staleness 8"),
            _row(6, "w1", "grad", 1), _row(7, "w0", "grad", 4),
            _row(8, "w0", "fault:kill", 0, accepted=0, reason="SIGKILL"),
            _row(9, "w0", "hello"), _row(10, "w0", "grad", 1), _row(11, "w1", "grad", 2)]


def test_a_good_ledger_passes_both_ledger_checks(tmp_path):
    audit = ledger_audit(_write_comm(tmp_path / "good", _good_rows()))
    # hand count: accepted (w0, 1, 1), (w0, 1, 4), (w0, 2, 1), (w1, 1, 1), (w1, 1, 2) -> 5 distinct
    assert audit.distinct_accepted == 5
    assert applied_once(5, audit).ok
    check = accounted(audit)
    assert check.ok, check.detail
    assert audit.workers["w0"] == {"received": 5, "accepted": 3, "rejected": 1, "dropped_stale": 1,
                                   "duplicated": 0, "sent": 5}


def test_an_update_applied_without_a_ledger_row_or_twice_fails_applied_once(tmp_path):
    audit = ledger_audit(_write_comm(tmp_path / "good", _good_rows()))
    assert not applied_once(6, audit).ok  # the server applied one more than the ledger accepted
    assert not applied_once(4, audit).ok
    rows = _good_rows() + [_row(12, "w1", "grad", 2)]  # the same (worker, life, seq) accepted again
    twice = ledger_audit(_write_comm(tmp_path / "twice", rows))
    check = applied_once(twice.distinct_accepted, twice)  # even with the counts agreeing
    assert not check.ok and "('w1', 1, '2')" in check.detail


def test_a_push_lost_in_the_middle_of_a_life_fails_accounted(tmp_path):
    rows = [r for r in _good_rows() if not (r[2] == "w0" and r[4] == "grad" and r[5] == 3)]  # w0's seq 3 is gone
    check = accounted(ledger_audit(_write_comm(tmp_path / "lost", rows)))
    assert not check.ok and check.detail == "w0: sent 5 != 3 + 1 + 0"


def test_metrics_continuous_good_and_broken():
    assert metrics_continuous([1, 2, 3, 4], [10, 20, 20, 35]).ok
    gap = metrics_continuous([1, 2, 4, 5], [1, 2, 3, 4])
    assert not gap.ok and "1 gap(s), the first after episode 2 (next is 4)" in gap.detail
    repeat = metrics_continuous([1, 2, 3, 3, 4], [1, 2, 3, 3, 4])
    assert not repeat.ok and "repeat" in repeat.detail
    assert not metrics_continuous([2, 3], [1, 2]).ok  # rows lost at the start
    back = metrics_continuous([1, 2, 3], [10, 30, 20])
    assert not back.ok and "env_steps goes back" in back.detail
    assert not metrics_continuous([], []).ok


def _checkpoint_and_files(tmp_path):
    """A run directory whose checkpoint ends at byte positions of comm.csv / metrics.csv, followed by rows
    of a resumed session."""
    run = _write_comm(tmp_path / "run", _good_rows()[:6])
    comm_pos = (run / "comm.csv").stat().st_size
    with open(run / "comm.csv", "a", newline="") as fh:
        csv.writer(fh).writerow(_row(6, "w1", "hello", version=3))
    (run / "metrics.csv").write_text("t,worker,env_steps,episode\n0.5,w0,40,1\n0.9,w1,80,2\n")
    metrics_pos = (run / "metrics.csv").stat().st_size
    with open(run / "metrics.csv", "a") as fh:
        fh.write("1.5,w0,120,3\n")
    meta = {"updates": 3, "env_steps": 80, "episodes": 2, "server_version": 3,
            "ledger_state": {"count": 6, "position": [comm_pos, 0]}, "metrics_position": [metrics_pos, 0]}
    (run / "checkpoints").mkdir()
    save_checkpoint(run / "checkpoints" / "ckpt_3.npz", {"service.params": np.zeros(2)}, meta)
    return run, checkpoint_facts(run / "checkpoints" / "ckpt_3.npz")


def test_resumed_from_checkpoint_good(tmp_path):
    run, before = _checkpoint_and_files(tmp_path)
    assert before["file"] == "ckpt_3.npz" and before["ledger_count"] == 6 and len(before["sha256"]) == 64
    first_comm = first_row_at(run / "comm.csv", before["comm_position"])
    first_metrics = first_row_at(run / "metrics.csv", before["metrics_position"])
    assert first_comm["id"] == "6" and first_metrics["episode"] == "3"
    entry = {"from": "ckpt_3.npz", "updates": 3, "env_steps": 80, "exact": False}
    check = resumed_from_checkpoint(before, before["sha256"], entry, first_comm, first_metrics)
    assert check.ok, check.detail


@pytest.mark.parametrize("broken, expect", [
    ("sha", "bytes changed"),
    ("from", "resume entry from='ckpt_2.npz'"),
    ("updates", "resume entry updates=2"),
    ("comm_id", "has id 7"),
    ("version", "server version 4"),
    ("episode", "episode 4"),
    ("no_entry", "no resume entry"),
])
def test_resumed_from_checkpoint_broken(tmp_path, broken, expect):
    run, before = _checkpoint_and_files(tmp_path)
    sha = "0" * 64 if broken == "sha" else before["sha256"]
    entry = {"from": "ckpt_2.npz" if broken == "from" else "ckpt_3.npz", "updates": 2 if broken == "updates" else 3,
             "env_steps": 80}
    comm = first_row_at(run / "comm.csv", before["comm_position"])
    comm.update({"comm_id": {"id": "7"}, "version": {"server_version": "4"}}.get(broken, {}))
    metrics = {"episode": "4"} if broken == "episode" else first_row_at(run / "metrics.csv", before["metrics_position"])
    check = resumed_from_checkpoint(before, sha, None if broken == "no_entry" else entry, comm, metrics)
    assert not check.ok and expect in check.detail


def test_read_metrics_columns(tmp_path):
    (tmp_path / "metrics.csv").write_text("t,worker,env_steps,episode,return\n0.1,w0,8,1,9.0\n0.2,w1,16,2,11.0\n")
    assert read_metrics_columns(tmp_path / "metrics.csv") == ([1, 2], [8, 16])


def test_rss_slope_one_process_against_a_hand_computed_fit():
    # (0, 1), (1, 2), (2, 4): slope = sum((t - 1)(y - 7/3)) / sum((t - 1)^2) = (4/3 + 5/3) / 2 = 1.5
    assert rss_slope([0, 1, 2], [1, 2, 4], [7, 7, 7]) == pytest.approx(1.5)
    assert np.isnan(rss_slope([0, 1], [1, 2], [7, 7]))


def test_rss_slope_ignores_the_level_change_of_a_new_process():
    # two processes leaking 0.01 MB/s from different levels (the resumed server starts lower): the slope is
    # 0.01 exactly; one line through all points would see the drop as a large negative slope
    t = np.arange(0, 100, 5.0)
    pid = np.where(t < 50, 100, 200)
    y = np.where(pid == 100, 400.0, 250.0) + 0.01 * t
    assert rss_slope(t, y, list(pid)) == pytest.approx(0.01)
    assert np.polyfit(t, y, 1)[0] < -1


def test_kill_list_is_seeded_and_covers_the_soak():
    kills = kill_list(8, 2.0, 30.0, seed=0)
    assert [k["at_s"] for k in kills] == [30.0, 60.0, 90.0, 120.0]
    assert all(0 <= k["worker"] < 8 for k in kills) and kills == kill_list(8, 2.0, 30.0, seed=0)
    assert kill_list(8, 2.0, 0.0, seed=0) == []


def test_soak_config_sets_the_kills_restarts_and_an_open_budget():
    raw = soak_config("scenarios/cartpole_a3c.yaml", ["scenario.num_envs=2"], "local", 3, 1.0, 20.0, seed=4)
    b = raw["backend"]
    assert b["name"] == "local" and b["workers"] == 3 and len(b["kill"]) == 3 and b["max_restarts"] >= 3
    assert raw["scenario"]["num_envs"] == 2 and raw["run"]["seed"] == 4 and raw["run"]["total_env_steps"] >= 10**9


@pytest.mark.parametrize("args, message", [
    (["--backend", "sim"], "--backend: a soak runs local or ray"),
    (["--backend", "nope"], "--backend: unknown backend 'nope'"),
    (["--workers", "0"], "--workers: must be >= 1"),
    (["--minutes", "0"], "--minutes: must be > 0, got 0"),
    (["--sample-every", "-1"], "--sample-every: must be > 0, got -1"),
    (["--kill-every", "-5"], "--kill-every: must be >= 0"),
    (["--minutes", "2", "--process-kill-at", "3"], "--process-kill-at: must be inside (0, --minutes=2)"),
    (["--scenario", "nope.yaml"], "--scenario: nope.yaml: no such file"),
    (["--set", "backend.nope=1"], "backend.nope"),
])
def test_bad_soak_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["bench", "soak", "--out", str(tmp_path / "s"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_out_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x").write_text("")
    assert main(["bench", "soak", "--out", str(tmp_path / "s")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_short_local_soak_kills_resumes_and_passes_every_check(tmp_path, capsys):
    """Seconds, not minutes: 2 workers, a worker killed every 8 s, the whole run killed once it has a checkpoint
    (at 9 s at the earliest) and resumed; the soak waits for the resumed session's first push before it ends."""
    code = main(["bench", "soak", "--backend", "local", "--workers", "2", "--minutes", "0.4", "--kill-every", "8",
                 "--process-kill-at", "0.15", "--sample-every", "2", "--set", "run.checkpoint_every=10",
                 "--set", "scenario.num_envs=2", "--out", str(tmp_path / "soak"), "--json"])
    (r,) = json.loads(capsys.readouterr().out)["results"]
    assert [c["name"] for c in r["checks"]] == ["applied_once", "accounted", "resumed_from_checkpoint",
                                                "metrics_continuous"]
    assert code == 0 and r["pass"], r["checks"]
    assert any(e["event"].startswith("SIGKILL to the run process") for e in r["events"])
    assert r["summary"]["status"] == "interrupted" and r["summary"]["updates"] > 10
    rows = list(csv.DictReader(open(tmp_path / "soak" / "local" / "samples.csv")))
    rss = [float(row["server_rss_mb"]) for row in rows if row["server_rss_mb"]]
    assert {row["session"] for row in rows} == {"1", "2"} and rss and min(rss) > 0
    assert json.loads((tmp_path / "soak" / "local" / "soak.json").read_text())["pass"]
