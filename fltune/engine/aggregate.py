"""An order-independent weighted sum, so 1 worker and N workers aggregate to the same bits. Floating-point addition is
not associative: worker A summing clients {1, 2} and B {3} differs in the last bits from one worker summing {1, 2, 3},
and those bits grow over rounds. Each term w·v (float32 times a weight, exact in float64 for integer weights < 2^29) is
split into a coarse part on a fixed grid of 2^-GRID_BITS, whose float64 sums are exact and so order-free, and a
remainder below the grid, whose sum alone may depend on order, at ~2^-(GRID_BITS+52) absolute: far below float32
resolution. Weights are summed with ``math.fsum`` (exactly rounded, hence order-free)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

GRID_BITS = 20
"""Coarse grid 2^-20: exact coarse sums while |Σ w·v| < 2^33, i.e. any realistic n_k-weighted weights."""
_SCALE = float(2**GRID_BITS)


BLOCK = 1 << 16
"""Elements per block of the float64 arithmetic: a term's temporaries stay small instead of several float64
copies of the largest layer, and every element goes through the same operations: same bits."""


def _blocks(size: int) -> Iterator[slice]:
    """Consecutive slices of ``BLOCK`` elements covering ``range(size)``."""
    return (slice(start, start + BLOCK) for start in range(0, size, BLOCK))


def _terms(value: np.ndarray, weight: float) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """(block, coarse, fine) of w·v per block of the flat ``value``: coarse = round(w·v·2^GRID_BITS) /
    2^GRID_BITS, fine = w·v − coarse, in float64."""
    flat = value.reshape(-1)
    for block in _blocks(flat.size):
        fine = np.multiply(flat[block], weight, dtype=np.float64)
        coarse = fine * _SCALE
        np.round(coarse, out=coarse)
        coarse /= _SCALE
        fine -= coarse
        yield block, coarse, fine


@dataclass
class WeightedSum:
    """Σ_k w_k·u_k over clients' updates, mergeable across workers in any grouping."""

    weights: list[float] = field(default_factory=list)
    coarse: dict[str, np.ndarray] = field(default_factory=dict)
    fine: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)

    def add(self, weight: float, update: dict[str, np.ndarray]) -> None:
        """Add one client's update with its weight (n_k for FedAvg, 1 for a plain mean). A key's first terms
        are stored, not added to zeros: 0.0 + −0.0 would turn a −0.0 into +0.0."""
        self.weights.append(float(weight))
        for key, value in update.items():
            value = np.asarray(value)
            first = key not in self.coarse
            if first:
                self.coarse[key], self.fine[key] = np.empty(value.shape), np.empty(value.shape)
                self.dtypes[key] = value.dtype
            coarse_sum, fine_sum = self._flat(self.coarse, key), self._flat(self.fine, key)
            for block, coarse, fine in _terms(value, float(weight)):
                if first:
                    coarse_sum[block], fine_sum[block] = coarse, fine
                else:
                    coarse_sum[block] += coarse
                    fine_sum[block] += fine

    def merge(self, other: WeightedSum) -> None:
        """Fold another partial sum (e.g. another worker's) into this one."""
        self.weights.extend(other.weights)
        for key in other.coarse:
            if key not in self.coarse:
                self.coarse[key], self.fine[key] = other.coarse[key], other.fine[key]
                self.dtypes[key] = other.dtypes[key]
                continue
            for sums, theirs in ((self.coarse, other.coarse), (self.fine, other.fine)):
                total = self._flat(sums, key)
                total += theirs[key].reshape(-1)

    @staticmethod
    def _flat(sums: dict[str, np.ndarray], key: str) -> np.ndarray:
        """A writable flat view of ``sums[key]``, copied first when read-only (a partial from Ray's store)."""
        if not sums[key].flags.writeable:
            sums[key] = np.array(sums[key])
        return sums[key].reshape(-1)

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
            coarse, fine = self.coarse[key].reshape(-1), self.fine[key].reshape(-1)
            mean, integer = np.empty(coarse.size, dtype), np.issubdtype(dtype, np.integer)
            for block in _blocks(coarse.size):
                value = coarse[block] + fine[block]
                value /= total
                mean[block] = np.round(value) if integer else value
            out[key] = mean.reshape(self.coarse[key].shape)
        return out
