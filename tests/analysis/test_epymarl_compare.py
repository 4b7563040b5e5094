"""analysis/peers/epymarl_compare.py without EPyMARL: bad arguments, the marl-q side of its pairs, the curve bins."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.peers.epymarl_compare import PAIRS, ROOT, main, rows_curve
from marl_q.config import load_config


@pytest.mark.parametrize("argv, words", [
    ([], "say what to run"),
    (["speed", "--pairs", "lbf_mappo,nosuch"], "unknown nosuch"),
    (["speed", "--epymarl-dir", "/nonexistent"], "EPyMARL checkout"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, words, capsys, monkeypatch):
    monkeypatch.delenv("EPYMARL_DIR", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_bad_seeds_exit_2(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("")
    python = tmp_path / "python"
    python.write_text("")
    assert main(["returns", "--epymarl-dir", str(tmp_path), "--epymarl-python", str(python), "--seeds", "0,x"]) == 2
    assert "--seeds" in capsys.readouterr().err


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_each_pair_runs_a_valid_marlq_config_of_its_task(pair):
    marl_file, overrides, alg, key, limit = PAIRS[pair]
    if key.startswith("lbforaging"):
        pytest.importorskip("lbforaging", reason="needs the [epymarl-envs] extra")
    cfg = load_config(str(Path(ROOT) / marl_file), overrides)
    assert cfg.algorithm.name == alg
    if key.startswith("lbforaging"):
        assert (cfg.scenario.name, cfg.scenario.env) == ("gymnasium", key)
        assert cfg.run.eval_every is None
    else:  # simple_spread: N=3, 25 cycles, local_ratio 0.5, as EPyMARL's pz-mpe-simple-spread-v3 defaults
        s = cfg.scenario
        assert (s.name, s.n_agents, s.max_cycles, s.local_ratio, limit) == ("spread", 3, 25, 0.5, 25)


def test_curve_bins_are_the_mean_return_of_episodes_ending_in_each_interval():
    rows = [(50, 1.0), (10_000, 3.0), (10_050, 5.0), (25_000, 7.0)]
    assert rows_curve(rows, every=10_000) == [(10_000, 2.0), (20_000, 5.0), (30_000, 7.0)]
