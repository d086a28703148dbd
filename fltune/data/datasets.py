"""The datasets fltune trains on, by name, as raw uint8 NCHW tensors with their normalisation constants.

Images stay uint8 in memory (4x smaller than float32, shared by every Ray worker); ``augment.to_float``
normalises each batch. A missing or unusable file is one line, raised before any training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import torch

from fltune.catalog import NUM_CLASSES
from fltune.data.files import Splits
from fltune.data.image_trees import load_cinic10, load_tinyimagenet
from fltune.data.medmnist import load_medmnist
from fltune.data.torchvision_sets import load_cifar, load_emnist_letters, load_fmnist, load_mnist, load_svhn
from fltune.plugins import is_reference, label, plugins, unknown


@dataclass(frozen=True)
class Dataset:
    """A dataset's train and test splits (uint8 [N, C, H, W] images, int64 labels) and its constants."""

    name: str
    train_x: torch.Tensor = field(repr=False)
    train_y: torch.Tensor = field(repr=False)
    test_x: torch.Tensor = field(repr=False)
    test_y: torch.Tensor = field(repr=False)
    num_classes: int
    mean: tuple[float, ...]  # per channel, on the [0, 1] scale
    std: tuple[float, ...]
    augment: str  # the dataset's default augmentation (docs/methods.md §0, Augmentation)


def _load_synthetic(root: Path | None, download: bool) -> Splits:
    """6000 train / 1000 test 1×28×28 images of 10 balanced classes, identical in every process: a random
    7×7 pattern per class blown up to 28×28, plus Gaussian noise (σ = 80 of 255)."""
    rng = np.random.default_rng(0x5EED)
    patterns = np.kron(rng.uniform(0, 255, (10, 7, 7)), np.ones((4, 4))).astype(np.float32)
    labels = np.concatenate([rng.permutation(np.arange(n) % 10) for n in (6000, 1000)])
    images = patterns[labels] + 80 * rng.standard_normal((len(labels), 28, 28), dtype=np.float32)
    x = torch.from_numpy(np.clip(images, 0, 255).astype(np.uint8)).unsqueeze(1)
    y = torch.from_numpy(labels)
    return x[:6000], y[:6000], x[6000:], y[6000:]


@dataclass(frozen=True)
class _Spec:
    """What fltune knows about a dataset before loading it (its class count: ``fltune.catalog``)."""

    mean: tuple[float, ...] | None  # None: computed from the train split at load time
    std: tuple[float, ...] | None
    augment: str
    load: Callable[[Path | None, bool], Splits]


_SPECS: dict[str, _Spec] = {
    "fmnist": _Spec((0.2860,), (0.3530,), "none", load_fmnist),
    "mnist": _Spec((0.1307,), (0.3081,), "none", load_mnist),
    "emnist_letters": _Spec((0.1722,), (0.3309,), "none", load_emnist_letters),
    "cifar10": _Spec((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), "crop_flip",
                     partial(load_cifar, "CIFAR10", "cifar-10-batches-py")),
    "cifar100": _Spec((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "crop_flip",
                      partial(load_cifar, "CIFAR100", "cifar-100-python")),
    # no flips for digits (a mirrored 2 is no 2); SVHN's usual recipe is no augmentation
    "svhn": _Spec((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), "none", load_svhn),
    # FedSOL's code (train_tools/preprocessing): MedMNIST Normalize(0.5, 0.5) and a flip; CINIC-10 a reflect crop
    "pathmnist": _Spec((0.5,) * 3, (0.5,) * 3, "flip", partial(load_medmnist, "pathmnist")),
    "tissuemnist": _Spec((0.5,), (0.5,), "flip", partial(load_medmnist, "tissuemnist")),
    "cinic10": _Spec((0.47889522, 0.47227842, 0.43047404), (0.24205776, 0.23828046, 0.25874835),
                     "reflect_crop_flip", load_cinic10),
    # MAN's code (vcl-iisc/fedMAN:code/utils_dataset.py 'TinyImageNet'): ImageNet's constants, FedDyn's augment
    "tinyimagenet": _Spec((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "flip_crop_half", load_tinyimagenet),
    "synthetic": _Spec(None, None, "none", _load_synthetic),
}
DATASETS: tuple[str, ...] = tuple(_SPECS)


def load_dataset(name: str, root: str | Path | None = None, download: bool = False) -> Dataset:
    """Load a dataset by name from ``root`` (default ``~/.cache/fltune/data``; Fashion-MNIST also from
    Debian's folder), memoised per process: the tensors are shared, treat them as read-only."""
    if name not in _SPECS and not is_reference(name) and name not in plugins("dataset"):
        raise unknown("dataset", name, list(DATASETS))
    return _load(name, None if root is None else str(Path(root).expanduser().resolve()), download)


def release_loaded() -> None:
    """Forget every loaded dataset (the process reads the workers' shared copy from now on)."""
    _load.cache_clear()


@lru_cache(maxsize=4)
def _load(name: str, root: str | None, download: bool) -> Dataset:
    """Load and wrap one dataset, built-in or the user's (``fltune.data.plugin``)."""
    if name not in _SPECS:
        from fltune.data.plugin import load_user

        (train_x, train_y, test_x, test_y), user = load_user(name, root, download)
        mean, std = (tuple(user.mean), tuple(user.std)) if user.mean and user.std else _pixel_stats(train_x)
        return Dataset(label(name), train_x, train_y, test_x, test_y, user.num_classes, mean, std, user.augment)
    spec = _SPECS[name]
    train_x, train_y, test_x, test_y = spec.load(None if root is None else Path(root), download)
    mean, std = (spec.mean, spec.std) if spec.mean is not None else _pixel_stats(train_x)
    return Dataset(name, train_x.contiguous(), train_y.long(), test_x.contiguous(), test_y.long(),
                   NUM_CLASSES[name], mean, std, spec.augment)


def normalised(dataset: Dataset, how: str) -> Dataset:
    """The dataset with ``data.normalise``'s mean and std: ``dataset`` published, ``train`` the whole train
    split's (FedCR's EMNIST; call before :func:`subsample`), ``half`` 0.5 and 0.5 (FedCR's FMNIST)."""
    if how == "dataset":
        return dataset
    if how == "train":
        mean, std = _pixel_stats(dataset.train_x)
    else:
        mean, std = (0.5,) * len(dataset.mean), (0.5,) * len(dataset.std)
    return replace(dataset, mean=mean, std=std)


def subsample(dataset: Dataset, fraction: float, seed: int) -> Dataset:
    """Keep a seeded, class-stratified ``fraction`` of both splits; mean/std stay the full dataset's."""
    if fraction >= 1:
        return dataset
    rng = np.random.default_rng([seed, 3])  # a stream of its own: not the partition's
    keep_train, keep_test = (_stratified(y.numpy(), fraction, rng) for y in (dataset.train_y, dataset.test_y))
    return replace(dataset, train_x=dataset.train_x[keep_train], train_y=dataset.train_y[keep_train],
                   test_x=dataset.test_x[keep_test], test_y=dataset.test_y[keep_test])


def _stratified(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> torch.Tensor:
    """Sorted indices of ``round(fraction · n_c)`` random samples of every class c (at least one)."""
    picks = [rng.choice(idx, max(1, round(fraction * len(idx))), replace=False)
             for idx in (np.flatnonzero(labels == c) for c in np.unique(labels))]
    return torch.from_numpy(np.sort(np.concatenate(picks)))


def _pixel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images on the [0, 1] scale."""
    scaled = x.float().div_(255).transpose(0, 1).reshape(x.shape[1], -1)
    return tuple(scaled.mean(dim=1).tolist()), tuple(scaled.std(dim=1).tolist())
