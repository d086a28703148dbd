"""Welch's t-test of the comparison's significance column, against scipy's own implementation."""

from __future__ import annotations

import math

import pytest
from scipy.stats import ttest_ind

from fltune.compare.stats import mean_std, welch_p


@pytest.mark.parametrize("a, b", [
    ([0.81, 0.83, 0.80], [0.78, 0.79, 0.77]),
    ([0.9, 0.7, 0.8, 0.85], [0.6, 0.65]),  # unequal seed counts and spreads
    ([0.5, 0.5, 0.51], [0.5, 0.52, 0.49]),
])
def test_welch_p_is_scipys_unequal_variance_t_test(a: list[float], b: list[float]) -> None:
    assert math.isclose(welch_p(a, b), ttest_ind(a, b, equal_var=False).pvalue, rel_tol=1e-9)


def test_welch_needs_two_seeds_a_side_and_handles_no_spread() -> None:
    assert welch_p([0.8], [0.7, 0.75]) is None
    assert welch_p([0.8, 0.8], [0.7, 0.7]) == 0.0 and welch_p([0.8, 0.8], [0.8, 0.8]) == 1.0


def test_mean_std_is_the_sample_std_over_seeds() -> None:
    assert mean_std([1.0, 3.0]) == (2.0, math.sqrt(2.0)) and mean_std([0.5]) == (0.5, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))
