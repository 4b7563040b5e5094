"""run.eval_every: greedy evaluations during training, written to eval.csv, without changing the run."""
from __future__ import annotations

import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.evaluation import FIELDS, eval_row, read_eval_csv
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.seeding import derive

SPREAD = {"run": {"seed": 0, "total_env_steps": 2400, "progress": False, "plots": False},
          "backend": {"name": "sim", "workers": 1},
          "scenario": {"name": "spread", "max_cycles": 10},
          "algorithm": {"name": "mappo", "envs_per_worker": 4, "n_steps": 10, "epochs": 2}}


def _with_eval(raw: dict, every: int, episodes: int) -> dict:
    raw = copy.deepcopy(raw)
    raw["run"].update(eval_every=every, eval_episodes=episodes)
    return raw


@pytest.mark.parametrize("raw", [SPREAD, "cartpole"], ids=["mappo-spread", "a3c-cartpole"])
def test_eval_rows_land_every_eval_every_steps_and_leave_the_run_unchanged(raw, small_raw, tmp_path: Path):
    raw = copy.deepcopy(small_raw if raw == "cartpole" else raw)
    run_experiment(build_config(raw), tmp_path / "plain")
    run_experiment(build_config(_with_eval(raw, 800, 3)), tmp_path / "eval")
    for name in ("metrics.csv", "comm.csv"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "eval" / name).read_bytes(), name
    rows = read_eval_csv(tmp_path / "eval" / "eval.csv")
    assert (tmp_path / "eval" / "eval.csv").read_text().splitlines()[0] == ",".join(FIELDS)
    steps = [int(r["env_steps"]) for r in rows]
    assert len(rows) == raw["run"]["total_env_steps"] // 800
    # one row each time the budget crosses a multiple of eval_every (the first step count at or past it)
    assert all(k * 800 <= s < (k + 1) * 800 for k, s in enumerate(steps, start=1))
    assert all(r["episodes"] == 3 and r["eval_min"] <= r["eval_return"] <= r["eval_max"] for r in rows)


def test_the_actor_critic_evaluation_is_a_greedy_replay(small_raw, tmp_path: Path):
    """The evaluation's returns equal a greedy CartPole replay written here from the final actor."""
    raw = _with_eval(small_raw, 1200, 4)
    run_experiment(build_config(raw), tmp_path / "run")
    row = read_eval_csv(tmp_path / "run" / "eval.csv")[-1]
    from marl_q.rundir import load_trained

    policy = load_trained(tmp_path / "run")
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point", max_episode_steps=500)
    obs, _ = env.reset(seed=derive(0, "eval", 1))
    ret, prev, done_returns = np.zeros(4), np.zeros(4, bool), []
    while len(done_returns) < 4:
        acts = policy.act({f"e{i}": obs[i].astype(np.float32) for i in range(4)})
        obs, r, term, trunc, _ = env.step(np.array([acts[f"e{i}"] for i in range(4)]))
        ret += np.where(~prev, r, 0.0)
        prev = term | trunc
        for i in np.flatnonzero(prev):
            done_returns.append(ret[i])
            ret[i] = 0.0
    assert row == pytest.approx(eval_row(row["t"], int(row["env_steps"]), int(row["updates"]), done_returns[:4]))


def test_resume_cuts_eval_rows_after_the_checkpoint(tmp_path: Path):
    raw = _with_eval(SPREAD, 400, 2)
    raw["run"]["checkpoint_every"] = 2
    raw["run"]["stop_after_updates"] = 3
    out = tmp_path / "run"
    run_experiment(build_config(raw), out)
    before = read_eval_csv(out / "eval.csv")
    (out / "eval.csv").open("a").write("0.0,999999,99,2,1.0,0.0,1.0,1.0\n")  # a row from "after" the checkpoint
    resume_experiment(out)
    rows = read_eval_csv(out / "eval.csv")
    assert all(r["env_steps"] != 999999 for r in rows)
    assert rows[: len(before)] == before
    full = tmp_path / "full"
    raw["run"]["stop_after_updates"] = None
    run_experiment(build_config(raw), full)
    assert [r["eval_return"] for r in rows] == [r["eval_return"] for r in read_eval_csv(full / "eval.csv")]


def test_eval_every_needs_an_algorithm_that_can_evaluate():
    raw = {"run": {"total_episodes": 10, "eval_every": 100}, "scenario": {"name": "linear_mdp"},
           "algorithm": {"name": "async_coop_lsvi"}}
    with pytest.raises(ConfigError, match="run.eval_every: algorithm 'async_coop_lsvi' has no evaluation"):
        build_config(raw)
    with pytest.raises(ConfigError, match="run.eval_every: must be positive"):
        build_config(_with_eval(SPREAD, 0, 2))
    with pytest.raises(ConfigError, match="run.eval_episodes: must be at least 1"):
        build_config(_with_eval(SPREAD, 100, 0))


def test_evaluation_shows_progress(tmp_path: Path, capsys):
    raw = _with_eval(SPREAD, 1200, 30)
    raw["run"]["progress"] = True
    run_experiment(build_config(raw), tmp_path / "run")
    err = capsys.readouterr().err
    assert "eval" in err and "ep" in err


def test_cutting_eval_csv_keeps_the_bytes_before_the_first_later_row(tmp_path: Path):
    """A resume cuts eval.csv back as it cuts the other run files: the rows at or before the checkpoint's
    env steps are kept byte for byte, and the next row written continues after them."""
    from marl_q.evaluation import EvalWriter, cut_eval_csv

    path = tmp_path / "eval.csv"
    writer = EvalWriter(path)
    for steps in (100, 200, 300):
        writer.write(eval_row(0.5 * steps, steps, steps // 100, [1.0, 2.5]))
    text = path.read_bytes()
    lines = text.splitlines(keepends=True)
    assert lines[0] == (",".join(FIELDS) + "\r\n").encode() and len(lines) == 4
    assert lines[1] == b"50.0,100,1,2,1.75,1.0606601717798212,1.0,2.5\r\n"
    cut_eval_csv(path, 200)
    assert path.read_bytes() == b"".join(lines[:3])
    EvalWriter(path).write(eval_row(125.0, 250, 2, [3.0]))
    assert [r["env_steps"] for r in read_eval_csv(path)] == [100, 200, 250]
    cut_eval_csv(path, 50)
    assert path.read_bytes() == lines[0]  # the header only
    cut_eval_csv(tmp_path / "none.csv", 10)  # no file: nothing to cut
    assert not (tmp_path / "none.csv").exists()
