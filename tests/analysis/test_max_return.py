"""analysis.stats.maximum_return and analysis.max_return (the LBF paper's table figures), by hand."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from analysis import max_return
from analysis.stats import maximum_return


def test_maximum_return_is_the_step_with_the_best_mean_over_seeds_and_its_t_interval():
    evals = np.array([[0.1, 0.9, 0.5],
                      [0.2, 0.5, 0.6],
                      [0.3, 0.7, 0.7]])  # means 0.2, 0.7, 0.6: the second step, though seed 0 peaks there alone
    step, mean, half = maximum_return(evals)
    assert step == 1 and mean == pytest.approx(0.7)
    # sd of (0.9, 0.5, 0.7) = 0.2; t(0.975, 2) = 4.302653: half = 4.302653 * 0.2 / sqrt(3)
    assert half == pytest.approx(4.302653 * 0.2 / np.sqrt(3), rel=1e-6)
    assert maximum_return(np.array([[0.4, 0.4]]))[0] == 0  # ties: the first
    with pytest.raises(ValueError, match="matrix"):
        maximum_return(np.zeros(3))


def _run(path, algorithm, evals, returns):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"name": algorithm}}))
    (path / "eval.csv").write_text("t,env_steps,eval_return\n" + "".join(
        f"0,{(k + 1) * 1000},{v}\n" for k, v in enumerate(evals)))
    (path / "metrics.csv").write_text("env_steps,return\n" + "".join(f"{k},{r}\n" for k, r in enumerate(returns)))


def test_table_groups_by_the_key_and_compares_runs_over_the_steps_all_reached(tmp_path, capsys):
    _run(tmp_path / "a0", "mappo", [0.2, 0.8, 0.1], [0.0, 1.0, 1.0])
    _run(tmp_path / "a1", "mappo", [0.4, 0.6], [0.5, 0.5, 0.0])   # stopped one evaluation early
    _run(tmp_path / "b0", "ippo", [0.3], [1.0])
    rows = max_return.table(sorted(tmp_path.iterdir()), "algorithm.name", last=2)
    assert [r["group"] for r in rows] == ["mappo", "ippo"]
    mappo = rows[0]
    assert mappo["best_step"] == 2000 and mappo["per_seed"] == [0.8, 0.6] and mappo["max_return"] == pytest.approx(0.7)
    assert mappo["last_per_seed"] == [1.0, 0.25] and mappo["last"] == pytest.approx(0.625)
    assert rows[1]["seeds"] == 1 and rows[1]["max_return_ci"] == 0.0
    assert max_return.main([str(tmp_path / "*")]) == 0
    assert "| mappo | 2 | 0.700 ±" in capsys.readouterr().out


def test_bad_input_exits_2_naming_what_was_wrong(tmp_path, capsys):
    assert max_return.main([str(tmp_path / "nothing")]) == 2
    assert "not run directories" in capsys.readouterr().err
    _run(tmp_path / "a0", "mappo", [], [0.0])
    assert max_return.main([str(tmp_path / "a0")]) == 2
    assert "no evaluation" in capsys.readouterr().err


def test_compressed_run_files_are_read_as_plain_ones(tmp_path):
    """run.compress_logs writes eval.csv.gz and metrics.csv.gz: the same figures as the plain files."""
    import gzip
    _run(tmp_path / "plain", "mappo", [0.2, 0.8], [0.0, 1.0, 0.5])
    _run(tmp_path / "packed", "mappo", [0.2, 0.8], [0.0, 1.0, 0.5])
    for name in ("eval.csv", "metrics.csv"):
        path = tmp_path / "packed" / name
        path.with_name(name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    plain, packed = (max_return.table([tmp_path / d], "algorithm.name", last=2)[0] for d in ("plain", "packed"))
    assert plain == {**packed, "group": plain["group"]} and packed["per_seed"] == [0.8]
