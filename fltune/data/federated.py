"""A dataset split over clients: one shared uint8 pool plus per-client index arrays. Partitions are cached as
``.npz`` files named by a sha256 of everything that determines them, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fltune.data.datasets import Dataset
from fltune.data.partitions import aligned_test_split, check_held_out, partition, split_train_eval
from fltune.errors import FLTuneError
from fltune.folders import ReplaceOnClose


def _unpickle(values: dict[str, Any], tensors: tuple[str, ...]) -> FederatedData:
    """:meth:`FederatedData.__reduce__`'s inverse, no copy (read-only arrays: nothing writes the pool)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return FederatedData(**{k: torch.from_numpy(v) if k in tensors else v for k, v in values.items()})


# k of the `classes` partition when unset. SimFAFL: EMNIST-L, CIFAR-10 5; FMNIST 3; CIFAR-100 15. [U] for the
# rest, by analogy: MNIST/synthetic as FMNIST, SVHN as CIFAR-10, Tiny-ImageNet 30 of 200 (CIFAR-100 scaled).
DEFAULT_CLASSES_PER_CLIENT: dict[str, int] = {
    "emnist_letters": 5, "cifar10": 5, "fmnist": 3, "cifar100": 15, "mnist": 3, "svhn": 5, "synthetic": 3,
    "cinic10": 5, "pathmnist": 3, "tissuemnist": 3, "tinyimagenet": 30,
}
PARTITION_FORMAT = 1  # part of every cache key: bump it when a partition algorithm changes


@dataclass(frozen=True)
class FederatedData:
    """The pool of samples, who holds which, and the global test split."""

    x: torch.Tensor = field(repr=False)  # uint8 pool [P, C, H, W]
    y: torch.Tensor = field(repr=False)  # int64 [P]
    client_train: list[np.ndarray] = field(repr=False)  # indices into the pool
    client_eval: list[np.ndarray] = field(repr=False)  # indices into the pool (empty if eval_fraction = 0)
    test_x: torch.Tensor = field(repr=False)
    test_y: torch.Tensor = field(repr=False)
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: str
    name: str
    client_val: list[np.ndarray] = field(default_factory=list, repr=False)
    """Validation indices into the pool, held out of each client's training data (empty if val_fraction = 0)."""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        return tuple(self.x.shape[1:])

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 images, labels) of the global ``test`` split or of the union of clients' ``val`` splits."""
        if name == "test":
            return self.test_x, self.test_y
        idx = torch.from_numpy(np.sort(np.concatenate(self.client_val)))
        return self.x[idx], self.y[idx]

    def held_out(self, name: str) -> tuple[list[np.ndarray], list[int]]:
        """Each client's ``test`` (held-out) or ``val`` indices, and how many samples each was drawn from."""
        trained = [len(t) + len(v) for t, v in zip(self.client_train, self.client_val, strict=True)]
        if name == "val":
            return self.client_val, trained
        return self.client_eval, [n + len(e) for n, e in zip(trained, self.client_eval, strict=True)]

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], tuple[str, ...]]]:
        """Pickled as numpy arrays, so Ray's object store gives every worker zero-copy views of one pool."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        tensors = tuple(k for k, v in values.items() if isinstance(v, torch.Tensor))
        return _unpickle, ({k: values[k].numpy() if k in tensors else values[k] for k in values}, tensors)

    def without_test(self) -> FederatedData:
        """The same data with no test split at all: a tuning run can never measure on test data."""
        return replace(self, test_x=self.test_x[:0], test_y=self.test_y[:0],
                       client_eval=[idx[:0] for idx in self.client_eval])

    def val_as_eval(self) -> FederatedData:
        """Validation splits in place of held-out ones, for personalised evaluation (``client_eval``)."""
        return replace(self, client_eval=self.client_val)


def build_federated_data(
    dataset: Dataset, *, kind: str, num_clients: int, seed: int, alpha: float = 0.5,
    classes_per_client: int | None = None, shards_per_client: int = 2, min_size: int = 10,
    eval_fraction: float = 0.0, val_fraction: float = 0.0, pool_test: bool = False, test_per_client: int = 0,
    cache_dir: str | Path | None = None,
) -> FederatedData:
    """Partition ``dataset`` over ``num_clients`` clients, hold out ``eval_fraction`` of each, then ``val_fraction`` of
    the rest as validation (own seed stream: the partition does not depend on it). ``pool_test=True`` (SimFAFL/FedCR):
    train and test pooled before partitioning, the global test split is the union of the held-out splits.
    ``test_per_client > 0`` (FedSOL): held-out splits drawn from the test split in each client's label proportions
    (:func:`aligned_test_split`), appended to the pool. Refuses a client without training samples and a fraction that
    holds out nothing (:func:`check_held_out`)."""
    if pool_test and eval_fraction == 0:
        raise FLTuneError(
            "partition.eval_fraction: must be > 0 with partition.pool_test, whose global test split is "
            "the clients' held-out data; got 0"
        )
    x, y = dataset.train_x, dataset.train_y
    if pool_test:
        x, y = torch.cat([x, dataset.test_x]), torch.cat([y, dataset.test_y])
    params = {
        "kind": kind, "num_clients": num_clients, "seed": seed, "alpha": alpha,
        "classes_per_client": (DEFAULT_CLASSES_PER_CLIENT.get(dataset.name) if classes_per_client is None
                               else classes_per_client),
        "shards_per_client": shards_per_client, "min_size": min_size, "eval_fraction": eval_fraction,
    }
    shared = Path(os.environ.get("FLTUNE_CACHE", "~/.cache/fltune")).expanduser()  # tests, clusters' shared disks
    train, held_out = _cached_split(dataset.name, y.numpy(), dataset.num_classes, params,
                                    Path(cache_dir) if cache_dir else shared / "partitions")
    train, val = split_train_eval(train, val_fraction, _stream(seed, 2))
    if pool_test:
        test = torch.from_numpy(np.sort(np.concatenate(held_out)))
        test_x, test_y = x[test], y[test]
    else:
        test_x, test_y = dataset.test_x, dataset.test_y
    if test_per_client:
        labels = [y[np.concatenate(part)].numpy() for part in zip(train, val, strict=True)]  # its whole part
        aligned = aligned_test_split(labels, test_y.numpy(), dataset.num_classes, test_per_client, _stream(seed, 3))
        held_out = [len(y) + idx for idx in aligned]
        x, y = torch.cat([x, test_x]), torch.cat([y, test_y])
    data = FederatedData(x, y, train, held_out, test_x, test_y, dataset.num_classes, dataset.mean,
                         dataset.std, dataset.augment, dataset.name, val)
    if untrained := sum(len(idx) == 0 for idx in train):
        raise FLTuneError(f"federation.clients: {untrained} of {num_clients} clients got no training samples; "
                          "allowed: fewer clients or a less skewed partition")
    check_held_out("partition.eval_fraction", eval_fraction, *data.held_out("test"))
    check_held_out("partition.val_fraction", val_fraction, *data.held_out("val"))
    return data


def _stream(seed: int, stream: int) -> int:
    """Seed of stream ``stream`` of ``seed`` (0 partition, 1 held-out, 2 validation, 3 FedSOL's aligned
    test), so none replays another's random numbers."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _cached_split(name: str, labels: np.ndarray, num_classes: int, params: dict,
                  cache_dir: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Partition and train/eval split, read from ``cache_dir`` when an identical one was made before."""
    meta = json.dumps({
        "format": PARTITION_FORMAT, "dataset": name, "pool_size": len(labels),
        "labels_sha256": hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest(),
        **params,
    }, sort_keys=True)
    path = cache_dir / f"{name}-{params['kind']}-{hashlib.sha256(meta.encode()).hexdigest()}.npz"
    cached = _read(path, meta)
    if cached is not None:
        return cached
    parts = partition(labels, num_classes, **{k: v for k, v in params.items() if k != "eval_fraction"})
    train, held_out = split_train_eval(parts, params["eval_fraction"], _stream(params["seed"], 1))
    _write(path, meta, train, held_out)
    return train, held_out


def _read(path: Path, meta: str) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """The cached split at ``path`` if made from exactly ``meta`` and intact; else None (never fatal)."""
    try:
        with np.load(path) as stored:
            if str(stored["meta"]) != meta:
                return None
            return tuple(_unflatten(stored[f"{half}_flat"], stored[f"{half}_sizes"]) for half in ("train", "eval"))
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error):
        return None


def _write(path: Path, meta: str, train: list[np.ndarray], held_out: list[np.ndarray]) -> None:
    """Written whole or not at all (``folders.ReplaceOnClose``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = ReplaceOnClose(str(path))
    except OSError as err:
        raise FLTuneError(f"partition.cache_dir: cannot write to {path.parent} ({err.strerror})") from err
    try:
        with file:
            np.savez(file, meta=np.array(meta), **_packed("train", train), **_packed("eval", held_out))
    except OSError as err:  # a full disk, or a directory squatting on the file's name
        raise FLTuneError(f"partition.cache_dir: cannot write {path} ({err.strerror}); free space there, "
                          f"remove what is in the way or choose another partition.cache_dir") from err


def _packed(half: str, parts: list[np.ndarray]) -> dict[str, np.ndarray]:
    """``parts`` as the ``.npz`` arrays ``<half>_flat`` (all of them, concatenated) and ``<half>_sizes``."""
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return {f"{half}_flat": flat, f"{half}_sizes": np.array([len(p) for p in parts], dtype=np.int64)}


def _unflatten(flat: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    if sizes.sum() != len(flat) or (sizes < 0).any():
        raise ValueError(f"sizes add up to {sizes.sum()}, not the {len(flat)} stored indices")
    return np.split(flat.astype(np.int64), np.cumsum(sizes)[:-1])
