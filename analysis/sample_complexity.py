"""Sample complexity as Meyer et al. estimate it, its cluster-bootstrap interval and their outperformance
test; IQM and probability of improvement of final returns with bootstrap intervals. Pure functions over
arrays; `analysis.compare` reads run directories and calls them.

Meyer, Ufrecht, Yammine, Kontes, Mutschler, Scherer, "Benchmarking Quantum Reinforcement Learning",
ICML 2025 (arXiv 2501.15893). The definitions, restated, and what differs from the authors' code:
docs/statistics.md.

Conventions
- ``steps``: (T,) env steps of the evaluation points, increasing, the same for every run compared.
- ``returns``: (N, T) or (N, T, E): N runs, T evaluation points, E evaluation episodes per point. The
  episodes of a point are averaged first (NaN ignored); a point with no value (NaN) is not above the level.
- The level: ``baseline + (1 - epsilon) * (optimum - baseline)``; a run is above it at a point when its
  return there is strictly greater, i.e. its normalised return (R - baseline) / (optimum - baseline)
  exceeds 1 - epsilon (the paper's code uses ``>`` on returns normalised to [0, 1]).
- ``delta``: the fraction of runs that must be above the level at a point (the paper's "threshold
  probability": the level is reached with probability delta; 1 - delta is the chance that a run is not).
- The estimate Ŝ: the env steps of the first evaluation point at which that fraction is at least delta;
  ``inf`` when no point within ``steps`` has it (censored at ``steps[-1]``: "not reached").
- Bootstrap: runs are the clusters. A draw resamples N runs with replacement, each with its whole curve
  and all its evaluation episodes; intervals are percentiles of the draws taken as order statistics
  (numpy's ``inverted_cdf``, so an ``inf`` draw stays ``inf``). Randomness comes only from the
  ``numpy.random.Generator`` handed in.
- Lower sample complexity is better; a higher return is better.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from analysis.stats import ArrayLike, iqm, probability_of_improvement, stratified_bootstrap_ci

SC_LEVEL = 0.90  # the paper's code: the 5th and 95th percentiles of the cluster bootstrap
AGGREGATE_LEVEL = 0.95  # IQM and P(improvement): rliable's default, as marlq report


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its bootstrap interval [low, high] (``inf``: not reached)."""

    value: float
    low: float
    high: float

    @property
    def reached(self) -> bool:
        """Whether the point estimate is finite (a sample complexity: the level was reached)."""
        return bool(np.isfinite(self.value))


def check_unit(name: str, value: float) -> None:
    """ValueError naming ``name`` unless 0 < value < 1."""
    if not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name}: must be in (0, 1), got {value:g}")


def level(epsilon: float, optimum: float, baseline: float = 0.0) -> float:
    """The return a run must exceed: ``baseline + (1 - epsilon) * (optimum - baseline)``."""
    check_unit("epsilon", epsilon)
    if not optimum > baseline:
        raise ValueError(f"optimum {optimum:g} must be above baseline {baseline:g}")
    return float(baseline + (1.0 - epsilon) * (optimum - baseline))


def point_means(returns: ArrayLike) -> np.ndarray:
    """(N, T) returns per run and point: a (N, T, E) array averaged over its E evaluation episodes."""
    x = np.asarray(returns, dtype=float)
    if x.ndim == 3:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN point: NaN, not above the level
            x = np.nanmean(x, axis=2)
    if x.ndim != 2:
        raise ValueError(f"returns: expected (runs, points) or (runs, points, episodes), got shape {x.shape}")
    return x


def above_level(returns: ArrayLike, epsilon: float, optimum: float, baseline: float = 0.0) -> np.ndarray:
    """(N, T) booleans: run i's (episode-mean) return at point t is above the (1 - epsilon) level."""
    with np.errstate(invalid="ignore"):
        return point_means(returns) > level(epsilon, optimum, baseline)


def first_step(steps: ArrayLike, fraction: np.ndarray, delta: float) -> np.ndarray:
    """The steps of the first point at which ``fraction`` (T,) or each row of it (B, T) is at least
    ``delta``; ``inf`` where none is."""
    check_unit("delta", delta)
    steps = np.asarray(steps, dtype=float)
    ok = np.asarray(fraction) >= delta
    first = np.argmax(ok, axis=-1)
    return np.where(ok.any(axis=-1), steps[first], np.inf)


def sample_complexity(steps: ArrayLike, returns: ArrayLike, epsilon: float, delta: float, optimum: float,
                      baseline: float = 0.0) -> float:
    """Ŝ(epsilon, delta): env steps of the first evaluation point at which at least a fraction ``delta``
    of the runs is above the (1 - epsilon) level; ``inf`` when no point within ``steps`` is."""
    hits = above_level(returns, epsilon, optimum, baseline)
    _check_steps(steps, hits)
    return float(first_step(steps, hits.mean(axis=0), delta))


def bootstrap_counts(runs: int, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, runs): how often each run is drawn in each of ``reps`` resamples of ``runs`` runs."""
    if runs < 1 or reps < 1:
        raise ValueError(f"need at least one run and one draw, got {runs} runs, {reps} draws")
    idx = rng.integers(0, runs, size=(reps, runs))
    flat = (idx + runs * np.arange(reps)[:, None]).ravel()
    return np.bincount(flat, minlength=reps * runs).reshape(reps, runs)


def bootstrap_fractions(hits: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, T): the fraction of runs above the level at each point, in each cluster-bootstrap draw."""
    hits = np.asarray(hits, dtype=float)
    return bootstrap_counts(hits.shape[0], reps, rng) @ hits / hits.shape[0]


def percentile_interval(draws: ArrayLike, level: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The central ``level`` percentile interval of bootstrap draws, as order statistics (``inf`` kept)."""
    check_unit("level", level)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.asarray(draws, dtype=float), [tail, 1.0 - tail], axis=axis, method="inverted_cdf")
    return lo, hi


def sample_complexity_ci(steps: ArrayLike, returns: ArrayLike, epsilon: float, delta: float, optimum: float,
                         rng: np.random.Generator, reps: int = 2000, level: float = SC_LEVEL,
                         baseline: float = 0.0) -> Estimate:
    """Ŝ(epsilon, delta) and its cluster-bootstrap percentile interval (`bootstrap_sample_complexity`)."""
    hits = above_level(returns, epsilon, optimum, baseline)
    return bootstrap_sample_complexity(steps, hits, delta, rng, reps, level)[0]


def bootstrap_sample_complexity(steps: ArrayLike, hits: np.ndarray, delta: float, rng: np.random.Generator,
                                reps: int = 2000, level: float = SC_LEVEL) -> tuple[Estimate, np.ndarray]:
    """From (N, T) above-level booleans: Ŝ with its cluster-bootstrap percentile interval, and the (reps, T)
    fractions of the draws. The interval is widened to hold the point estimate, as the paper's code does
    (the percentiles of a statistic that takes few values can miss it)."""
    _check_steps(steps, hits)
    value = float(first_step(steps, np.mean(hits, axis=0), delta))
    fractions = bootstrap_fractions(hits, reps, rng)
    lo, hi = percentile_interval(first_step(steps, fractions, delta), level)
    return Estimate(value, float(min(lo, value)), float(max(hi, value))), fractions


def outperforms(a: Estimate, b: Estimate) -> bool:
    """A outperforms B (Meyer et al.): A's whole sample-complexity interval lies below B's, i.e. A's upper
    percentile is smaller than B's lower one. A B that never reaches the level in the lower percentile's
    draws (low = inf) is outperformed by any A whose upper percentile is finite."""
    return bool(a.high < b.low)


def verdict(a: Estimate, b: Estimate) -> int:
    """1 when A outperforms B, -1 when B outperforms A, 0 when neither does (no verdict)."""
    return 1 if outperforms(a, b) else -1 if outperforms(b, a) else 0


def iqm_ci(scores: ArrayLike, rng: np.random.Generator, reps: int = 2000,
           level: float = AGGREGATE_LEVEL) -> Estimate:
    """Interquartile mean (`analysis.stats.iqm`) of one configuration's scores, one per run, with the
    percentile interval of a bootstrap over runs."""
    return Estimate(*stratified_bootstrap_ci(iqm, _finite(scores), reps=reps, level=level, rng=rng))


def probability_of_improvement_ci(x: ArrayLike, y: ArrayLike, rng: np.random.Generator, reps: int = 2000,
                                  level: float = AGGREGATE_LEVEL) -> Estimate:
    """P(X > Y) over runs, ties counting 1/2 (`analysis.stats.probability_of_improvement`, rliable's
    definition), with the percentile interval of a bootstrap resampling each configuration's runs."""
    return Estimate(*stratified_bootstrap_ci(probability_of_improvement, _finite(x), _finite(y), reps=reps,
                                             level=level, rng=rng))


def _finite(scores: ArrayLike) -> np.ndarray:
    x = np.asarray(scores, dtype=float).ravel()
    x = x[np.isfinite(x)]
    if len(x) == 0:
        raise ValueError("no finite scores")
    return x


def _check_steps(steps: ArrayLike, hits: np.ndarray) -> None:
    s = np.asarray(steps, dtype=float)
    if s.ndim != 1 or len(s) != hits.shape[1]:
        raise ValueError(f"steps: expected {hits.shape[1]} evaluation points, got shape {s.shape}")
    if len(s) > 1 and np.any(np.diff(s) <= 0):
        raise ValueError("steps: must be strictly increasing")

