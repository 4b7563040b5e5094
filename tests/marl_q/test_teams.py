"""Teams (marl_q/teams.py): scenario.teams and run.report_team resolved against the env's agents, the
per-agent returns of the team learners' episodes (agents.rollout.AgentEpisodeBook), returns.csv, the
per-team columns of metrics.csv and eval.csv in a run with several teams, byte-identical sim reruns,
exact resume, and bad input refused with one line and exit code 2."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from agents.rollout import AgentEpisodeBook, EpisodeBook, Step, TeamStep
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.errors import ConfigError
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.teams import RETURNS_FILE, resolve_teams, with_team_fields

ROOT = Path(__file__).resolve().parents[2]
ADVERSARY = ["adversary_0", "agent_0", "agent_1"]
# a short run of the shipped file: 4 copies x 25 steps per rollout, two epochs, small networks
SHORT = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0", "run.eval_every=null",
         "run.total_env_steps=1000", "algorithm.envs_per_worker=4", "algorithm.epochs=2",
         "actor={head: mlp, hidden: [16]}", "critic={head: mlp, hidden: [16]}"]


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def adversary(overrides: list[str] = ()):
    return load_config(str(ROOT / "scenarios" / "adversary_teams.yaml"), SHORT + list(overrides))


# ----------------------------------------------------------------------------- resolving teams
def test_default_teams_are_mpes_prefixes_in_the_envs_order():
    teams = resolve_teams(None, ADVERSARY)
    assert teams.members == {"adversary": (0,), "agent": (1, 2)} and teams.report == "adversary"
    assert resolve_teams(None, ["agent_0", "agent_1"]).members == {"agent": (0, 1)}  # simple_spread: one team
    # an agent without one of the prefixes: every agent in one team
    assert resolve_teams(None, ["pursuer_0", "pursuer_1"]).members == {"all": (0, 1)}
    assert resolve_teams(None, ["leadadversary_0", "adversary_0", "agent_0"]).members == {"all": (0, 1, 2)}


def test_teams_by_list_and_by_prefix_agree():
    by_list = resolve_teams({"good": ["agent_1", "agent_0"], "adv": ["adversary_0"]}, ADVERSARY)
    by_prefix = resolve_teams({"good": "agent_", "adv": "adversary_"}, ADVERSARY, report="adv")
    assert by_list.members == by_prefix.members == {"good": (1, 2), "adv": (0,)}  # members in env order
    assert by_list.report == "good" and by_prefix.report == "adv"
    assert by_list.several and not resolve_teams({"all": "a"}, ADVERSARY).several


@pytest.mark.parametrize("spec, report, message", [
    ({"good": ["agent_0", "agent_7"], "adv": "adversary_"}, None,
     "scenario.teams.good: unknown agent(s) agent_7 (the env's agents: adversary_0, agent_0, agent_1)"),
    ({"good": ["agent_0"], "adv": "adversary_"}, None, "scenario.teams: leaves out agent(s) agent_1"),
    ({"good": "agent_", "adv": "villain_"}, None, "scenario.teams.adv: the prefix 'villain_' matches no agent"),
    ({"good": "agent_", "adv": ["adversary_0", "agent_1"]}, None,
     "scenario.teams: agent agent_1 is in two teams, good and adv"),
    ({"good": 3}, None, "scenario.teams.good: expected a list of agent names or an agent-name prefix"),
    ([["agent_0"]], None, "scenario.teams: expected a mapping"),
    ({"good": "agent_", "adv": "adversary_"}, "bad", "run.report_team: 'bad' names no team (the teams: good, adv)"),
    (None, "good", "run.report_team: 'good' names no team (the teams: adversary, agent)"),
])
def test_bad_team_maps_name_what_is_wrong(spec, report, message):
    with pytest.raises(ConfigError) as exc:
        resolve_teams(spec, ADVERSARY, report)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_team_columns_go_after_return_only_with_several_teams():
    fields = ["return", "length", "version"]
    assert with_team_fields(fields, resolve_teams(None, ["agent_0", "agent_1"])) == fields
    assert with_team_fields(fields, resolve_teams(None, ADVERSARY)) == [
        "return", "return:adversary", "return:agent", "length", "version"]


# ----------------------------------------------------------------------------- the returns, by hand
def test_team_returns_sum_to_the_old_return_by_hand():
    """Two copies, three agents (adversary_0, agent_0, agent_1), three steps; copy 1's first step only
    restarts it (not valid: its rewards must not count), and both copies' episodes end at step 3."""
    def step(valid, rewards, ended):
        rewards = np.array(rewards, dtype=float)
        E, N = rewards.shape
        team = np.where(valid, rewards.sum(axis=1), 0.0)  # what the vectors hand the book
        return Step(np.array(valid), team, np.array(ended),
                    TeamStep(np.ones((E, N), bool), rewards, np.zeros((E, N), bool), np.zeros((E, N), bool)))

    book, plain = AgentEpisodeBook(2, 3), EpisodeBook(2)
    steps = [step([True, False], [[-1.0, 0.5, 0.5], [9.0, 9.0, 9.0]], [False, False]),
             step([True, True], [[-0.25, 2.0, 2.0], [-2.0, 1.0, 1.0]], [False, False]),
             step([True, True], [[0.0, -1.5, -1.5], [-0.5, 0.25, 0.25]], [True, True])]
    for s in steps:
        ended = book.add(s)
        assert list(ended) == list(plain.add(s))
    rows = [book.close(0), book.close(1)]
    # by hand: copy 0 adversary -1.25, agents 1.0 each; copy 1 (from its second step) -2.5, 1.25 each
    assert rows[0]["agent_returns"] == [-1.25, 1.0, 1.0] and rows[1]["agent_returns"] == [-2.5, 1.25, 1.25]
    teams = resolve_teams({"good": "agent_", "adv": "adversary_"}, ADVERSARY)
    for i, row in enumerate(rows):
        old = plain.close(i)["return"]
        assert row["return"] == old  # the book's own sum is unchanged by the per-agent counters
        split = teams.team_returns(row["agent_returns"])
        assert split == ({"good": 2.0, "adv": -1.25} if i == 0 else {"good": 2.5, "adv": -2.5})
        assert sum(split.values()) == pytest.approx(old, abs=1e-12)
        ep = dict(row)
        csv_row = teams.annotate(ep)  # several teams: return becomes the report team's (good)
        assert ep["return"] == split["good"] and ep["return:adv"] == split["adv"]
        assert csv_row == {"team:good": split["good"], "team:adv": split["adv"], "agent:adversary_0": row["agent_returns"][0],
                           "agent:agent_0": row["agent_returns"][1], "agent:agent_1": row["agent_returns"][2]}
    assert book.agent_returns.sum() == 0.0  # closed episodes start again


# ----------------------------------------------------------------------------- runs
def test_a_two_team_run_splits_the_one_team_runs_return(tmp_path: Path):
    """The same config and seed with every agent in one team and with two: the learning is the same
    (teams only change what is reported), returns.csv's team returns add up to the one-team run's
    ``return``, and the two-team run's ``return`` is the report team's."""
    run_experiment(adversary(["scenario.teams={all: [adversary_0, agent_0, agent_1]}", "run.report_team=null"]),
                   tmp_path / "one")
    summary = run_experiment(adversary(), tmp_path / "two")
    one_head, one = read(tmp_path / "one" / "metrics.csv")
    two_head, two = read(tmp_path / "two" / "metrics.csv")
    assert one_head == ["t", "worker", "env_steps", "episode", "return", "length", "version"]
    assert two_head == ["t", "worker", "env_steps", "episode", "return", "return:good", "return:adv", "length", "version"]
    ret_head, rets = read(tmp_path / "two" / RETURNS_FILE)
    assert ret_head == ["t", "worker", "env_steps", "episode", "team:good", "team:adv", "agent:adversary_0",
                        "agent:agent_0", "agent:agent_1"]
    assert len(one) == len(two) == len(rets) == 40  # 1000 steps / 25 per episode
    for a, b, r in zip(one, two, rets):
        assert [a[k] for k in ("t", "env_steps", "episode", "length", "version")] == \
               [b[k] for k in ("t", "env_steps", "episode", "length", "version")]
        assert float(r["team:good"]) + float(r["team:adv"]) == pytest.approx(float(a["return"]), abs=1e-9)
        assert float(r["team:good"]) == float(r["agent:agent_0"]) + float(r["agent:agent_1"])
        assert float(r["team:adv"]) == float(r["agent:adversary_0"])
        assert b["return"] == b["return:good"] == r["team:good"] and b["return:adv"] == r["team:adv"]
    final = {t: float(np.mean([float(r[f"team:{t}"]) for r in rets])) for t in ("good", "adv")}  # 40 < 100
    assert summary["report_team"] == "good" and summary["final_team_return"] == pytest.approx(final, abs=1e-12)
    assert summary["final_return"] == summary["final_team_return"]["good"]  # the same mean, to the bit
    _, one_rets = read(tmp_path / "one" / RETURNS_FILE)
    assert [r["team:all"] for r in one_rets] == [r["return"] for r in one]


def test_eval_csv_has_each_teams_return_and_return_is_the_report_teams(tmp_path: Path):
    run_experiment(adversary(["run.eval_every=500", "run.eval_episodes=3"]), tmp_path / "r")
    head, rows = read(tmp_path / "r" / "eval.csv")
    assert head[-2:] == ["eval_return:good", "eval_return:adv"] and len(rows) == 2
    for row in rows:
        assert row["eval_return"] == row["eval_return:good"] and float(row["eval_return:adv"]) < 0


def test_a_one_team_run_keeps_its_metrics_columns_and_writes_returns_csv(tmp_path: Path):
    cfg = load_config(str(ROOT / "scenarios" / "spread_mappo.yaml"),
                      SHORT + ["run.total_env_steps=400", "scenario={name: spread, n_agents: 2, max_cycles: 10}"])
    run_experiment(cfg, tmp_path / "r")
    head, rows = read(tmp_path / "r" / "metrics.csv")
    assert head == ["t", "worker", "env_steps", "episode", "return", "length", "version"]
    rhead, rets = read(tmp_path / "r" / RETURNS_FILE)
    assert rhead[4:] == ["team:agent", "agent:agent_0", "agent:agent_1"] and len(rets) == len(rows) > 0
    for m, r in zip(rows, rets):
        # the one team's return is the run's return to the last bit; its agents' add up to it
        assert r["team:agent"] == m["return"]
        assert float(r["agent:agent_0"]) + float(r["agent:agent_1"]) == pytest.approx(float(m["return"]), abs=1e-9)


def test_a_team_run_reruns_byte_identical_and_resumes_exactly(tmp_path: Path):
    files = ("metrics.csv", RETURNS_FILE, "comm.csv", "train.csv")
    run_experiment(adversary(), tmp_path / "a")
    run_experiment(adversary(), tmp_path / "b")
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    part = run_experiment(adversary(["run.stop_after_updates=4"]), tmp_path / "part")
    assert part["status"] == "stopped"
    stopped = (tmp_path / "part" / RETURNS_FILE).read_bytes()
    with open(tmp_path / "part" / RETURNS_FILE, "a") as fh:  # a row written after the checkpoint: cut on resume
        fh.write("9.0,w0,999,99,1,2,3,4,5\n")
    resume_experiment(tmp_path / "part")
    for name in files:
        assert (tmp_path / "part" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert len((tmp_path / "a" / RETURNS_FILE).read_bytes()) > len(stopped)


# ----------------------------------------------------------------------------- bad input at the CLI
def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("marlq: error: ")
    return err[0]


@pytest.mark.parametrize("override, message", [
    ("scenario.teams={good: [agent_0, agent_9], adv: adversary_}", "scenario.teams.good: unknown agent(s) agent_9"),
    ("scenario.teams={good: [agent_0], adv: adversary_}", "scenario.teams: leaves out agent(s) agent_1"),
    ("run.report_team=villains", "run.report_team: 'villains' names no team (the teams: good, adv)"),
])
def test_bad_teams_exit_2_with_one_line_and_make_no_run(override, message, tmp_path: Path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(ROOT / "scenarios" / "adversary_teams.yaml"), "--out", str(out), "--set", override]) == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


def test_report_team_on_a_learner_without_teams_exits_2(tmp_path: Path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(ROOT / "scenarios" / "cartpole_a3c.yaml"), "--out", str(out),
                 "--set", "run.report_team=good"]) == 2
    assert "run.report_team: algorithm 'a3c' reports no per-team returns" in one_error_line(capsys)
    assert not out.exists()


# ----------------------------------------------------------------------------- plots and report
def write_team_run(path: Path, seed: int, good, adv, report=None) -> Path:
    """A run directory with metrics.csv (return = good's) and returns.csv (teams good, adv; agents
    adversary_0 = adv, agent_0 and agent_1 each half of good), episodes every 10 env steps."""
    from tests.analysis.test_plots import config, write_run

    cfg = config("mappo", seed=seed, window=2, run__report_team=report)
    write_run(path, cfg, good)
    with open(path / RETURNS_FILE, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t", "worker", "env_steps", "episode", "team:good", "team:adv", "agent:adversary_0",
                    "agent:agent_0", "agent:agent_1"])
        for i, (g, a) in enumerate(zip(good, adv)):
            w.writerow([(i + 1) / 100, "w0", (i + 1) * 10, i + 1, g, a, a, g / 2, g / 2])
    return path


def test_the_team_plot_draws_every_team_in_one_axes_smoothed_as_return(tmp_path: Path, monkeypatch):
    from analysis import plots

    kept = []
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: kept.append(fig))
    good, adv = [0.0, 2.0, 4.0, float("nan"), 8.0], [-1.0, -1.0, -3.0, -3.0, -5.0]
    runs = [plots.load_run(write_team_run(tmp_path / "s0", 0, good, adv, report="good"))]
    assert plots.report_team(runs[0]) == "good" and plots.team_names(runs[0]) == ["good", "adv"]
    path = plots.plot_teams({"g": runs}, "a title", tmp_path / "teams.png")
    assert path.is_file()
    team_ax, agent_ax = kept[-1].axes[:2]
    lines = {ln.get_label(): ln for ln in team_ax.get_lines()}
    assert set(lines) == {"good (= return), 1 seed", "adv, 1 seed"}
    grid = lines["adv, 1 seed"].get_xdata()
    # by hand: trailing means over 2 episodes at env steps 10..50; good's NaN episode (a resumed run's
    # unknown) is left out, so its curve runs 0, 1, 3, (3 at 40 interpolated), 6
    expect_adv = np.interp(grid, [10, 20, 30, 40, 50], [-1.0, -1.0, -2.0, -3.0, -4.0])
    expect_good = np.interp(grid, [10, 20, 30, 50], [0.0, 1.0, 3.0, 6.0])
    inside = grid >= 10
    np.testing.assert_allclose(lines["adv, 1 seed"].get_ydata()[inside], expect_adv[inside])
    np.testing.assert_allclose(lines["good (= return), 1 seed"].get_ydata()[inside], expect_good[inside])
    assert {ln.get_label() for ln in agent_ax.get_lines()} == {"adversary_0, 1 seed", "agent_0, 1 seed",
                                                                "agent_1, 1 seed"}
    assert "team return" in team_ax.get_ylabel() and "environment steps" in team_ax.get_xlabel()
    assert not team_ax.collections  # one seed: no band


def test_the_report_names_the_report_team_and_shows_every_teams_final_return(tmp_path: Path):
    from analysis.report import build_report

    root = tmp_path / "sweep"
    write_team_run(root / "s0", 0, [1.0, 3.0, 5.0], [-1.0, -2.0, -4.0])
    write_team_run(root / "s1", 1, [2.0, 4.0, 8.0], [0.0, -2.0, -6.0])
    page = build_report(root, reps=100)
    assert "<h2>Teams and agents</h2>" in page
    assert "return is team <code>good</code>'s (the first team; teams good, adv)" in page
    # final: mean of the last 2 episodes (run.solve_window), then the mean over the two seeds
    assert "<td class=l>good (= return)</td><td>2</td><td>5.00 [4.00, 6.00]" in page  # (4 + 6) / 2
    assert "<td class=l>adv</td><td>2</td><td>-3.50 [" in page  # (-3 + -4) / 2
    assert "<td class=l>agent_1</td><td>2</td><td>2.50 [" in page
