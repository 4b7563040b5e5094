"""Meyer et al.'s sample-complexity estimator, its cluster-bootstrap interval and outperformance test, IQM
and P(improvement) (`analysis.sample_complexity`), and `marlq compare` / `marlq report` on run directories
written by hand (no training)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import sample_complexity as sc
from analysis.stats import iqm
from marl_q.cli import main
from tests.analysis.test_plots import config, write_run

STEPS = np.arange(1, 201) * 10.0  # evaluation points 10 .. 2000 env steps


def step_curves(hit_steps: np.ndarray, steps: np.ndarray = STEPS, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    """(runs, points): ``low`` before each run's hitting step, ``high`` from it on (inf: never)."""
    return np.where(steps[None, :] >= np.asarray(hit_steps, dtype=float)[:, None], high, low)


def hitting_steps(rng: np.random.Generator, runs: int, scale: float, steps: np.ndarray = STEPS) -> np.ndarray:
    """Exponential hitting times rounded up to the next evaluation point (inf past the last)."""
    t = rng.exponential(scale, runs)
    idx = np.searchsorted(steps, t, side="left")
    return np.where(idx < len(steps), steps[np.minimum(idx, len(steps) - 1)], np.inf)


# ----------------------------------------------------------------------------- the estimator
@pytest.mark.parametrize("delta", [0.05, 0.25, 0.5, 0.6, 0.75, 0.9, 0.97])
def test_step_curves_give_the_delta_quantile_of_the_hitting_steps(delta):
    rng = np.random.default_rng(3)
    tau = rng.choice(STEPS, size=37)
    tau[:4] = np.inf  # four runs never reach the level
    got = sc.sample_complexity(STEPS, step_curves(tau), epsilon=0.1, delta=delta, optimum=1.0)
    want = np.quantile(tau, delta, method="inverted_cdf")  # the smallest t with F(t) >= delta
    assert got == want
    if delta > 33 / 37:
        assert got == np.inf  # more than the 33 reaching runs would be needed: not reached


# 5 runs x 6 evaluation points; level (1 - 0.2) * 100 = 80, strictly exceeded
FIVE_STEPS = np.array([1000, 2000, 3000, 4000, 5000, 6000])
FIVE = np.array([[10, 50, 85, 90, 95, 100],       # above from 3000 on
                 [0, 81, 79, 82, 90, 99],         # above at 2000, below at 3000, above from 4000
                 [20, 30, 40, 60, 85, 90],        # above from 5000
                 [80, 80, 80, 81, 70, 95],        # 80 is not above 80: above at 4000 and 6000
                 [np.nan, 5, 10, 20, 30, 40]],    # never (NaN: no value yet)
                dtype=float)
# above-level counts per point: 0, 1, 1, 3, 3, 4 of 5 -> fractions 0, .2, .2, .6, .6, .8


@pytest.mark.parametrize("delta, want", [(0.1, 2000), (0.2, 2000), (0.21, 4000), (0.5, 4000), (0.6, 4000),
                                         (0.7, 6000), (0.8, 6000), (0.81, np.inf), (0.99, np.inf)])
def test_hand_computation_on_five_runs(delta, want):
    assert sc.sample_complexity(FIVE_STEPS, FIVE, epsilon=0.2, delta=delta, optimum=100.0) == want
    # the same with a baseline: level 20 + 0.8 * (120 - 20) = 100, returns shifted by 20
    assert sc.sample_complexity(FIVE_STEPS, FIVE + 20, 0.2, delta, optimum=120.0, baseline=20.0) == want
    # evaluation episodes (the clusters' members) are averaged first; a NaN episode is left out
    episodes = np.stack([FIVE - 3, FIVE + 3, FIVE], axis=2)
    episodes[0, 2, 2] = np.nan
    assert sc.sample_complexity(FIVE_STEPS, episodes, 0.2, delta, optimum=100.0) == want


def test_hand_computation_fractions():
    hits = sc.above_level(FIVE, 0.2, 100.0)
    np.testing.assert_allclose(hits.mean(axis=0), [0, 0.2, 0.2, 0.6, 0.6, 0.8])


def test_bad_epsilon_delta_and_shapes_raise():
    with pytest.raises(ValueError, match="epsilon: must be in"):
        sc.sample_complexity(FIVE_STEPS, FIVE, epsilon=1.0, delta=0.5, optimum=100.0)
    with pytest.raises(ValueError, match="delta: must be in"):
        sc.sample_complexity(FIVE_STEPS, FIVE, epsilon=0.1, delta=0.0, optimum=100.0)
    with pytest.raises(ValueError, match="steps"):
        sc.sample_complexity(FIVE_STEPS[:5], FIVE, epsilon=0.1, delta=0.5, optimum=100.0)
    with pytest.raises(ValueError, match="above baseline"):
        sc.sample_complexity(FIVE_STEPS, FIVE, epsilon=0.1, delta=0.5, optimum=0.0, baseline=1.0)


# ----------------------------------------------------------------------------- the bootstrap
def test_bootstrap_resamples_whole_runs():
    rng = np.random.default_rng(0)
    counts = sc.bootstrap_counts(7, 50, rng)
    assert counts.shape == (50, 7) and np.all(counts.sum(axis=1) == 7)
    hits = np.zeros((7, 4), dtype=bool)
    hits[:3, 1:] = True  # three runs above from point 1 on: every draw's fraction is a multiple of 1/7
    fractions = sc.bootstrap_fractions(hits, 50, np.random.default_rng(0))
    np.testing.assert_allclose(fractions, counts @ hits / 7)
    assert np.all(fractions[:, 0] == 0) and np.all(fractions[:, 1] == fractions[:, 3])


def test_interval_covers_the_truth():
    """Hitting times Exponential(500): the true median, rounded up to the evaluation grid, is 350."""
    truth = STEPS[np.searchsorted(STEPS, 500 * np.log(2))]
    rng = np.random.default_rng(2025)
    est = sc.sample_complexity_ci(STEPS, step_curves(hitting_steps(rng, 100, 500.0)), 0.1, 0.5, 1.0, rng, reps=1000)
    assert est.low <= truth <= est.high and est.low <= est.value <= est.high
    assert est.high - est.low < 300  # and it is informative, not [0, inf]
    covered = 0
    for _ in range(40):  # the 90% interval's coverage over 40 data sets
        ci = sc.sample_complexity_ci(STEPS, step_curves(hitting_steps(rng, 100, 500.0)), 0.1, 0.5, 1.0, rng, reps=400)
        covered += ci.low <= truth <= ci.high
    assert covered >= 32


def test_interval_is_deterministic_for_a_generator_seed_and_keeps_not_reached():
    tau = np.r_[np.full(5, 100.0), np.full(5, np.inf)]  # half the runs never reach
    a = sc.sample_complexity_ci(STEPS, step_curves(tau), 0.1, 0.5, 1.0, np.random.default_rng(1), reps=500)
    b = sc.sample_complexity_ci(STEPS, step_curves(tau), 0.1, 0.5, 1.0, np.random.default_rng(1), reps=500)
    assert a == b
    assert a.value == 100.0 and a.low == 100.0 and a.high == np.inf and a.reached


# ----------------------------------------------------------------------------- outperformance
def test_clearly_faster_configuration_outperforms():
    rng = np.random.default_rng(7)
    fast, slow = (step_curves(hitting_steps(rng, 60, scale)) for scale in (150.0, 600.0))
    a = sc.sample_complexity_ci(STEPS, fast, 0.1, 0.5, 1.0, rng, reps=1000)
    b = sc.sample_complexity_ci(STEPS, slow, 0.1, 0.5, 1.0, rng, reps=1000)
    assert a.high < b.low
    assert sc.outperforms(a, b) and not sc.outperforms(b, a)
    assert sc.verdict(a, b) == 1 and sc.verdict(b, a) == -1


def test_equal_data_gives_no_verdict():
    rng = np.random.default_rng(8)
    same = step_curves(hitting_steps(rng, 60, 400.0))
    a = sc.sample_complexity_ci(STEPS, same, 0.1, 0.5, 1.0, rng, reps=1000)
    b = sc.sample_complexity_ci(STEPS, same, 0.1, 0.5, 1.0, rng, reps=1000)
    assert sc.verdict(a, b) == 0
    other = step_curves(hitting_steps(rng, 60, 400.0))  # a second sample of the same distribution
    c = sc.sample_complexity_ci(STEPS, other, 0.1, 0.5, 1.0, rng, reps=1000)
    assert sc.verdict(a, c) == 0


def test_never_reaching_configuration_is_outperformed_by_one_that_reaches():
    reaches = sc.Estimate(500.0, 400.0, 700.0)
    never = sc.Estimate(np.inf, np.inf, np.inf)
    partly = sc.Estimate(np.inf, 900.0, np.inf)
    assert sc.verdict(reaches, never) == 1 and sc.verdict(reaches, partly) == 1
    assert sc.verdict(never, never) == 0 and sc.verdict(partly, never) == 0


# ----------------------------------------------------------------------------- IQM, P(improvement)
def test_probability_of_improvement_is_the_pair_count_with_ties_half():
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 6, 23).astype(float), rng.integers(1, 7, 31).astype(float)
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    est = sc.probability_of_improvement_ci(x, y, np.random.default_rng(0), reps=500)
    assert est.value == pytest.approx(wins / (len(x) * len(y)))
    assert est.low <= est.value <= est.high and 0.0 <= est.low and est.high <= 1.0
    assert sc.probability_of_improvement_ci(x, x, np.random.default_rng(0), reps=200).value == 0.5
    again = sc.probability_of_improvement_ci(x, y, np.random.default_rng(0), reps=500)
    assert again == est


def test_iqm_interval():
    scores = np.r_[np.arange(20.0), [np.nan]]  # NaN (a run without a final value) is left out
    est = sc.iqm_ci(scores, np.random.default_rng(0), reps=500)
    assert est.value == pytest.approx(iqm(np.arange(20.0))) == pytest.approx(np.mean(np.arange(5.0, 15.0)))
    assert est.low < est.value < est.high


# ----------------------------------------------------------------------------- marlq compare
def write_group(root: Path, actor: str, hits: list[float], episodes: int = 40, every: int = 50) -> list[Path]:
    """One run per hitting step: return 20 before it, 500 from it on; one episode every ``every`` steps,
    trailing window 1 (the curve is the episode returns)."""
    steps = np.arange(1, episodes + 1) * every
    return [write_run(root / f"actor.head={actor}" / f"seed{i}", config("a2c", i, actor=actor, window=1),
                      np.where(steps >= h, 500.0, 20.0), steps) for i, h in enumerate(hits)]


FAST = [100, 150, 150, 200, 250, 300, 300, 350, 400, 450, 500, 500]
SLOW = [900, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900, 1950]


def test_compare_end_to_end(tmp_path, capsys):
    write_group(tmp_path / "sweep", "mlp", FAST)
    write_group(tmp_path / "sweep", "vqc", SLOW)
    out = tmp_path / "figs"
    assert main(["compare", str(tmp_path / "sweep"), "--out", str(out), "--reps", "500"]) == 0
    text = capsys.readouterr().out
    numbers = json.loads((out / "sample_complexity.json").read_text())
    by = {g["label"]: g for g in numbers["groups"]}
    # level (1 - 0.1) * 500 (the best episode return) = 450; delta 0.5: the 6th of 12 hitting steps
    assert numbers["level"] == 450.0 and numbers["optimum"] == 500.0
    assert by["mlp"]["sample_complexity"]["value"] == np.quantile(FAST, 0.5, method="inverted_cdf") == 300
    assert by["vqc"]["sample_complexity"]["value"] == np.quantile(SLOW, 0.5, method="inverted_cdf") == 1400
    assert by["mlp"]["runs"] == by["vqc"]["runs"] == 12
    assert by["mlp"]["iqm_final"]["value"] == 500.0
    assert numbers["pairs"] == [{"a": "mlp", "b": "vqc", "p_improvement": {"value": 0.5, "low": 0.5, "high": 0.5},
                                 "verdict": 1}]
    assert "mlp outperforms vqc" in text and "300 [" in text and "1,400 [" in text
    png = out / "sample_complexity.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_arguments_as_globs_and_one_group_per_argument(tmp_path, capsys):
    # the same config in two folders: grouping by config gives one group, so each argument is one
    write_group(tmp_path / "a", "mlp", FAST[:4])
    write_group(tmp_path / "b", "mlp", SLOW[:4])
    out = tmp_path / "figs"
    a, b = str(tmp_path / "a" / "*" / "seed*"), str(tmp_path / "b")
    assert main(["compare", a, b, "--out", str(out), "--reps", "200", "--delta", "0.75",
                 "--optimum", "500", "--epsilon", "0.2"]) == 0
    numbers = json.loads((out / "sample_complexity.json").read_text())
    assert [g["label"] for g in numbers["groups"]] == [a, b]
    want = [np.quantile(h, 0.75, method="inverted_cdf") for h in (FAST[:4], SLOW[:4])]  # the 3rd of 4
    assert [g["sample_complexity"]["value"] for g in numbers["groups"]] == want == [150, 1100]
    assert numbers["level"] == 400.0


def test_compare_says_not_reached(tmp_path, capsys):
    write_group(tmp_path / "s", "mlp", FAST[:4])
    write_group(tmp_path / "s", "vqc", [np.inf] * 4)
    assert main(["compare", str(tmp_path / "s"), "--reps", "200"]) == 0
    text = capsys.readouterr().out
    assert "not reached by 2,000" in text and "mlp outperforms vqc" in text
    assert (tmp_path / "s" / "plots" / "sample_complexity.png").is_file()


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("marlq compare: error: ")
    return err[0]


@pytest.mark.parametrize("extra, said", [
    (["--epsilon", "0"], "--epsilon: must be in (0, 1), got 0"),
    (["--epsilon", "1.5"], "--epsilon: must be in (0, 1), got 1.5"),
    (["--delta", "1"], "--delta: must be in (0, 1), got 1"),
    (["--delta", "-0.1"], "--delta: must be in (0, 1), got -0.1"),
    (["--metric", "reward"], "--metric: unknown metric 'reward' (choices: return, eval_return)"),
    (["--metric", "eval_return"], "no eval.csv"),
    (["--optimum", "-5"], "--optimum -5 is not above --baseline 0"),
])
def test_compare_bad_options_exit_2(tmp_path, capsys, extra, said):
    write_group(tmp_path / "s", "mlp", FAST[:3])
    write_group(tmp_path / "s", "vqc", SLOW[:3])
    assert main(["compare", str(tmp_path / "s"), *extra]) == 2
    assert said in one_error_line(capsys)
    assert not (tmp_path / "s" / "plots").exists()


def test_compare_group_of_one_run_exits_2(tmp_path, capsys):
    write_group(tmp_path / "s", "mlp", FAST[:3])
    write_group(tmp_path / "s", "vqc", SLOW[:1])
    assert main(["compare", str(tmp_path / "s")]) == 2
    line = one_error_line(capsys)
    assert "group 'vqc' has 1 run" in line and "at least 2 runs per group" in line


@pytest.mark.parametrize("path, said", [
    ("empty", "no run directories under"),
    ("missing", "no such file or directory"),
    ("empty/*/seed*", "matches no path"),
])
def test_compare_path_without_runs_exits_2(tmp_path, capsys, path, said):
    write_group(tmp_path / "s", "mlp", FAST[:3])
    (tmp_path / "empty" / "x").mkdir(parents=True)
    assert main(["compare", str(tmp_path / "s"), str(tmp_path / path)]) == 2
    assert said in one_error_line(capsys)


def test_compare_calls_itself_marlq_compare(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: marlq compare") and "--epsilon" in out and "--delta" in out


# ----------------------------------------------------------------------------- marlq report
@pytest.mark.parametrize("seeds, shown", [(20, True), (19, False)])
def test_report_adds_the_table_for_20_seeds_per_group(tmp_path, seeds, shown):
    rng = np.random.default_rng(5)
    write_group(tmp_path / "s", "mlp", list(rng.choice(FAST, seeds)), episodes=12, every=200)
    write_group(tmp_path / "s", "vqc", list(rng.choice(SLOW, seeds)), episodes=12, every=200)
    page = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "s"), "--out", str(page), "--reps", "100"]) == 0
    html = page.read_text()
    assert ("Sample complexity (Meyer et al. 2025)" in html) is shown
    if shown:
        assert "mlp outperforms vqc" in html and 'alt="sample complexity per group"' in html
