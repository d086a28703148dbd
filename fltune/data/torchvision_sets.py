"""Fashion-MNIST from its idx files (Debian's flat ``dataset-fashion-mnist`` directory works offline), and
MNIST, EMNIST letters, CIFAR and SVHN through torchvision's classes and on-disk formats, each file checked."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fltune.catalog import NUM_CLASSES
from fltune.data.files import HOW_TO_REPLACE, Splits, check_md5_files, damaged, read_bytes
from fltune.data.locations import WHERE, default_root, missing

_FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_FMNIST_REPLACE = f"{HOW_TO_REPLACE} (Debian's copy: apt-get install --reinstall dataset-fashion-mnist)"


# --- Fashion-MNIST: idx files, flat (Debian) or torchvision layout ------------------------------------


def load_fmnist(root: Path | None, download: bool) -> Splits:
    """Read the four idx(.gz) files from the first directory of ``locations.WHERE`` that holds them all."""
    base = root or default_root()
    dirs, how = WHERE["fmnist"](root)
    found = next((d for d in dirs if all(_idx_path(d, f) for f in _FMNIST_FILES)), None)
    if found is None and download:
        from torchvision.datasets import FashionMNIST

        _torchvision_splits("fmnist", base, lambda r, t: FashionMNIST(r, train=t, download=True), lambda ds: ())
        found = dirs[-1]
    if found is None:
        raise missing("fmnist", dirs, how)
    paths = [_idx_path(found, f) for f in _FMNIST_FILES]
    arrays = [_read_idx(path, shape, _FMNIST_REPLACE) for path, shape in zip(paths, _IDX_SHAPES * 2)]
    for (images, labels), (images_path, labels_path) in zip((arrays[:2], arrays[2:]), (paths[:2], paths[2:])):
        _check_pair(images, labels, images_path, labels_path, NUM_CLASSES["fmnist"], _FMNIST_REPLACE)
    train_x, train_y, test_x, test_y = (torch.from_numpy(a) for a in arrays)
    return train_x.unsqueeze(1), train_y, test_x.unsqueeze(1), test_y


_IDX_SHAPES = ((28, 28), ())  # an image file's item shape, a label file's


def _idx_path(directory: Path, stem: str) -> Path | None:
    """``stem.gz`` or ``stem`` in ``directory``, whichever exists (a directory there is reported when read)."""
    return next((p for p in (directory / f"{stem}.gz", directory / stem) if p.exists()), None)


def _read_idx(path: Path, item_shape: tuple[int, ...], how: str) -> np.ndarray:
    """Parse an idx file of unsigned bytes into an array, checking magic ``00 00 08 d``, the d sizes against
    the payload, and ``item_shape``."""
    data = read_bytes(path, how)
    magic = bytes([0, 0, 8, 1 + len(item_shape)])  # unsigned bytes, 1 + item dimensions
    if not data:
        raise damaged(path, "is empty", how)
    if data[:4] != magic:
        raise damaged(path, f"starts {data[:4].hex(' ')}, not the idx magic number {magic.hex(' ')} "
                             f"({1 + len(item_shape)}-d unsigned bytes)", how)
    header = 4 + 4 * data[3]
    if len(data) < header:
        raise damaged(path, "is truncated (inside its idx header)", how)
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=data[3], offset=4))
    expected = header + math.prod(dims)
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "trailing bytes"
        raise damaged(path, f"holds {len(data)} bytes but its header {dims} announces {expected} ({problem})", how)
    if dims[1:] != item_shape:
        raise damaged(path, f"holds items of shape {dims[1:]}, expected {item_shape}", how)
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


def _check_pair(images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path, num_classes: int,
                how: str) -> None:
    """An image file and its label file describe the same samples, labelled 0..num_classes-1."""
    if len(images) != len(labels):
        raise damaged(labels_path, f"has {len(labels)} labels but {images_path.name} has {len(images)} images",
                       how)
    if len(labels) and labels.max() >= num_classes:
        raise damaged(labels_path, f"holds label {labels.max()}; allowed 0..{num_classes - 1}", how)


# --- torchvision-format datasets -----------------------------------------------------------------------


def _check_idx_files(folder: Path, stems: Sequence[str]) -> None:
    """Parse the existing idx files torchvision will read, naming file and fault where it would assert."""
    for stem, shape in zip(stems, _IDX_SHAPES * 2):
        if (folder / stem).exists():
            _read_idx(folder / stem, shape, HOW_TO_REPLACE)


def _torchvision_splits(name: str, root: Path, make: Callable[[str, bool], Any],
                        tensors: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]) -> Splits:
    """``tensors(make(root, train))`` for the train and test split; "not found" or a failed download →
    DatasetMissing naming where it looked, in fltune's words (a failed download's reason is kept)."""
    looked_in, how = WHERE[name](root)
    try:
        splits = make(str(root), True), make(str(root), False)
    except OSError as err:
        raise missing(name, looked_in, how, err) from err
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted. You can use download=True …"
        raise missing(name, looked_in, how) from err
    return tuple(tensor for split in splits for tensor in tensors(split))


def load_mnist(root: Path | None, download: bool) -> Splits:
    from torchvision.datasets import MNIST

    root = root or default_root()
    _check_idx_files(root / "MNIST" / "raw", _FMNIST_FILES)  # MNIST and Fashion-MNIST share file names
    return _torchvision_splits("mnist", root, lambda r, t: MNIST(r, train=t, download=download),
                               lambda ds: (ds.data.unsqueeze(1), ds.targets))


def load_emnist_letters(root: Path | None, download: bool) -> Splits:
    """EMNIST "letters", first 10 letters a–j as labels 0..9 (SimFAFL, ``haozzh/FedCR``)."""
    from torchvision.datasets import EMNIST

    root = root or default_root()
    _check_idx_files(root / "EMNIST" / "raw", [f"emnist-letters-{split}-{kind}" for split in ("train", "test")
                                               for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")])
    return _torchvision_splits("emnist_letters", root,
                               lambda r, t: EMNIST(r, split="letters", train=t, download=download), _a_to_j)


def _a_to_j(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The letters a–j (labels 1..10) as 0..9, transposed upright as MNIST."""
    keep = ds.targets <= 10
    return ds.data[keep].transpose(1, 2).unsqueeze(1), ds.targets[keep] - 1


def load_cifar(class_name: str, folder: str, root: Path | None, download: bool) -> Splits:
    """CIFAR-10/100 (torchvision's class ``class_name``: python pickle batches in ``folder``, HWC images)."""
    import torchvision.datasets

    root = root or default_root()
    cls = getattr(torchvision.datasets, class_name)
    check_md5_files(root / folder, cls.train_list + cls.test_list)
    return _torchvision_splits(class_name.lower(), root, lambda r, t: cls(r, train=t, download=download),
                               lambda ds: (torch.from_numpy(ds.data).permute(0, 3, 1, 2), torch.tensor(ds.targets)))


def load_svhn(root: Path | None, download: bool) -> Splits:
    """SVHN cropped digits (``train_32x32.mat``/``test_32x32.mat``; torchvision maps label 10 to 0)."""
    from torchvision.datasets import SVHN

    root = root or default_root()
    check_md5_files(root, [SVHN.split_list[split][1:] for split in ("train", "test")])
    return _torchvision_splits("svhn", root, lambda r, t: SVHN(r, split="train" if t else "test", download=download),
                               lambda ds: (torch.from_numpy(ds.data), torch.from_numpy(ds.labels.astype(np.int64))))
