"""The progress bar (marl_q.progress): no rate and no ETA until one is measured, measured from the first
progress on (a local run's process start-up is not a rate), and it is the one bar every loop uses."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

import marl_q
from marl_q.progress import _bar_class, progress_bar


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr("tqdm.std.time", c)  # each bar reads its clock through this name
    return c


def eta(bar) -> str:
    """The ETA field of a bar's line: [elapsed<ETA, rate]."""
    return re.search(r"\[[^<\]]*<([^,\]]*)", str(bar)).group(1)


def test_no_eta_before_a_rate_and_the_wait_before_the_first_update_is_not_a_rate(clock):
    bar = progress_bar(total=100_000, unit="step", file=io.StringIO(), mininterval=0)
    assert eta(bar) == "?"
    clock.now += 23.0  # the workers start (process spawn, imports): 40 steps arrive after 23 s
    bar.update(40)
    assert eta(bar) == "?" and "?step/s" in str(bar)  # tqdm alone: 40 / 23 s -> ETA 16:00:00
    clock.now += 1.0
    bar.update(1000)  # 1000 steps in the second since the first update: 1000 steps/s
    assert eta(bar) == "01:38"  # (100000 - 1040) / 1000 s
    assert "[00:24<" in str(bar)  # elapsed still counts from the start
    bar.close()


def test_a_bar_whose_count_is_set_directly_measures_from_the_first_count_it_shows(clock):
    bar = progress_bar(total=10_000, unit="step", file=io.StringIO())  # the ray driver sets bar.n
    clock.now += 40.0  # ray starting
    bar.n = 500
    assert eta(bar) == "?"
    clock.now += 2.0
    bar.n = 2500
    assert eta(bar) == "00:07"  # (10000 - 2500) / 1000 per s
    bar.close()


def test_a_resumed_bar_measures_from_its_first_new_progress(clock):
    bar = progress_bar(total=1000, initial=600, file=io.StringIO(), mininterval=0)
    clock.now += 30.0
    bar.update(10)
    assert eta(bar) == "?"
    clock.now += 1.0
    bar.update(10)
    assert eta(bar) == "00:38"  # (1000 - 620) / 10 per s
    bar.close()


def test_every_bar_in_marl_q_is_the_measured_one():
    """run (sim and local backends), the ray driver, evaluation and sweeps: one implementation."""
    root = Path(marl_q.__file__).parent
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if re.search(r"^\s*(from tqdm|import tqdm)", p.read_text(), re.M))
    assert users == ["progress.py"]
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "progress_bar(" in p.read_text())
    assert callers == ["backends/ray_backend.py", "cli.py", "evaluation.py", "progress.py", "runtime.py"]
    from marl_q.evaluation import EvalProgress

    ev = EvalProgress(total=3, enabled=True)
    assert isinstance(ev.bar, _bar_class())
    ev.close()


def test_a_pool_of_runs_begun_together_measures_from_the_start(clock):
    """A sweep's runs start at once: two finishing a second apart after 60 s are 2 runs a minute, not 1 a second."""
    bar = progress_bar(rate_from="start", total=6, file=io.StringIO(), mininterval=0)
    clock.now += 60.0
    bar.update(1)
    assert eta(bar) == "05:00"  # 1 run per 60 s since the start, 5 to go
    clock.now += 1.0
    bar.update(1)
    assert eta(bar) == "02:02"  # 2 runs in 61 s, 4 to go
    bar.close()
    with pytest.raises(ValueError, match="rate_from"):
        progress_bar(rate_from="end")


def test_scenario_label_names_the_env_a_generic_scenario_loads():
    from marl_q.config import scenario_label

    assert scenario_label("gymnasium", "Pendulum-v1") == "gymnasium Pendulum-v1"
    assert scenario_label("pettingzoo", "mpe2.simple_reference_v3:parallel_env") == "pettingzoo mpe2.simple_reference_v3"
    assert scenario_label("pettingzoo", "mypkg.env:make") == "pettingzoo mypkg.env:make"
    assert scenario_label("cartpole", None) == "cartpole"


def test_a_runs_progress_bar_names_the_algorithm_and_the_env(tmp_path, capsys):
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment

    cfg = load_config("scenarios/pendulum_ppo.yaml", ["run.total_env_steps=400", "scenario.num_envs=1",
                                                      "algorithm.n_steps=200", "algorithm.minibatches=4",
                                                      "run.plots=false", "run.eval_every=null"])
    run_experiment(cfg, tmp_path / "run")
    assert "ppo on gymnasium Pendulum-v1" in capsys.readouterr().err
