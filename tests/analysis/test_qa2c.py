"""analysis.qa2c (``marlq qa2c``): the four Kölle variants' curves and table, at 5 seeds and at 100."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from analysis import qa2c
from analysis.plots import steps_label


def test_solve_text_lists_few_seeds_and_counts_many():
    assert qa2c.solve_text([1200.0, None, 800.0]) == "1200, -, 800"
    many = [None] * 8 + [300.0, 100.0, 200.0, 900.0]  # 12 seeds, 4 solved: median of 100, 200, 300, 900
    assert qa2c.solve_text(many) == "4 of 12 seeds (first 100, median 250)"
    assert qa2c.solve_text([None] * 11) == "0 of 11 seeds"


def test_steps_label_reads_as_people_write_steps():
    assert [steps_label(x) for x in (0, 500, 1000, 250_000, 1_000_000, 1_500_000)] == \
        ["0", "500", "1k", "250k", "1M", "1.5M"]


def _run(root: Path, name: str, critic: str, returns: list[float], length: int = 10) -> Path:
    run = root / name
    run.mkdir()
    run.joinpath("config.yaml").write_text(yaml.safe_dump({"actor": {"head": "mlp"}, "critic": {"head": critic}}))
    rows = ["t,worker,env_steps,episode,return"]
    rows += [f"{i},w0,{(i + 1) * length},{i + 1},{r}" for i, r in enumerate(returns)]
    run.joinpath("metrics.csv").write_text("\n".join(rows) + "\n")
    return run


def test_the_table_and_figure_from_twelve_seeds_against_two(tmp_path, capsys):
    """Twelve classical seeds whose returns climb to 10 + s (final trailing mean of the last 2 episodes:
    9.5 + s), two quantum-critic seeds whose trailing mean reaches the solve level 50 at steps 20 and 30."""
    runs = [_run(tmp_path, f"c{s}", "mlp", [1.0, 5.0, 9.0 + s, 10.0 + s]) for s in range(12)]
    runs += [_run(tmp_path, "q0", "hybrid", [20.0, 80.0, 60.0, 60.0]), _run(tmp_path, "q1", "hybrid", [0.0, 40.0, 60.0, 90.0])]
    out = tmp_path / "qa2c.png"
    assert qa2c.main([str(r) for r in runs] + ["--out", str(out), "--window", "2", "--solve", "50"]) == 0
    assert out.stat().st_size > 0
    text = capsys.readouterr().out
    classical = next(line for line in text.splitlines() if line.startswith("classical"))
    finals = 9.5 + np.arange(12)
    half = qa2c.band(finals[:, None])[1][0]
    assert "0 of 12 seeds" in classical
    assert f"{finals.mean():.1f} +- {half:.1f}, {np.median(finals):.1f}, {np.mean(np.sort(finals)[3:9]):.1f}" in classical
    critic = next(line for line in text.splitlines() if line.startswith("quantum critic"))
    # trailing means of 2 episodes: q0 20, 50, 70, 60 (50 first at step 20), q1 0, 20, 50, 75 (at step 30)
    assert "20, 30" in critic
