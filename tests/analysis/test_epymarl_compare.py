"""analysis/peers/epymarl_compare.py without EPyMARL: bad arguments, the marl-q side of its pairs, the curve bins."""
from __future__ import annotations

from pathlib import Path

import pytest

import json

from analysis.peers.epymarl_compare import PAIRS, ROOT, learner_curves, main, rows_curve
from marl_q.config import load_config


@pytest.mark.parametrize("argv, words", [
    ([], "say what to run"),
    (["speed", "--pairs", "lbf_mappo,nosuch"], "unknown nosuch"),
    (["speed", "--epymarl-dir", "/nonexistent"], "EPyMARL checkout"),
    (["plot", "--inputs", "x.json", "--png", "x.png", "--pairs", "lbf_qmix,nosuch"], "unknown nosuch"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, words, capsys, monkeypatch):
    monkeypatch.delenv("EPYMARL_DIR", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, words", [(["--seeds", "0,x"], "--seeds"), (["--sides", "epymarl,jax"], "--sides")])
def test_bad_seeds_or_sides_exit_2(argv, words, tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("")
    python = tmp_path / "python"
    python.write_text("")
    assert main(["returns", "--epymarl-dir", str(tmp_path), "--epymarl-python", str(python), *argv]) == 2
    assert words in capsys.readouterr().err


def test_learner_curves_read_epymarl_s_sacred_info_as_logged(tmp_path):
    """EPyMARL logs scalars as [value or {"value": ...}] beside their env steps (key + "_T")."""
    run = tmp_path / "results" / "sacred" / "qmix" / "pz-mpe-simple-spread-v3" / "1"
    run.mkdir(parents=True)
    run.joinpath("info.json").write_text(json.dumps({
        "loss": [1.5, {"value": 2.25, "dtype": "float64"}], "loss_T": [800, 10800],
        "q_taken_mean": [0.25], "q_taken_mean_T": [800], "return_mean": [-60.0], "return_mean_T": [25]}))
    assert learner_curves(tmp_path) == {"loss_curve": [[800, 1.5], [10800, 2.25]], "q_taken_mean_curve": [[800, 0.25]]}
    assert learner_curves(tmp_path / "nothing") == {}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_each_pair_runs_a_valid_marlq_config_of_its_task(pair):
    marl_file, overrides, alg, key, limit = PAIRS[pair]
    cfg = load_config(str(Path(ROOT) / marl_file), overrides)
    assert cfg.algorithm.name == alg
    if key.startswith("lbforaging"):  # marl-q's native LBF on the same task
        assert (cfg.scenario.name, cfg.scenario.engine, "lbforaging:" + cfg.scenario.task) == ("lbf", "native", key)
        assert limit == 50 and (alg != "mappo" or cfg.run.eval_every is None)
    else:  # simple_spread: N=3, 25 cycles, local_ratio 0.5, as EPyMARL's pz-mpe-simple-spread-v3 defaults
        s = cfg.scenario
        assert (s.name, s.n_agents, s.max_cycles, s.local_ratio, limit) == ("spread", 3, 25, 0.5, 25)


def test_curve_bins_are_the_mean_return_of_episodes_ending_in_each_interval():
    rows = [(50, 1.0), (10_000, 3.0), (10_050, 5.0), (25_000, 7.0)]
    assert rows_curve(rows, every=10_000) == [(10_000, 2.0), (20_000, 5.0), (30_000, 7.0)]


def test_a_pair_without_epymarl_runs_takes_those_of_the_pair_with_its_config_and_task_and_never_marlqs():
    from analysis.peers.epymarl_compare import side_runs, summarize

    runs = [{"pair": "lbf_vdn", "peer": "epymarl", "return_last": r} for r in (0.9, 0.4, 0.8)]
    runs += [{"pair": "lbf_vdn", "peer": "marl-q", "return_last": 0.0}]
    runs += [{"pair": "lbf_vdn_recipe", "peer": "marl-q", "return_last": r} for r in (0.5, 0.6)]
    runs += [{"pair": "lbf_qmix", "peer": "epymarl", "return_last": 0.1}]
    assert [g["return_last"] for g in side_runs(runs, "lbf_vdn_recipe", "epymarl")] == [0.9, 0.4, 0.8]
    assert side_runs(runs, "lbf_iql_gru", "marl-q") == []          # marl-q's side is never borrowed
    assert side_runs(runs, "lbf_iql_gru", "epymarl") == []         # no pair runs EPyMARL's iql on LBF here
    own = runs + [{"pair": "lbf_vdn_recipe", "peer": "epymarl", "return_last": 0.3}]
    assert [g["return_last"] for g in side_runs(own, "lbf_vdn_recipe", "epymarl")] == [0.3]  # its own first
    s = summarize(runs)
    assert s["lbf_vdn_recipe"]["return_epymarl"]["values"] == [0.9, 0.4, 0.8]
    assert s["lbf_vdn_recipe"]["return_marl-q"]["mean"] == pytest.approx(0.55)
    assert s["lbf_qmix"]["return_epymarl"]["values"] == [0.1] and "return_marl-q" not in s["lbf_qmix"]
