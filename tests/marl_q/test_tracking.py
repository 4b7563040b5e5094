"""TensorBoard (run.tensorboard / --tensorboard): the scalars read back equal the run's CSV files, the CSV
files are the same bytes with and without it, a sweep's runs are named by their grid cells, any run file
written through write_row_pair is logged without more code, and a missing package is one line, exit 2."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard", reason="needs the [tensorboard] extra (pip install 'marl-q[tensorboard]')")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer  # noqa: E402

from marl_q.cli import main  # noqa: E402
from marl_q.config import load_config  # noqa: E402
from marl_q.experiment import run_experiment  # noqa: E402
from marl_q.rundir import set_tap, write_row_pair  # noqa: E402
from marl_q.tracking import TensorBoardTracker  # noqa: E402

SPREAD = "scenarios/spread_coma.yaml"
SHORT = ["run.total_env_steps=2000", "run.eval_every=1000", "run.eval_episodes=2", "run.progress=false",
         "run.plots=false", "backend.workers=4"]


def scalars(run_dir: Path) -> dict[str, list]:
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: ea.Scalars(tag) for tag in ea.Tags()["scalars"]}


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same short COMA run on sim, with and without TensorBoard."""
    root = tmp_path_factory.mktemp("tb")
    run_experiment(load_config(SPREAD, SHORT + ["run.tensorboard=true"]), root / "on")
    run_experiment(load_config(SPREAD, SHORT), root / "off")
    return root / "on", root / "off"


def test_csv_files_are_the_same_bytes_with_and_without_tensorboard(runs):
    on, off = runs
    assert list(on.glob("events.out.tfevents.*")) and not list(off.glob("events.out.tfevents.*"))
    for name in ("metrics.csv", "comm.csv", "eval.csv", "train.csv"):
        assert (on / name).read_bytes() == (off / name).read_bytes(), name


def test_scalars_read_back_equal_the_run_files(runs):
    on, _ = runs
    tb = scalars(on)
    metrics = read_csv(on / "metrics.csv")
    ret = tb["metrics/return"]
    assert [e.step for e in ret] == [int(r["env_steps"]) for r in metrics]
    np.testing.assert_allclose([e.value for e in ret], [float(r["return"]) for r in metrics], rtol=1e-6)
    assert [e.value for e in tb["metrics/version"]] == [float(r["version"]) for r in metrics]
    evals = read_csv(on / "eval.csv")
    assert [e.step for e in tb["eval/eval_return"]] == [int(r["env_steps"]) for r in evals] == [1000, 2000]
    np.testing.assert_allclose([e.value for e in tb["eval/eval_return"]], [float(r["eval_return"]) for r in evals],
                               rtol=1e-6)
    assert not any(tag.endswith(("/t", "/env_steps", "/episode", "/id", "/seq")) for tag in tb)  # coordinates


def test_comm_totals_and_server_numbers_match_the_summary(runs):
    on, _ = runs
    tb = scalars(on)
    summary = json.loads((on / "summary.json").read_text())
    last = {tag: events[-1].value for tag, events in tb.items()}
    assert last["comm/messages_up"] + last["comm/messages_down"] == summary["messages"]
    assert last["comm/bytes_up"] == summary["bytes_up"] and last["comm/bytes_down"] == summary["bytes_down"]
    assert last["comm/rejected"] == summary["rejected"] and last["comm/dropped_stale"] == summary["dropped_stale"]
    assert last["comm/server_version"] == summary["server_version"]
    # running totals never go down, and each step is logged once
    for tag in ("comm/messages_up", "comm/bytes_down"):
        values, steps = [e.value for e in tb[tag]], [e.step for e in tb[tag]]
        assert values == sorted(values) and steps == sorted(set(steps))
    # the losses and entropy the COMA service keeps, at the end equal to what summary.json says
    for key in ("last_critic_loss", "last_actor_loss", "last_entropy", "learning_updates"):
        assert last[f"server/{key}"] == pytest.approx(summary[key], rel=1e-6)
    # mean staleness of the accepted pushes per step, recomputed from the CSV files with numpy: a message at
    # time t belongs to the env steps of the last episode row at or before t (the last one's, if later)
    metrics = read_csv(on / "metrics.csv")
    clock_t = np.array([float(r["t"]) for r in metrics])
    clock_steps = np.array([int(r["env_steps"]) for r in metrics])
    pushes = [r for r in read_csv(on / "comm.csv")
              if r["dst"] == "server" and r["staleness"] != "" and r["accepted"] == "1"]
    at = np.searchsorted(clock_t, [float(r["t"]) for r in pushes], side="right") - 1
    steps = np.where(at >= 0, clock_steps[np.maximum(at, 0)], 0)
    expected = {int(s): np.mean([float(r["staleness"]) for r, k in zip(pushes, steps) if k == s]) for s in set(steps)}
    logged = {e.step: e.value for e in tb["comm/staleness"]}
    assert logged.keys() == expected.keys() and len(logged) > 3
    for step, value in expected.items():
        assert logged[step] == pytest.approx(value, rel=1e-6)


def test_a_new_run_file_is_logged_without_more_code(tmp_path):
    """A quantum.csv-like file written through write_row_pair: each numeric column at its row's env steps;
    a row with only a time t sits at the env steps metrics.csv had reached by then (held until known)."""
    metrics_cols = ["t", "worker", "env_steps", "episode", "return"]
    tracker = TensorBoardTracker(tmp_path)
    set_tap(tmp_path, tracker)
    try:
        files = {}
        for name, cols in (("metrics", metrics_cols), ("quantum", ["t", "circuit_executions", "shots", "backend"])):
            fh, wall = open(tmp_path / f"{name}.csv", "w", newline=""), open(tmp_path / f"{name}_wall.csv", "w")
            w = csv.writer(fh)
            w.writerow(cols)
            fh.flush()
            files[name] = (fh, w, wall, csv.writer(wall))

        def write(name, rows):
            fh, w, wall, ww = files[name]
            write_row_pair(fh, w, rows, wall, ww, [[0]] * len(rows))
        write("metrics", [[0.5, "w0", 10, 1, -3.0], [1.0, "w1", 20, 2, -2.0]])
        write("quantum", [[0.2, 4, 400, "sim"], [1.0, 7, 700, "sim"], [1.5, 9, 900, "sim"]])  # t=1.5: not yet known
        write("metrics", [[2.0, "w0", 30, 3, -1.0]])
        write("quantum", [[2.5, 11, 1100, "sim"]])  # after the last episode: placed at the end
    finally:
        set_tap(tmp_path, None)
        tracker.close()
        for fh, _, wall, _ in files.values():
            fh.close()
            wall.close()
    tb = scalars(tmp_path)
    assert [(e.step, e.value) for e in tb["quantum/shots"]] == [(0, 400), (20, 700), (20, 900), (30, 1100)]
    assert [(e.step, e.value) for e in tb["quantum/circuit_executions"]] == [(0, 4), (20, 7), (20, 9), (30, 11)]
    assert [(e.step, e.value) for e in tb["metrics/return"]] == [(10, -3.0), (20, -2.0), (30, -1.0)]
    assert "quantum/backend" not in tb and "quantum/t" not in tb


def test_sweep_logdir_lists_every_run_by_its_grid_cell(tmp_path):
    out = tmp_path / "sweep"
    # 300 steps (12 episodes of 25, one update) and no per-run plots (--no-plot is the sweep's own figure; a
    # run's plots import matplotlib and scipy in each process): what is checked is each run's logdir by its cell
    short = ["run.total_env_steps=300", "run.plots=false", "run.progress=false", "backend.workers=2"]
    code = main(["sweep", SPREAD, "--seeds", "1", "--grid", "algorithm.name=coma,iac", "--jobs", "2", "--no-plot",
                 "--out", str(out), "--tensorboard"] + [x for s in short for x in ("--set", s)])
    assert code == 0
    mux = EventMultiplexer().AddRunsFromDirectory(str(out))
    mux.Reload()
    # one seed: a cell's seed is a folder of its own all the same (a second seed would be 2 more processes)
    assert set(mux.Runs()) == {f"algorithm.name={a}/seed0" for a in ("coma", "iac")}
    for run in mux.Runs():
        assert "metrics/return" in mux.GetAccumulator(run).Tags()["scalars"]


@pytest.mark.parametrize("argv", [["run", SPREAD, "--tensorboard"], ["run", SPREAD, "--set", "run.tensorboard=true"],
                                  ["sweep", SPREAD, "--tensorboard", "--seeds", "1"]])
def test_tensorboard_asked_for_but_not_installed_is_one_line_exit_2(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were absent
    code = main(argv + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("marlq: error: run.tensorboard: the tensorboard package is not installed")
    assert "marl-q[tensorboard]" in err[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_resume_from_an_older_checkpoint_leaves_one_value_per_row(tmp_path):
    """Rows after the checkpoint are cut from metrics.csv on resume; TensorBoard drops what the first
    session logged after it (purge_step), so the scalars read back equal the CSV file again."""
    from marl_q.experiment import resume_experiment
    from marl_q.rundir import checkpoints

    out = tmp_path / "run"
    cfg = load_config(SPREAD, SHORT + ["run.tensorboard=true", "run.checkpoint_every=2", "run.keep_checkpoints=10",
                                       "run.stop_after_updates=6", "run.eval_every=null"])
    assert run_experiment(cfg, out)["status"] == "stopped"
    first = scalars(out)["metrics/return"]
    older = checkpoints(out)[0]
    resume_experiment(out, checkpoint=older, plots=False)
    metrics = read_csv(out / "metrics.csv")
    ret = scalars(out)["metrics/return"]
    assert len(list(out.glob("events.out.tfevents.*"))) == 2 and max(e.step for e in first) > min(
        int(r["env_steps"]) for r in metrics[len(metrics) // 2:])
    assert [e.step for e in ret] == [int(r["env_steps"]) for r in metrics]
    np.testing.assert_allclose([e.value for e in ret], [float(r["return"]) for r in metrics], rtol=1e-6)
    # the running totals go on from the checkpoint's (read back from comm.csv), not from zero
    summary = json.loads((out / "summary.json").read_text())
    tb = scalars(out)
    assert tb["comm/messages_up"][-1].value + tb["comm/messages_down"][-1].value == summary["messages"]
    assert tb["comm/bytes_up"][-1].value == summary["bytes_up"]
    steps = [e.step for e in tb["comm/bytes_up"]]
    assert steps == sorted(steps)
