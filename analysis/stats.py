"""Confidence intervals over seeds: the one implementation every plot and table uses."""
from __future__ import annotations

import warnings
from typing import Optional, Sequence, Union

import numpy as np
from scipy import stats

ArrayLike = Union[np.ndarray, Sequence[float], Sequence[np.ndarray]]


def mean_ci(samples: ArrayLike, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 (seeds) and the half-width of the two-sided Student-t interval.

    NaNs are ignored column by column (curves of different lengths); a column with fewer than two
    values gets half-width 0, and one with none gets NaN for both.
    """
    x = np.asarray(samples, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
        squeeze = True
    else:
        squeeze = False
    n = np.sum(~np.isnan(x), axis=0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are expected at curve ends
        mean = np.nanmean(x, axis=0)
        sd = np.nanstd(x, axis=0, ddof=1)
        t = stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1))
        half = np.where(n > 1, t * sd / np.sqrt(np.maximum(n, 1)), 0.0)
    half = np.where(n == 0, np.nan, half)
    if squeeze:
        return mean[0], half[0]
    return mean, half


def clipped_band(curves: np.ndarray, mean: np.ndarray, half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The band to draw around ``mean`` +- ``half`` for curves (seeds, x): clipped at each x to the range the
    seeds themselves span, since the t-interval of a few seeds can reach past what any seed scored. NaNs
    (a seed's curve that ends early) are ignored at each x."""
    curves = np.asarray(curves, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an x no seed reaches: NaN, drawn as nothing
        low, high = np.nanmin(curves, axis=0), np.nanmax(curves, axis=0)
    return np.maximum(mean - half, low), np.minimum(mean + half, high)


def maximum_return(evals: ArrayLike, level: float = 0.95) -> tuple[int, float, float]:
    """Papoudakis et al. (2021)'s "maximum return" of a (seeds, evaluation steps) matrix of evaluation
    returns: the evaluation step whose mean over seeds is highest (the first of ties), then the mean and
    the t-interval's half-width over seeds there. Returns (that step's column, mean, half-width)."""
    x = np.asarray(evals, dtype=float)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"maximum_return: a (seeds, evaluation steps) matrix, got shape {x.shape}")
    mean, half = mean_ci(x, level)
    best = int(np.nanargmax(mean))
    return best, float(mean[best]), float(half[best])


# ----------------------------------------------------------------------------- aggregates over runs
# The aggregate metrics of Agarwal et al., "Deep RL at the Edge of the Statistical Precipice" (NeurIPS
# 2021), as the rliable library defines them: scores are a (runs, tasks) matrix, one column per task;
# intervals are percentile intervals of a bootstrap that resamples runs within each task (stratified).
# A sweep over one scenario has one task, and the stratified bootstrap resamples its seeds.


def _matrix(scores: ArrayLike) -> np.ndarray:
    x = np.asarray(scores, dtype=float)
    return x[:, None] if x.ndim == 1 else x


def iqm(scores: ArrayLike) -> float:
    """Interquartile mean of all scores (runs x tasks pooled): the mean of what is left after dropping
    floor(25%) of the scores at each end (``scipy.stats.trim_mean(..., 0.25)``, as rliable's ``aggregate_iqm``)."""
    return float(stats.trim_mean(_matrix(scores).ravel(), 0.25))


def probability_of_improvement(x: ArrayLike, y: ArrayLike) -> float:
    """P(X > Y): over tasks, the mean of the chance that a run of X beats a run of Y on that task, ties
    counting half (the Mann-Whitney U over n*m, as rliable's ``probability_of_improvement``)."""
    x, y = _matrix(x), _matrix(y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x has {x.shape[1]} tasks, y {y.shape[1]}")
    per_task = []
    for j in range(x.shape[1]):
        a, b = x[:, j][:, None], y[:, j][None, :]
        per_task.append(float(np.mean((a > b) + 0.5 * (a == b))))
    return float(np.mean(per_task))


def _resample(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One stratified bootstrap draw: runs drawn with replacement within each task (column)."""
    idx = rng.integers(0, x.shape[0], size=x.shape)
    return np.take_along_axis(x, idx, axis=0)


def stratified_bootstrap_ci(statistic, *samples: ArrayLike, reps: int = 2000, level: float = 0.95,
                            seed: int = 0, rng: Optional[np.random.Generator] = None) -> tuple[float, float, float]:
    """``statistic(*samples)`` and its percentile interval over ``reps`` stratified bootstrap draws (each
    sample resampled on its own, runs within tasks). Deterministic for a ``seed``; ``rng``, when given,
    is drawn from instead (a caller's one stream over several intervals)."""
    mats = [_matrix(s) for s in samples]
    rng = np.random.default_rng(seed) if rng is None else rng
    draws = np.array([statistic(*[_resample(m, rng) for m in mats]) for _ in range(reps)])
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(statistic(*mats)), float(lo), float(hi)
