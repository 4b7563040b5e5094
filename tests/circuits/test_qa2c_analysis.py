"""The reproduction plot's statistics against brute force, and the plot from tiny run directories."""
from __future__ import annotations

import numpy as np
import yaml
from scipy import stats

from analysis.qa2c import band, main, steps_to_solve, trailing_mean_curve, variant_of


def write_run(path, returns, actor="mlp", critic="hybrid"):
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"actor": {"head": actor}, "critic": {"head": critic}}))
    steps = np.cumsum(returns)
    lines = ["t,worker,env_steps,episode,return,length,version"]
    lines += [f"0,w0,{s},{i + 1},{r},{r},0" for i, (s, r) in enumerate(zip(steps, returns))]
    (path / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_trailing_mean_and_steps_to_solve_by_brute_force(tmp_path):
    returns = [10, 20, 30, 40, 50, 60]
    write_run(tmp_path / "r", returns)
    curve = trailing_mean_curve(tmp_path / "r", window=3)
    expected = [np.mean(returns[max(0, i - 2): i + 1]) for i in range(len(returns))]
    np.testing.assert_allclose(curve.trailing, expected)
    np.testing.assert_allclose(curve.env_steps, np.cumsum(returns))
    assert steps_to_solve(curve, 40.0, 3) == 150.0  # mean(30, 40, 50) = 40 after 10+20+30+40+50 steps
    assert steps_to_solve(curve, 100.0, 3) is None
    assert variant_of(tmp_path / "r") == "quantum critic"


def test_band_is_the_95_percent_t_interval():
    values = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 7.0]])
    mean, half = band(values)
    np.testing.assert_allclose(mean, [3.0, 5.0])
    np.testing.assert_allclose(half, stats.t.ppf(0.975, 2) * np.array([2.0, np.std([2, 6, 7], ddof=1)]) / np.sqrt(3))
    assert band(values[:1])[1].tolist() == [0.0, 0.0]


def test_plot_from_run_directories(tmp_path, capsys):
    write_run(tmp_path / "a", [10, 12, 14], actor="mlp", critic="mlp")
    write_run(tmp_path / "b", [10, 30, 50], actor="hybrid", critic="hybrid")
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "p.png"), "--window", "2"]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "classical" in out and "quantum actor + critic" in out
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "q.png")]) == 2
