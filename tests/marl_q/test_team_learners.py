"""One learner per team (agents/team_learners.py, ``learners:``): each team's learner a service of its own
on the one server (marl_q.server.MultiServer), the ledger split by service, a team's parameters moved
only by its own service's updates, the team rows a learner reads, byte-identical sim reruns, exact
resume, the trained policies loaded back, and bad input refused with one line and exit code 2."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.rollout import TeamStep
from agents.team_learners import TeamLearners, TeamView, WholeRows, team_step
from marl_q.cli import main
from marl_q.config import build_config, load_config
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.ledger import COLUMNS, SERVICE_COLUMN, ledger_audit
from marl_q.rundir import latest_checkpoint, load_checkpoint, load_trained

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "adversary_two_learners.yaml"
SHORT = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0", "run.eval_every=null",
         "run.total_env_steps=1000", "algorithm.envs_per_worker=4", "algorithm.epochs=2",
         "actor={head: mlp, hidden: [16]}", "critic={head: mlp, hidden: [16]}"]


def two_learners(overrides: list[str] = ()):
    return load_config(str(SCENARIO), SHORT + list(overrides))


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("marlq: error: ")
    return err[0]


# ----------------------------------------------------------------------------- the config
def test_each_learner_is_the_files_sections_with_its_keys_over_them():
    cfg = two_learners(["learners.adv={name: ippo, lr: 0.001, actor: {hidden: [8, 8]}}"])
    good, adv = cfg.learners["good"], cfg.learners["adv"]
    assert (good.algorithm.name, adv.algorithm.name) == ("mappo", "ippo")
    assert good.algorithm.lr == pytest.approx(7e-4) and adv.algorithm.lr == pytest.approx(1e-3)
    assert good.algorithm.envs_per_worker == adv.algorithm.envs_per_worker == 4  # the file's, under --set
    assert list(good.actor.hidden) == [16] and list(adv.actor.hidden) == [8, 8]
    assert list(adv.critic.hidden) == [16]
    # config.yaml (resolved sections) reads back to the same learners, also one of another family
    for c in (cfg, two_learners(["learners.adv={name: ia2c, epochs: 1}"])):
        again = build_config(c.to_dict())
        assert again.to_dict() == c.to_dict()
    ia2c = build_config(two_learners(["learners.adv={name: ia2c, epochs: 1}"]).to_dict()).learners["adv"].algorithm
    assert (ia2c.name, ia2c.update, ia2c.gae_lambda, ia2c.n_steps) == ("ia2c", "grad", 1.0, 25)  # its own defaults
    assert "learners" not in load_config(str(ROOT / "scenarios" / "adversary_teams.yaml")).to_dict()


# ----------------------------------------------------------------------------- a worker's team rows
def test_a_teams_view_is_its_members_columns_and_its_step_their_rewards():
    whole = WholeRows(copies=2, agents=3, obs_dim=4, state_dim=5, actions=3)
    whole.obs[...] = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    whole.state[...] = 7.0
    whole.avail[:, 0] = [1, 0, 1]
    view = TeamView(whole, np.array([1, 2]))
    obs, state, avail = np.zeros((2, 2, 3), np.float32), np.zeros((2, 5), np.float32), np.zeros((2, 2, 2), np.float32)
    view.rows(obs, state, avail)
    assert obs.tolist() == [[[4, 5, 6], [8, 9, 10]], [[16, 17, 18], [20, 21, 22]]]  # agents 1 and 2, first 3 columns
    assert (state == 7.0).all() and (avail == 1.0).all()
    TeamView(whole, np.array([0])).rows(obs[:, :1], None, avail[:, :1])
    assert avail[:, 0].tolist() == [[1, 0], [1, 0]]
    rewards = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    data = TeamStep(rewards > 0, rewards, np.zeros((2, 3), bool), np.array([[0, 0, 1], [0, 0, 0]], bool))
    part = team_step(data, np.array([1, 2]))
    assert part.rewards.tolist() == [[2.0, 3.0], [5.0, 6.0]] and part.dones.tolist() == [[False, True], [False, False]]
    assert part.rewards.sum(axis=1).tolist() == [5.0, 11.0]  # the team's reward: its members' summed


# ----------------------------------------------------------------------------- a run
def test_the_ledger_splits_by_service_and_each_services_pushes_are_its_teams(tmp_path: Path):
    summary = run_experiment(two_learners(["backend.workers=2"]), tmp_path / "r")
    header, rows = read(tmp_path / "r" / "comm.csv")
    assert header == COLUMNS + [SERVICE_COLUMN]
    audit = ledger_audit(tmp_path / "r")
    assert sorted(audit.services) == ["adv", "good"]
    steps = {}  # each worker's steps: one push per team per step (train.csv's rows, by worker and service)
    _, train = read(tmp_path / "r" / "train.csv")
    for team in ("good", "adv"):
        pushes = [r for r in rows if r["dst"] == "server" and r["kind"] == "delta" and r["service"] == team]
        replies = [r for r in rows if r["src"] == "server" and r["service"] == team]
        assert summary["services"][team]["updates"] == len(pushes) > 0
        assert all(r["accepted"] == "1" for r in pushes) and len(replies) == len(pushes) + 2  # + the hellos' replies
        for w in ("w0", "w1"):
            counts = audit.services[team].worker(w)
            mine = [r for r in pushes if r["src"] == w]
            assert counts["sent"] == counts["received"] == counts["accepted"] == len(mine)
            assert [int(r["seq"]) for r in mine] == list(range(1, len(mine) + 1))  # each service numbers its own
            steps.setdefault(w, set()).add(len([r for r in train if r["worker"] == w and r["service"] == team]))
        # a service's versions are its own: 1, 2, ... over its accepted pushes
        assert [int(r["server_version"]) for r in pushes] == list(range(len(pushes)))
    assert all(len(counts) == 1 for counts in steps.values())  # every step pushed to both services
    assert audit.worker("w0")["accepted"] == sum(audit.services[t].worker("w0")["accepted"] for t in ("good", "adv"))
    assert audit.repeated_keys == [] and summary["updates"] == sum(s["updates"] for s in summary["services"].values())


def test_faults_on_two_services_leave_every_push_accounted_per_service(tmp_path: Path):
    cfg = two_learners(["backend.workers=3", "run.total_env_steps=2400",
                        "backend.faults={loss: 0.1, duplicate: 0.2, dropout: 0.15, rejoin_s: 0.01, crash: {1: 0.02}}"])
    summary = run_experiment(cfg, tmp_path / "r")
    assert summary["status"] == "completed"
    audit = ledger_audit(tmp_path / "r")
    _, rows = read(tmp_path / "r" / "comm.csv")
    faults = [r for r in rows if r["kind"].startswith("fault:")]
    assert {r["kind"] for r in faults} >= {"fault:loss", "fault:duplicate", "fault:dropout", "fault:crash"}
    assert audit.faults == summary["faults_injected"]
    # a fault that befell a message names its service; a crash befalls the worker, every service of it
    assert all(r["service"] in ("good", "adv") for r in faults if r["kind"] != "fault:crash")
    assert all(r["service"] == "" for r in faults if r["kind"] == "fault:crash")
    assert audit.repeated_keys == [] and audit.refused_duplicates > 0
    for team in ("good", "adv"):
        part = audit.services[team]
        assert part.lives["w1"] >= 2  # its first life, and the fresh worker after the crash
        for worker, row in part.workers.items():  # the pushes left behind were never sent; the rest arrived once
            assert row["received"] == row["accepted"] + row["rejected"] + row["dropped_stale"], (team, worker)
            assert row["accepted"] == row["sent"] and row["rejected"] <= row["duplicated"], (team, worker)
        assert sum(row["accepted"] for row in part.workers.values()) == summary["services"][team]["updates"]


def test_one_service_keeps_comm_csvs_columns(tmp_path: Path):
    cfg = load_config(str(ROOT / "scenarios" / "spread_mappo.yaml"), SHORT[:4] + [
        "run.total_env_steps=300", "algorithm.envs_per_worker=2", "learners={agent: {name: ippo}}"])
    summary = run_experiment(cfg, tmp_path / "r")
    assert read(tmp_path / "r" / "comm.csv")[0] == COLUMNS and "service" not in read(tmp_path / "r" / "train.csv")[0]
    assert summary["learners"]["agent"]["algorithm"] == "ippo" and summary["services"]["agent"]["updates"] > 0


def test_a_frozen_team_keeps_its_parameters_while_the_other_learns(tmp_path: Path):
    cfg = two_learners(["learners.adv.lr=0", "run.checkpoint_every=2"])
    initial = TeamLearners(cfg).make_service().state_dict()
    run_experiment(cfg, tmp_path / "r")
    arrays, meta = load_checkpoint(latest_checkpoint(tmp_path / "r"))
    assert meta["server_state"]["services"]["adv"]["version"] > 0  # its service took updates in...
    np.testing.assert_array_equal(arrays["service.adv.params"], initial["adv.params"])  # ...that moved nothing
    assert not np.array_equal(arrays["service.good.params"], initial["good.params"])
    # the reverse: the good team frozen, the adversary learning
    cfg = two_learners(["learners.good.lr=0"])
    initial = TeamLearners(cfg).make_service().state_dict()
    run_experiment(cfg, tmp_path / "s")
    arrays, _ = load_checkpoint(latest_checkpoint(tmp_path / "s"))
    np.testing.assert_array_equal(arrays["service.good.params"], initial["good.params"])
    assert not np.array_equal(arrays["service.adv.params"], initial["adv.params"])


def test_a_two_learner_run_reruns_byte_identical_and_resumes_exactly(tmp_path: Path, exact_resume):
    files = ("metrics.csv", "comm.csv", "train.csv", "returns.csv")
    run_experiment(two_learners(), tmp_path / "a")
    run_experiment(two_learners(), tmp_path / "b")
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    header, _ = read(tmp_path / "a" / "metrics.csv")
    assert header[:7] == ["t", "worker", "env_steps", "episode", "return", "return:good", "return:adv"]
    assert header[-2:] == ["version:good", "version:adv"]
    exact_resume(lambda: two_learners().to_dict(), stop_after=6)


def test_a_recurrent_learner_against_a_feed_forward_one_resumes_exactly(exact_resume):
    gru = ["learners.adv={name: ippo, actor: {recurrent: gru}, critic: {recurrent: gru}}", "run.total_env_steps=800"]
    cfg = two_learners(gru)
    assert cfg.learners["adv"].actor.recurrent == "gru" and cfg.learners["good"].actor.recurrent is None
    exact_resume(lambda: two_learners(gru).to_dict(), stop_after=4)


def test_on_local_processes_each_service_resumes_from_its_checkpoint(tmp_path: Path):
    cfg = two_learners(["backend.name=local", "backend.workers=2", "backend.hello_timeout_s=300",
                        "run.total_env_steps=1500", "run.stop_after_updates=6"])
    part = run_experiment(cfg, tmp_path / "r")
    assert part["status"] == "stopped"
    arrays, meta = load_checkpoint(latest_checkpoint(tmp_path / "r"))
    stopped_at = {t: s["version"] for t, s in meta["server_state"]["services"].items()}
    assert sum(stopped_at.values()) >= 6 and {"service.good.params", "service.adv.params"} <= set(arrays)
    summary = resume_experiment(tmp_path / "r")
    assert summary["status"] == "completed" and summary["resumes"][0]["exact"] is False  # fresh workers
    audit = ledger_audit(tmp_path / "r")
    _, rows = read(tmp_path / "r" / "comm.csv")
    for team in ("good", "adv"):
        assert sum(r["accepted"] for r in audit.services[team].workers.values()) == summary["services"][team]["updates"]
        pushes = [r for r in rows if r["dst"] == "server" and r["kind"] == "delta" and r["service"] == team]
        # each service's versions go on from its checkpoint: one per accepted push, none repeated
        assert sorted(int(r["server_version"]) for r in pushes) == list(range(len(pushes)))
        assert all(audit.services[team].lives[w] == 2 for w in ("w0", "w1"))  # a hello before and after the resume


def test_an_ia2c_learner_against_a_mappo_one_runs_and_loads_back(tmp_path: Path):
    cfg = two_learners(["learners.adv={name: ia2c, epochs: 1}", "run.total_env_steps=600", "run.eval_every=300",
                        "run.eval_episodes=2"])
    summary = run_experiment(cfg, tmp_path / "r")
    assert summary["learners"]["adv"]["algorithm"] == "ia2c" and summary["learners"]["good"]["algorithm"] == "mappo"
    header, rows = read(tmp_path / "r" / "comm.csv")
    assert {r["kind"] for r in rows if r["service"] == "adv" and r["dst"] == "server"} == {"hello", "grad"}
    assert {r["kind"] for r in rows if r["service"] == "good" and r["dst"] == "server"} == {"hello", "delta"}
    eval_header, evals = read(tmp_path / "r" / "eval.csv")
    assert "eval_return:good" in eval_header and "eval_return:adv" in eval_header and len(evals) == 2
    policy = load_trained(tmp_path / "r").policy
    obs = {"adversary_0": np.zeros(8, np.float32), "agent_0": np.zeros(10, np.float32),
           "agent_1": np.ones(10, np.float32)}  # each team's own observation size
    acts = policy.act(obs)
    assert sorted(acts) == sorted(obs) and all(0 <= a < 5 for a in acts.values())
    # each agent's row as the rollout makes it: its observation, then its one-hot id within its team
    logits = policy.logits(obs)
    with torch.no_grad():
        good = policy.models["good.actor"](torch.tensor([[1.0] * 10 + [0.0, 1.0]])).numpy()[0]  # agent_1: good's 2nd
        adv = policy.models["adv.actor"](torch.tensor([[0.0] * 8 + [1.0]])).numpy()[0]
    np.testing.assert_allclose(logits["agent_1"], good, rtol=1e-6)
    np.testing.assert_allclose(logits["adversary_0"], adv, rtol=1e-6)


def test_a_one_learner_team_run_loads_back_with_agent_ids(tmp_path: Path):
    cfg = load_config(str(ROOT / "scenarios" / "adversary_teams.yaml"), SHORT + ["run.total_env_steps=300"])
    run_experiment(cfg, tmp_path / "r")
    policy = load_trained(tmp_path / "r").policy
    obs = {"adversary_0": np.full(8, 0.5, np.float32), "agent_0": np.zeros(10, np.float32)}
    with torch.no_grad():  # common_spaces: the adversary's 8 inputs padded to 10, then 3 agent ids
        want = policy.models["actor"](torch.tensor([[0.5] * 8 + [0.0, 0.0] + [1.0, 0.0, 0.0]])).numpy()[0]
    np.testing.assert_allclose(policy.logits(obs)["adversary_0"], want, rtol=1e-6)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("override, message", [
    ("learners={good: {}}", "learners: team(s) adv have no learner (the teams: good, adv; each needs one)"),
    ("learners={good: {}, adv: {}, villains: {}}", "learners.villains: names no team (the teams: good, adv"),
    ("learners.adv={name: coma}", "learners.adv.name: algorithm 'coma' cannot be a team's learner"),
    ("learners.adv={name: iql}", "learners.adv.name: algorithm 'iql' cannot be a team's learner"),
    ("learners.adv={name: ia2c, n_steps: 5, epochs: 1}", "learners: n_steps differs (good: 25, adv: 5)"),
    ("learners.adv.lr=-1", "learners.adv.lr: must be positive, or 0 to freeze the parameters, got -1"),
    ('scenario={name: pettingzoo, env: "pettingzoo.classic.tictactoe_v3:env"}',
     "learners: scenario 'pettingzoo' is turn-based; one learner per team plays parallel envs only"),
    ("learners=[good, adv]", "learners: expected a mapping of team -> its learner's keys"),
])
def test_bad_learners_exit_2_with_one_line_and_make_no_run(override, message, tmp_path: Path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(SCENARIO), "--out", str(out), "--set", override]) == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


def test_learners_under_an_algorithm_without_teams_exit_2(tmp_path: Path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(SCENARIO), "--out", str(out), "--set", "algorithm={name: coma}"]) == 2
    assert "algorithm.name: algorithm 'coma' cannot be a team's learner" in one_error_line(capsys)
    assert not out.exists()
