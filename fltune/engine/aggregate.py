"""An order-independent weighted sum, so 1 worker and N workers aggregate to the same bits.

Floating-point addition is not associative: if worker A sums clients {1, 2} and worker B {3}, the total
differs in the last bits from one worker summing {1, 2, 3}, and those bits grow over rounds. Each term
w·v (a float32 value times a weight, exact in float64 for integer weights < 2^29) is split into a
coarse part on a fixed grid of 2^-GRID_BITS, whose sums are exact in float64 and so independent of order,
and a remainder below that grid. Only the remainders' sum can depend on order, at ~2^-(GRID_BITS+52) in
absolute terms: far below float32 resolution for any weight that matters. Weights are summed with
``math.fsum`` (exactly rounded, hence order-free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GRID_BITS = 20
"""Coarse grid 2^-20: exact coarse sums while |Σ w·v| < 2^33, i.e. any realistic n_k-weighted weights."""
_SCALE = float(2**GRID_BITS)


def _split(term: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coarse = np.round(term * _SCALE) / _SCALE
    return coarse, term - coarse


@dataclass
class WeightedSum:
    """Σ_k w_k·u_k over clients' updates, mergeable across workers in any grouping."""

    weights: list[float] = field(default_factory=list)
    coarse: dict[str, np.ndarray] = field(default_factory=dict)
    fine: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)

    def add(self, weight: float, update: dict[str, np.ndarray]) -> None:
        """Add one client's update with its weight (n_k for FedAvg, 1 for a plain mean)."""
        self.weights.append(float(weight))
        for key, value in update.items():
            coarse, fine = _split(np.asarray(value, dtype=np.float64) * float(weight))
            self._accumulate(key, coarse, fine, np.asarray(value).dtype)

    def merge(self, other: WeightedSum) -> None:
        """Fold another partial sum (e.g. another worker's) into this one."""
        self.weights.extend(other.weights)
        for key in other.coarse:
            self._accumulate(key, other.coarse[key], other.fine[key], other.dtypes[key])

    def _accumulate(self, key: str, coarse: np.ndarray, fine: np.ndarray, dtype: np.dtype) -> None:
        if key in self.coarse:
            self.coarse[key] = self.coarse[key] + coarse
            self.fine[key] = self.fine[key] + fine
        else:
            self.coarse[key], self.fine[key], self.dtypes[key] = coarse, fine, dtype

    def entry_bits(self) -> int:
        """Bits of one client's update in its own dtypes (what a client uploads)."""
        return sum(self.coarse[k].size * np.dtype(t).itemsize * 8 for k, t in self.dtypes.items())

    @property
    def total_weight(self) -> float:
        return math.fsum(sorted(self.weights))

    def mean(self) -> dict[str, np.ndarray]:
        """Σ w·u / Σ w, cast back to each entry's dtype (integer buffers are rounded)."""
        total = self.total_weight
        out = {}
        for key, dtype in self.dtypes.items():
            value = (self.coarse[key] + self.fine[key]) / total
            out[key] = (np.round(value) if np.issubdtype(dtype, np.integer) else value).astype(dtype)
        return out
