"""Routing agents: heuristics, the commit service behind the server core, and tiny end-to-end runs."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.routing import (ACCEPT, COMMIT, FRESH_START, POLICY, REFUSE, RELEASE, SNAPSHOT, IndependentRoutingPPO,
                            RandomFeasible, UniformRandom, shortest_path_first_fit)
from marl_q.config import load_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment
from marl_q.ledger import Ledger
from marl_q.messages import SERVER, Message
from marl_q.server import Server

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
AMARL = ROOT / "scenarios" / "routing_amarl.yaml"
SINGLE = ROOT / "scenarios" / "routing_single_ppo.yaml"
TINY = ["run.progress=false", "algorithm.n_steps=64", "algorithm.eval_days=0.02", "algorithm.episode_requests=50"]


def test_shortest_path_first_fit_by_hand() -> None:
    assert shortest_path_first_fit("embb", np.zeros(3), np.array([False, True, True])) == 1
    assert shortest_path_first_fit("embb", np.zeros(3), np.array([True, True, False])) == 0
    assert shortest_path_first_fit("embb", np.zeros(3), np.array([False, False, False])) == 3   # reject


def test_random_feasible_is_uniform_over_feasible_paths() -> None:
    pick = RandomFeasible(seed=0)
    feasible = np.array([True, False, True, True])
    counts = np.bincount([pick("x", np.zeros(1), feasible) for _ in range(3000)], minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    assert np.all(np.abs(counts[[0, 2, 3]] - 1000) < 120)        # ~4 sd of a binomial(3000, 1/3)
    assert pick("x", np.zeros(1), np.zeros(4, dtype=bool)) == 4


def test_uniform_random_uses_every_action() -> None:
    pick = UniformRandom(seed=1)
    counts = np.bincount([pick("x", np.zeros(1), np.ones(4, dtype=bool)) for _ in range(2500)], minlength=5)
    assert np.all(np.abs(counts - 500) < 90)


def test_the_ppo_update_is_the_actor_critic_core() -> None:
    """The routing worker runs the lead's PPO loss and loop, not a copy of it."""
    import agents.actor_critic as core
    import agents.routing as routing

    assert routing.actor_critic_update is core.actor_critic_update


# ----------------------------------------------------------------------------- the commit service
@pytest.fixture
def served():
    cfg = load_config(AMARL, TINY)
    algo = IndependentRoutingPPO(cfg)
    service = algo.make_service()
    ledger = Ledger(None)
    server = Server(service, ["w0", "w1", "w2"], cfg.server, ledger)
    return cfg, service, server, ledger


def commit_msg(src: str, rid: int, links, nodes, kbps: int, base: int, releases=(), clock: float = 0.0) -> Message:
    return Message(src, SERVER, COMMIT, {"release_ids": np.array(releases, dtype=np.int64),
                                          "request": np.array([rid, kbps, kbps], dtype=np.int64),
                                          "links": np.array(links, dtype=np.int64),
                                          "nodes": np.array(nodes, dtype=np.int64),
                                          "clock": np.array([clock])}, base_version=base)


def release_msg(src: str, ids, clock: float = 0.0) -> Message:
    return Message(src, SERVER, RELEASE, {"release_ids": np.array(ids, dtype=np.int64), "clock": np.array([clock])})


def test_hello_gives_a_snapshot(served) -> None:
    _, service, server, _ = served
    [reply] = server.receive(Message("w0", SERVER, "hello"), 0.0)
    assert reply.kind == SNAPSHOT and reply.dst == "w0" and reply.base_version == 0
    assert np.array_equal(reply.payload["link_residual"], service.world.topology.link_capacity)


def test_commit_over_capacity_is_refused_and_nothing_changes(served) -> None:
    _, service, server, ledger = served
    cap = int(service.world.topology.link_capacity[0])
    [ok] = server.receive(commit_msg("w0", 0, [0], [], cap - 10, 0), 0.0)
    assert ok.kind == ACCEPT and ok.base_version == 1 and server.version == 1
    before = service.resources.link_residual.copy()
    [no] = server.receive(commit_msg("w1", 1, [0], [], 11, 1), 0.0)
    assert no.kind == REFUSE and no.base_version == 1 and server.version == 1
    assert np.array_equal(service.resources.link_residual, before)
    assert no.payload["link_residual"][0] == 10                   # the refusal carries the fresh state
    assert ledger.by_kind[COMMIT][0] == 2 and ledger.by_kind[REFUSE][0] == 1 and ledger.rejected == 0


def test_concurrent_commits_from_one_stale_snapshot(served) -> None:
    """Three workers plan on version 0; feasibility against the current state decides, not staleness."""
    _, service, server, _ = served
    cap = int(service.world.topology.link_capacity[3])
    half = cap // 2
    kinds = [server.receive(commit_msg(w, i, [3], [], half, 0), 0.0)[0].kind for i, w in enumerate(["w0", "w1", "w2"])]
    assert kinds == [ACCEPT, ACCEPT, REFUSE]                      # the second was stale yet fine
    assert service.resources.counters.stale_commits == 2 and service.resources.counters.conflicts == 1
    assert service.summary()["per_worker"]["w2"]["conflicts"] == 1
    assert service.resources.version == server.version
    service.resources.check_invariants()


def test_releases_only_by_the_holder_and_only_once(served) -> None:
    _, service, server, ledger = served
    server.receive(commit_msg("w0", 7, [1, 2], [], 1000, 0), 0.0)
    [r] = server.receive(release_msg("w1", [7]), 0.0)
    assert r.kind == SNAPSHOT and ledger.rejected == 1 and 7 in service.resources.holdings
    [r] = server.receive(release_msg("w0", [7]), 0.0)
    assert 7 not in service.resources.holdings and server.version == 2
    assert np.array_equal(service.resources.link_residual, service.world.topology.link_capacity)
    server.receive(release_msg("w0", [7]), 0.0)
    assert ledger.rejected == 2 and server.version == 2


def test_pacing_holds_back_a_worker_that_runs_ahead(served) -> None:
    """max_clock_skew_s = 30: a worker more than 30 s ahead of the slowest waits for its reply."""
    _, service, server, _ = served
    assert service.max_skew == 30.0

    def dsts(msg: Message) -> list[tuple[str, str]]:
        return [(r.dst, r.kind) for r in server.receive(msg, 0.0)]

    assert dsts(commit_msg("w0", 0, [0], [], 10, 0, clock=100.0)) == []           # slowest is at 0
    assert dsts(release_msg("w1", [], clock=20.0)) == [("w1", SNAPSHOT)]           # within 0 + 30
    assert dsts(release_msg("w2", [], clock=40.0)) == [("w2", SNAPSHOT)]           # within 20 + 30
    assert dsts(release_msg("w1", [], clock=75.0)) == []                           # 75 > 40 + 30
    assert dsts(release_msg("w2", [], clock=72.0)) == [("w2", SNAPSHOT), ("w0", ACCEPT), ("w1", SNAPSHOT)]
    assert service.withheld == {} and server.version == 1
    assert service.summary()["per_worker"]["w0"]["held_back"] == 1


def test_a_restarted_worker_gets_its_orphaned_holdings_released(served) -> None:
    """The local backend restarts a dead worker; its first message frees what the old one held."""
    _, service, server, _ = served
    server.receive(commit_msg("w0", 3, [0], [], 100, 0), 0.0)
    server.receive(commit_msg("w1", 4, [0], [], 100, 1), 0.0)
    first = commit_msg("w0", 3, [1], [], 50, 2)            # the new incarnation reuses request id 3
    first.info[FRESH_START] = True
    [reply] = server.receive(first, 0.0)
    assert reply.kind == ACCEPT and set(service.resources.holdings) == {3, 4}
    cap = service.world.topology.link_capacity
    assert service.resources.link_residual[0] == cap[0] - 100 and service.resources.link_residual[1] == cap[1] - 50
    service.resources.check_invariants()


def test_malformed_commits_are_rejected_by_name(served) -> None:
    _, service, server, ledger = served
    n_links = len(service.world.topology.link_capacity)
    [r] = server.receive(commit_msg("w0", 1, [n_links + 5], [], 10, 0), 0.0)
    assert r.kind == REFUSE and ledger.rejected == 1 and server.version == 0
    bad = commit_msg("w0", 2, [0], [], 10, 0)
    bad.payload["links"] = bad.payload["links"].astype(np.float32)
    server.receive(bad, 0.0)
    assert ledger.rejected == 2 and service.resources.counters.commits == 0


def test_checkpoint_round_trip(served) -> None:
    cfg, service, server, _ = served
    server.receive(commit_msg("w0", 3, [0, 1], [4], 500, 0), 0.0)
    server.receive(commit_msg("w2", 5, [2], [], 700, 1), 0.0)
    service.policies["w1"] = np.arange(service.n_params, dtype=np.float32)
    state = service.state_dict()
    fresh = IndependentRoutingPPO(cfg).make_service()
    fresh.load_state_dict(state)
    assert np.array_equal(fresh.resources.link_residual, service.resources.link_residual)
    assert fresh.resources.version == service.resources.version and fresh.holder == service.holder
    assert np.array_equal(fresh.policies["w1"], service.policies["w1"])
    state["link_residual"] = state["link_residual"] + 1
    with pytest.raises(ValueError, match="residuals do not match"):
        IndependentRoutingPPO(cfg).make_service().load_state_dict(state)


# ----------------------------------------------------------------------------- configs and runs
@pytest.mark.parametrize("path, overrides, message", [
    (AMARL, ["backend.workers=2"], "backend.workers: amarl runs one worker per service"),
    (SINGLE, ["backend.workers=3"], "backend.workers: single_ppo is one agent"),
    (AMARL, ["server.max_staleness=3"], "server.max_staleness must be null"),
    (AMARL, ["algorithm.eval_shifts=[heatwave]"], "eval_shifts"),
    (AMARL, ["scenario.services=[embb, video]"], "scenario.services"),
    (AMARL, ["scenario.k_paths=0"], "k_paths must be >= 1"),
])
def test_bad_configs_are_named(path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)


def test_a_malformed_trace_fails_at_load_with_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,cell,service,rate\n0,0,embb,1.0\n5,0,embb,lots\n")
    overrides = [f"scenario.trace_csv={trace}", "algorithm.eval_shifts=[none]"]
    with pytest.raises(ConfigError, match=r"line 3 .*rate 'lots' is not a number"):
        load_config(AMARL, overrides)
    from marl_q.cli import main
    args = ["run", str(AMARL), "--set", overrides[0], "--set", overrides[1], "--out", str(tmp_path / "run"), "--quiet"]
    assert main(args) == 2                                   # the CLI's exit code for bad input


@pytest.mark.parametrize("path", [AMARL, SINGLE])
def test_tiny_run_end_to_end(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = load_config(path, TINY + ["run.total_env_steps=450", "algorithm.eval_shifts=[none, urllc_surge]"])
    summary = run_experiment(cfg, out, plots=False)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["status"] == "completed" and saved["env_steps"] >= 450
    for shift in ("none", "urllc_surge"):
        assert 0.0 <= saved[f"eval_{shift}_gos"] <= 1.0
        assert 0.0 <= saved[f"baseline_shortest_path_first_fit_{shift}_gos"] <= 1.0
    assert saved["commits"] == saved["commits_accepted"] + saved["commits_refused"]
    assert saved["server_version"] == summary["updates"]
    with open(out / "comm.csv") as f:
        rows = list(csv.DictReader(f))
    commits = [r for r in rows if r["kind"] == COMMIT]
    replies = [r for r in rows if r["kind"] in (ACCEPT, REFUSE)]
    assert len(commits) == saved["commits"] == len(replies)
    assert sum(r["kind"] == REFUSE for r in replies) == saved["commits_refused"]
    with open(out / "metrics.csv") as f:
        metrics = list(csv.DictReader(f))
    assert metrics and all(0.0 <= float(m["gos"]) <= 1.0 for m in metrics)


def test_sim_runs_are_reproducible(tmp_path: Path) -> None:
    overrides = TINY + ["run.total_env_steps=200", "algorithm.eval_days=0"]
    for name in ("a", "b"):
        run_experiment(load_config(AMARL, overrides), tmp_path / name, plots=False)
    for fname in ("comm.csv", "metrics.csv"):  # the agents' real compute seconds are in metrics_wall.csv
        assert (tmp_path / "a" / fname).read_bytes() == (tmp_path / "b" / fname).read_bytes(), fname
    with open(tmp_path / "a" / "metrics_wall.csv") as f:
        walls = list(csv.DictReader(f))
    assert walls and all(float(row["compute_s"]) > 0.0 for row in walls)


def _drive(worker, server, steps: int, inbox: list) -> list:
    """``steps`` decisions of ``worker`` against ``server``: the replies to a step's messages are held
    in ``inbox`` and delivered when the next step starts, so a worker left by this waits for them. The
    messages sent and the episodes ended, step by step (wall seconds aside)."""
    out = []
    for _ in range(steps):
        while inbox:
            worker.deliver(inbox.pop(0))
        assert worker.ready()
        work = worker.step()
        for msg in work.messages:
            inbox += server.receive(msg, 0.0)
        out.append(([(m.kind, m.seq, m.base_version, sorted(m.info), {k: np.asarray(v).tolist() for k, v in m.payload.items()})
                     for m in work.messages], [{k: v for k, v in row.items() if k != "compute_s"} for row in work.episodes],
                    work.env_steps))
    return out


def test_a_worker_snapshotted_between_a_commit_and_its_reply_goes_on_exactly(tmp_path) -> None:
    """A training decision runs through the shared rollout loop (agents.rollout.rollout over
    RoutingDecisions); a commit's step is booked when the reply comes (Step.deferred), so between the
    two the worker is plain data, not a suspended loop. Snapshotted there with its server (as the sim
    backend does) and given the same replies, each copy sends the same messages and ends the same
    episodes as the worker that was not."""
    from marl_q.rundir import load_snapshot, save_snapshot

    cfg = load_config(AMARL, TINY + ["algorithm.max_clock_skew_s=1e9"])  # w0 alone runs: no reply held back
    algo = IndependentRoutingPPO(cfg)
    server = Server(algo.make_service(), ["w0", "w1", "w2"], cfg.server, Ledger(None))
    worker = algo.make_worker(0)
    inbox = server.receive(worker.start()[0], 0.0)
    before = _drive(worker, server, 150, inbox)
    assert any(rows for _, rows, _ in before) and worker.rollouts >= 1  # episodes ended, updates ran
    while not (inbox and inbox[0].kind in (ACCEPT, REFUSE)):  # stop between a commit and its reply
        before += _drive(worker, server, 1, inbox)
    assert worker.pending is not None and worker.book.lengths[0] > 0
    # what the sim backend keeps: the worker, the service, the messages in flight (the server's core as data)
    digest = save_snapshot(tmp_path / "s.pkl", {"worker": worker, "service": server.service, "inbox": inbox,
                                                "server": server.state()})
    copies = [load_snapshot(tmp_path / "s.pkl", digest) for _ in range(2)]
    want = _drive(worker, server, 200, inbox)
    assert sum(len(rows) for _, rows, _ in want) >= 2 and any(m[0] == POLICY for msgs, _, _ in want for m in msgs)
    for copy in copies:
        again = Server(copy["service"], ["w0", "w1", "w2"], cfg.server, Ledger(None))
        again.load_state(copy["server"])
        assert _drive(copy["worker"], again, 200, copy["inbox"]) == want
