"""The seed confidence interval against hand-computed values."""
import numpy as np
from scipy import stats

from analysis.stats import clipped_band, mean_ci


def test_matches_the_t_interval_by_hand():
    x = [1.0, 2.0, 4.0]
    mean, half = mean_ci(x)
    sd = np.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    assert mean == 7 / 3
    assert np.isclose(half, stats.t.ppf(0.975, 2) * sd / np.sqrt(3))


def test_columns_with_nans_single_values_and_none():
    curves = np.array([[1.0, 2.0, np.nan, np.nan], [3.0, np.nan, np.nan, np.nan]])
    mean, half = mean_ci(curves)
    np.testing.assert_allclose(mean[:2], [2.0, 2.0])
    assert half[1] == 0.0 and np.isnan(mean[3]) and np.isnan(half[3])
    assert np.isclose(half[0], stats.t.ppf(0.975, 1) * np.std([1, 3], ddof=1) / np.sqrt(2))


def test_clipped_band_stays_within_the_seeds_range_and_keeps_a_narrower_interval():
    curves = np.array([[0.0, 10.0, 5.0], [2.0, 20.0, 5.0]])
    mean, half = curves.mean(axis=0), np.array([0.5, 100.0, 1.0])
    low, high = clipped_band(curves, mean, half)
    assert low.tolist() == [0.5, 10.0, 5.0] and high.tolist() == [1.5, 20.0, 5.0]
