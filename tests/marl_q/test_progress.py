"""The progress bar (marl_q.progress): no rate and no ETA until one is measured, measured from the first
progress on (a local run's process start-up is not a rate), and it is the one bar every loop uses."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

import marl_q
from marl_q.progress import RunProgress, _bar_class, progress_bar


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
    assert callers == ["progress.py"]  # every bar is a Progress (a run's budget: RunProgress)
    bars = sorted(f"{p.relative_to(root)}:{m}" for p in root.rglob("*.py")
                  for m in re.findall(r"^class (\w*(?:Progress|Bar)\w*)", p.read_text(), re.M))
    assert bars == ["progress.py:Progress", "progress.py:RunProgress"]
    from marl_q.evaluation import eval_progress

    with eval_progress(total=3, enabled=True) as ev:
        assert isinstance(ev.bar, _bar_class())
    assert ev.bar is None
    off = eval_progress(total=3, enabled=False)
    assert off.bar is None
    off.update(1)  # nothing drawn, nothing raised
    off.close()


def test_a_runs_bar_counts_steps_and_shows_the_recent_return_and_the_version(clock, monkeypatch):
    """RunProgress: what the runtime advances by each Work and the ray driver sets from the server's counts."""
    from types import SimpleNamespace

    monkeypatch.setattr("marl_q.progress.time.perf_counter", clock)  # the once-a-second redraw of the postfix

    cfg = SimpleNamespace(run=SimpleNamespace(total_env_steps=1000, total_episodes=None),
                          scenario=SimpleNamespace(name="cartpole", params=SimpleNamespace()),
                          algorithm=SimpleNamespace(name="a3c"))
    fp = io.StringIO()
    bar = RunProgress(cfg, env_steps=100, suffix=" (ray)", file=fp, mininterval=0)
    assert bar.bar.desc == "a3c on cartpole (ray)" and bar.bar.n == 100
    bar.advance(50, [{"return": 10.0}, {"length": 3}, {"return": 20.0}], version=7)
    assert bar.bar.n == 150
    assert "ret=15.0" in str(bar.bar) and "v=7" in str(bar.bar)
    bar.eval_return = 42.0
    clock.now += 2.0
    bar.advance(10, [], version=8)
    assert "eval=42.0" in str(bar.bar) and "v=8" in str(bar.bar)
    bar.show(env_steps=600, episodes=9, version=9)  # counts read from elsewhere
    assert bar.bar.n == 600 and "v=9" in str(bar.bar)
    bar.close()
    by_episodes = RunProgress(SimpleNamespace(**{**vars(cfg), "run": SimpleNamespace(total_env_steps=None,
                                                                                    total_episodes=20)}), file=fp)
    by_episodes.advance(500, [{"return": 1.0}, {"return": 2.0}], version=1)
    assert by_episodes.bar.n == 2 and by_episodes.bar.total == 20
    by_episodes.close()


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
