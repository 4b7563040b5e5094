"""Confidence intervals over seeds: the one implementation every plot and table uses."""
from __future__ import annotations

import warnings
from typing import Sequence, Union

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
