"""A client's epoch of batches: the seeded sample order, and the two batch sources the exact and reference
executors read (gathered and normalised on the host, or on the device from the run's uint8 pool)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch

from fltune.config import TrainingConfig
from fltune.data.augment import augment, lookup_float, normalise_table, to_float
from fltune.data.federated import FederatedData

Batch = tuple[torch.Tensor, torch.Tensor]


@lru_cache(maxsize=8)
def device_table(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """:func:`normalise_table` on ``device``, once per dataset and device (read only), not once per call."""
    return normalise_table(mean, std).to(device)


def epoch_order(indices: np.ndarray, generator: torch.Generator, keep: int | None = None) -> torch.Tensor:
    """An epoch's sample order: the one ``randperm`` draw every batch source shares, cut to its first ``keep``
    (None: all) after the draw, as a ``drop_last`` DataLoader does: each epoch drops other samples."""
    index = torch.tensor(indices, dtype=torch.long)  # a copy: arrays from Ray's object store are read-only
    return index[torch.randperm(len(index), generator=generator)][:keep]


def epoch_samples(n: int, training: TrainingConfig) -> int:
    """The samples a client of ``n`` trains an epoch: all, or with ``training.drop_last`` floor(n/B)·B. Also its
    n_k in the weighted average, as FedAlign's ``len(loader) * batch_size`` (``mmendiet/FedAlign:methods/base.py``)."""
    return n - n % training.batch_size if training.drop_last else n


class HostBatches:
    """The reference batch source: each batch gathered and normalised on the host, then copied over."""

    def __init__(self, data: FederatedData, device: torch.device) -> None:
        self.data, self.device = data, device

    def epoch(self, indices: np.ndarray, batch_size: int, generator: torch.Generator,
              augment_kind: str, keep: int | None = None) -> Iterator[Batch]:
        """Mini-batches of a client's samples: uint8 → float, augmented, normalised, on the device; the first
        ``keep`` of the epoch's order (:func:`epoch_samples`)."""
        data, index = self.data, epoch_order(indices, generator, keep)
        black = None if augment_kind == "none" else normalise_table(data.mean, data.std)[:, 0]  # a crop's padding
        for start in range(0, len(index), batch_size):
            chunk = index[start:start + batch_size]
            x = to_float(data.x[chunk], data.mean, data.std)
            if augment_kind != "none":
                x = augment(x, augment_kind, generator, black)
            yield x.to(self.device, non_blocking=True), data.y[chunk].to(self.device, non_blocking=True)


class DeviceBatches:
    """The fast path's batch source, equal to :class:`HostBatches`'s: the uint8 pool on the device once, batches
    gathered by index, normalised by table lookup (bit-identical to ``to_float``), augmented with the same draws."""

    def __init__(self, data: FederatedData, device: torch.device) -> None:
        self.x, self.y = data.x.to(device), data.y.to(device)  # no copy when the device is the CPU
        self.table = device_table(data.mean, data.std, device)
        self.black = self.table[:, 0]  # a black pixel, normalised: a crop's padding (``augment``)
        self.device = device

    def epoch(self, indices: np.ndarray, batch_size: int, generator: torch.Generator,
              augment_kind: str, keep: int | None = None) -> Iterator[Batch]:
        index = epoch_order(indices, generator, keep).to(self.device, non_blocking=True)
        for start in range(0, len(index), batch_size):
            chunk = index[start:start + batch_size]
            x = lookup_float(self.x[chunk], self.table)
            yield (augment(x, augment_kind, generator, self.black) if augment_kind != "none" else x), self.y[chunk]

