"""Whether two methods differ beyond seed noise: Welch's unequal-variances t-test, two-sided. Welch (1947):
t = (x̄₁ − x̄₂) / √(s₁²/n₁ + s₂²/n₂) with ν = (s₁²/n₁ + s₂²/n₂)² / Σᵢ (sᵢ²/nᵢ)² / (nᵢ − 1) degrees of freedom
(Welch–Satterthwaite); p = 2 · P(T_ν > |t|) (``scipy.stats.ttest_ind``). It assumes neither equal variances nor equal
seed counts (a diverged seed drops out of one side only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import ttest_ind

ALPHA = 0.05
"""Significance level of the comparison's column: p < α is "beyond seed noise"."""


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1, the one Welch's test uses; 0 for a single seed)."""
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of Welch's t-test; None below two values a side; no spread at all: 0 if means differ, else 1."""
    if len(a) < 2 or len(b) < 2:
        return None
    if np.var(a, ddof=1) + np.var(b, ddof=1) == 0:  # scipy's p is NaN here
        return 0.0 if np.mean(a) != np.mean(b) else 1.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)
