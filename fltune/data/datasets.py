"""The datasets fltune trains on, by name, as raw uint8 NCHW tensors with their normalisation constants.

Images stay uint8 in memory (4x smaller than float32, shared by every Ray worker); ``augment.to_float``
normalises each batch. A missing or unusable file is one line, raised before any training: each file is checked
before torchvision reads it, since torchvision would only say "Dataset not found or corrupted".
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fltune.catalog import NUM_CLASSES
from fltune.data.locations import (
    HOW_TO_REPLACE, WHERE, Splits, check_md5_files, damaged, default_root, missing, read_bytes,
)
from fltune.errors import FLTuneError
from fltune.folders import ReplaceOnClose
from fltune.plugins import EXPECTED, is_reference, label, plugins, resolve, unknown


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


@dataclass(frozen=True)
class UserDataset:
    """What a dataset plug-in (``loader(root, download)``, ``fltune.plugins``) returns."""

    train: Any  # (images, labels): uint8 [N, C, H, W] or [N, H, W] or float in [0, 1]; or a dataset of (image, label)
    test: Any
    num_classes: int
    mean: Sequence[float] | None = None  # per channel on [0, 1]; None = the train split's
    std: Sequence[float] | None = None
    augment: str = "none"  # what data.augment: auto picks


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


# --- Fashion-MNIST: idx files, flat (Debian) or torchvision layout ------------------------------------

_FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_FMNIST_REPLACE = f"{HOW_TO_REPLACE} (Debian's copy: apt-get install --reinstall dataset-fashion-mnist)"


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
        if len(images) != len(labels):  # an image file and its label file describe the same samples
            raise damaged(labels_path, f"has {len(labels)} labels but {images_path.name} has {len(images)} images",
                          _FMNIST_REPLACE)
        if len(labels) and labels.max() >= NUM_CLASSES["fmnist"]:
            raise damaged(labels_path, f"holds label {labels.max()}; allowed 0..{NUM_CLASSES['fmnist'] - 1}",
                          _FMNIST_REPLACE)
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


# --- MedMNIST v2 (PathMNIST, TissueMNIST): one ``.npz`` per dataset, its arrays checked before use ---------


# The files as published (``medmnist/info.py``, v2.1 to v3.0; Zenodo 6496656 and 10519652 hold the same 28×28 files):
# each one's MD5 and one image's shape in it (H, W or H, W, C).
_MEDMNIST_URL = "https://zenodo.org/records/10519652/files/{}.npz?download=1"
_MEDMNIST = {"pathmnist": ("a8b06965200029087d5bd730944a56c1", (28, 28, 3)),
             "tissuemnist": ("ebe78ee8b05294063de985d821c1c34b", (28, 28))}
_MEDMNIST_SPLITS = ("train", "val", "test")


def load_medmnist(name: str, root: Path | None, download: bool) -> Splits:
    """A MedMNIST v2 ``.npz``, read as FedSOL's code reads it (``train_tools/preprocessing/medmnist``). Train is the
    file's train then val images (FedSOL trains on both). Images keep the file's channels (FedSOL's 3 equal TissueMNIST
    channels span the same function class). An existing file is not hashed but checked (CRC-32, keys, dtypes, shapes,
    labels), so a re-saved file still loads."""
    looked_in, how = WHERE[name](root)
    md5, image_shape = _MEDMNIST[name]
    found = next((p for p in looked_in if p.exists()), None)
    if found is None and download:
        found = _fetch(_MEDMNIST_URL.format(name), md5, looked_in[0], name, looked_in, how)
    if found is None:
        raise missing(name, looked_in, how)
    keys = [f"{split}_{kind}" for split in _MEDMNIST_SPLITS for kind in ("images", "labels")]
    arrays = _read_npz(found, keys, HOW_TO_REPLACE)
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = (
        _medmnist_split(found, arrays, split, image_shape, NUM_CLASSES[name]) for split in _MEDMNIST_SPLITS)
    out: list[torch.Tensor] = []
    for x, y in ((np.concatenate([train_x, val_x]), np.concatenate([train_y, val_y])), (test_x, test_y)):
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)  # NHW or NHWC → NCHW
        out += [torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)]
    return tuple(out)


def _read_npz(path: Path, keys: Sequence[str], how: str) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` file, CRC-32 checked; a damaged file is one line naming the fault."""
    try:
        with zipfile.ZipFile(path) as archive:
            held = sorted(n.removesuffix(".npy") for n in archive.namelist())
            if absent := [key for key in keys if key not in held]:
                raise damaged(path, f"lacks the array(s) {', '.join(absent)} (it holds {', '.join(held) or 'none'})",
                               how)
            return {key: _read_npy(path, key, archive.read(f"{key}.npy"), how) for key in keys}
    except zipfile.BadZipFile as err:  # an HTML error page, cut off (no central directory), a bad CRC-32
        raise damaged(path, f"is damaged or not an npz (zip) file ({err})", how) from err
    except (zlib.error, EOFError) as err:  # a compressed member's data damaged or cut short
        raise damaged(path, f"has damaged compressed data ({err})", how) from err
    except OSError as err:  # permission denied, a directory, an I/O error
        raise damaged(path, f"cannot be read ({err.strerror or err})", how) from err


def _read_npy(path: Path, key: str, data: bytes, how: str) -> np.ndarray:
    """One member's array; not ``.npy`` data, an object array or a short payload → one DatasetCorrupt line."""
    try:
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError) as err:
        raise damaged(path, f"holds a {key} that is not a numeric .npy array ({' '.join(str(err).split())})",
                       how) from err


def _medmnist_split(path: Path, arrays: dict[str, np.ndarray], split: str, image_shape: tuple[int, ...],
                    num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One split's uint8 images [N, *image_shape] and int64 labels [N], checked against each other."""
    images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    if images.dtype != np.uint8 or images.shape[1:] != image_shape:
        raise damaged(path, f"holds {split}_images of {images.dtype} {list(images.shape)}; expected uint8 "
                             f"[N, {', '.join(map(str, image_shape))}]", HOW_TO_REPLACE)
    if not np.issubdtype(labels.dtype, np.integer) or labels.shape not in ((len(images),), (len(images), 1)):
        raise damaged(path, f"holds {split}_labels of {labels.dtype} {list(labels.shape)} for {len(images)} "
                             f"{split}_images; expected integers [{len(images)}, 1]", HOW_TO_REPLACE)
    labels = labels.ravel().astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels.min() if labels.min() < 0 else labels.max()
        raise damaged(path, f"holds label {bad} in {split}_labels; allowed 0..{num_classes - 1}", HOW_TO_REPLACE)
    return images, labels


def _fetch(url: str, md5: str | None, path: Path, name: str, looked_in: list[Path], how: str) -> Path:
    """Download ``url`` to ``path`` via a ``.part`` file, moved into place only whole and matching ``md5`` (when
    published): ``download_url`` would leave a partial or mismatching file that looks complete next time."""
    from torchvision.datasets.utils import download_url

    part = path.with_name(f"{path.name}.part")
    try:
        download_url(url, str(path.parent), part.name, md5=md5)
    except (RuntimeError, OSError) as err:  # urllib: OSError; torchvision: RuntimeError when the MD5 differs
        mismatch = isinstance(err, RuntimeError) and part.is_file()
        part.unlink(missing_ok=True)
        if mismatch:
            raise damaged(path, f"as downloaded from {url} does not match its published MD5 {md5} "
                                 "(not kept)", "rerun to download it again, or copy a good file there") from err
        raise missing(name, looked_in, how, err) from err
    os.replace(part, path)
    return path


# --- image-folder trees: CINIC-10 and Tiny-ImageNet share the code -----------------------------------------

DECODED_CACHE = "fltune-uint8.npz"
_CACHE_KEYS = ("train_x", "train_y", "test_x", "test_y")  # whatever the dataset calls its test folder
Samples = list[tuple[str, int]]  # (image path, class index), in torchvision DatasetFolder's order


@dataclass(frozen=True)
class _ImageTree:
    """A dataset published as one archive of image folders (CINIC-10, Tiny-ImageNet share the code)."""

    name: str  # fltune's name (DatasetMissing lines, NUM_CLASSES)
    title: str  # the name its authors print (DatasetCorrupt lines)
    splits: tuple[str, str]  # its train and test folders
    size: int  # its images are RGB size×size
    url: str  # the archive, extracted as published
    md5: str | None  # the archive's published MD5 (None: it publishes none)
    holding: str  # what a data.root folder must hold, in the how-to-get line

    @property
    def how_to_get(self) -> str:
        return (f"pass --set data.root=DIR holding {self.holding} ({self.url} extracted), "
                "or --set data.download=true (needs internet)")

    @property
    def how_to_replace(self) -> str:
        return (f"extract a good copy from {self.url} over it, or delete the dataset's folder and rerun "
                "with --set data.download=true (needs internet)")


def _find_tree(tree: _ImageTree, dirs: list[Path], download: bool, into: Path) -> Path:
    """The first of ``dirs`` holding both split folders; else, with ``download``, the archive extracted into
    ``into`` (which must fill ``dirs[0]``)."""
    found = next((d for d in dirs if _holds(d, tree)), None)
    if found is None and download:  # fetched, then extracted: a failed download (DatasetMissing) is no bad archive
        from torchvision.datasets.utils import extract_archive

        archive = _fetch(tree.url, tree.md5, into / Path(tree.url).name, tree.name, dirs, tree.how_to_get)
        try:
            extract_archive(str(archive), str(into), remove_finished=True)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as err:
            raise damaged(archive, f"cannot be extracted ({' '.join(str(err).split())})",
                          "delete it and rerun with --set data.download=true (needs internet)") from err
        if not _holds(dirs[0], tree):
            folders = " and ".join(f"{split}/" for split in tree.splits)
            raise missing(tree.name, dirs, tree.how_to_get,
                           FileNotFoundError(f"{tree.url} extracted no {folders} into {dirs[0]}"))
        found = dirs[0]
    if found is None:
        raise missing(tree.name, dirs, tree.how_to_get)
    return found


def _holds(folder: Path, tree: _ImageTree) -> bool:
    return all((folder / split).is_dir() for split in tree.splits)


def _image_folder(folder: Path, tree: _ImageTree) -> tuple[list[str], Samples]:
    """torchvision ``DatasetFolder``'s classes and (path, class index) samples of ``folder``, in its order
    (at any depth, so Tiny-ImageNet's ``<wnid>/images/*.JPEG`` are found)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    try:
        classes, class_to_idx = find_classes(folder)
        samples = make_dataset(folder, class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as err:  # no class folder, or a class folder without images
        raise damaged(folder, f"is not a {tree.title} split ({err})", tree.how_to_replace) from err
    except OSError as err:
        raise damaged(folder, f"cannot be read ({err.strerror or err})", tree.how_to_replace) from err
    return classes, samples


def _check_class_count(folder: Path, classes: list[str], tree: _ImageTree) -> None:
    """More class folders than the dataset has classes are refused: a stray folder shifts every label after it."""
    if len(classes) > NUM_CLASSES[tree.name]:
        raise damaged(folder, f"holds {len(classes)} class folders; {tree.title} has {NUM_CLASSES[tree.name]}",
                       tree.how_to_replace)


def _decoded(folder: Path, train: Samples, test: Samples, tree: _ImageTree) -> Splits:
    """train_x, train_y, test_x, test_y of the samples, from ``folder/fltune-uint8.npz`` when it holds them. The cache
    (uncompressed, for fast loads) records a digest of the listing it was decoded from (every sample's path, size and
    label); one whose digest differs or that cannot be read is decoded again and rewritten, whole or not at all
    (``folders.ReplaceOnClose``). A read-only folder is decoded on every load."""
    cache, digest = folder / DECODED_CACHE, _listing_digest(folder, train + test, tree.how_to_replace)
    arrays = _read_decoded_cache(cache, digest, tree.size)
    if arrays is None:
        arrays = [*_decode_rgb(train, tree), *_decode_rgb(test, tree)]
        with suppress(OSError), ReplaceOnClose(str(cache)) as f:  # read-only or full: go on without a cache
            np.savez(f, listing=np.array(digest), **dict(zip(_CACHE_KEYS, arrays)))
    return tuple(torch.from_numpy(a) for a in arrays)


def _listing_digest(folder: Path, samples: Samples, how: str) -> str:
    """SHA-256 of every sample's path (relative to ``folder``), size in bytes and label."""
    digest = hashlib.sha256()
    for path, label in samples:
        try:
            size = os.stat(path).st_size
        except OSError as err:  # a dangling link
            raise damaged(Path(path), f"cannot be read ({err.strerror or err})", how) from err
        digest.update(os.fsencode(os.path.relpath(path, folder)) + f"\0{size}\0{label}\n".encode())
    return digest.hexdigest()


def _read_decoded_cache(cache: Path, digest: str, size: int) -> list[np.ndarray] | None:
    """The cached splits if ``cache`` is a whole cache of this listing, else None."""
    try:
        with np.load(cache, allow_pickle=False) as npz:
            if str(npz["listing"]) != digest:
                return None
            arrays = [npz[key] for key in _CACHE_KEYS]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
    for x, y in (arrays[:2], arrays[2:]):
        if x.dtype != np.uint8 or x.shape[1:] != (3, size, size) or y.dtype != np.int64 or y.shape != (len(x),):
            return None
    return arrays


def _decode_rgb(samples: Samples, tree: _ImageTree) -> tuple[np.ndarray, np.ndarray]:
    """The samples' images as uint8 [N, 3, size, size] and their labels; ``convert("RGB")`` as torchvision's
    loader in FedSOL's and MAN's code (a grey image gets 3 equal channels)."""
    from PIL import Image
    from rich.console import Console
    from rich.progress import track

    images = np.empty((len(samples), 3, tree.size, tree.size), dtype=np.uint8)
    shown = Console(stderr=True)  # a bar in a terminal, nothing in a log
    for i, (path, _) in enumerate(track(samples, f"decoding {len(samples):,} {tree.title} images (once: cached)",
                                        console=shown, transient=True, disable=not shown.is_terminal)):
        try:
            with Image.open(path) as image:
                if image.size != (tree.size, tree.size):
                    raise damaged(Path(path), f"is {image.width}x{image.height} pixels; {tree.title} images are "
                                               f"{tree.size}x{tree.size}", tree.how_to_replace)
                images[i] = np.asarray(image.convert("RGB")).transpose(2, 0, 1)
        except (OSError, SyntaxError, ValueError) as err:  # PIL: not an image, cut off, a broken chunk
            reason = " ".join(str(err).split())
            raise damaged(Path(path), f"cannot be decoded as an image ({reason})", tree.how_to_replace) from err
    return images, np.array([label for _, label in samples], dtype=np.int64)


# --- CINIC-10: train/<class>/*.png and test/<class>/*.png ----------------------------------------------

CINIC10_URL = "https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz"
_CINIC10 = _ImageTree("cinic10", "CINIC-10", ("train", "test"), 32, CINIC10_URL, None,  # it publishes no MD5
                      "CINIC-10's train/ and test/ folders")  # valid/ is not used, as in FedSOL's code


def load_cinic10(root: Path | None, download: bool) -> Splits:
    """CINIC-10 as FedSOL's code reads it: ``train/`` and ``test/``, RGB 32×32, in ``DatasetFolder`` order, from
    ``<root>/cinic10`` (FedSOL's layout, where a download extracts), ``<root>/CINIC-10`` or ``<root>``."""
    base = root or default_root()
    dirs = [base / "cinic10", base / "CINIC-10", base]
    found = _find_tree(_CINIC10, dirs, download, dirs[0])
    (train_classes, train), (test_classes, test) = (_image_folder(found / split, _CINIC10)
                                                    for split in _CINIC10.splits)
    if test_classes != train_classes:  # a class index must mean the same class in both splits
        raise damaged(found / "test", f"holds class folders {', '.join(test_classes)} but train/ holds "
                                       f"{', '.join(train_classes)}", _CINIC10.how_to_replace)
    _check_class_count(found / "train", train_classes, _CINIC10)
    return _decoded(found, train, test, _CINIC10)


# --- Tiny-ImageNet-200: train/<wnid>/images/*.JPEG, val/images/*.JPEG labelled by val_annotations.txt ----

TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TINYIMAGENET = _ImageTree("tinyimagenet", "Tiny-ImageNet", ("train", "val"), 64, TINYIMAGENET_URL,
                           "90528d7ca1a48142e341f4ef8d21d0de", "tiny-imagenet-200/")  # test/ is unlabelled


def load_tinyimagenet(root: Path | None, download: bool) -> Splits:
    """Tiny-ImageNet-200 as MAN's code reads it: ``train/`` trains, ``val/`` tests. From ``<root>/tiny-imagenet-200``
    (where a download extracts), ``<root>/tinyimagenet`` or ``<root>``. Train samples in ``ImageFolder`` order; val
    images labelled by ``val/val_annotations.txt`` through the same wnid → index map, by file name, from ``val/images/``
    or ``val/images/<wnid>/`` (MAN's layout)."""
    base = root or default_root()
    found = _find_tree(_TINYIMAGENET, [base / "tiny-imagenet-200", base / "tinyimagenet", base], download, base)
    classes, train = _image_folder(found / "train", _TINYIMAGENET)
    _check_class_count(found / "train", classes, _TINYIMAGENET)
    return _decoded(found, train, _tinyimagenet_val(found / "val", classes), _TINYIMAGENET)


def _tinyimagenet_val(folder: Path, classes: list[str]) -> Samples:
    """The val split's (path, class index) samples by file name, from ``val_annotations.txt``; a bad line or
    missing file → one DatasetCorrupt line."""
    annotations, how = folder / "val_annotations.txt", _TINYIMAGENET.how_to_replace
    try:
        lines = annotations.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as err:
        raise damaged(annotations, "is missing (it labels the val images)", how) from err
    except UnicodeDecodeError as err:
        raise damaged(annotations, f"is not UTF-8 text ({err.reason})", how) from err
    except OSError as err:
        raise damaged(annotations, f"cannot be read ({err.strerror or err})", how) from err
    index = {wnid: i for i, wnid in enumerate(classes)}
    samples: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        file, wnid, *_ = [*line.split("\t"), ""]
        if not file or not wnid or Path(file).name != file:
            raise damaged(annotations, f"line {number} is not a file name, a tab and a wnid", how)
        if wnid not in index:
            raise damaged(annotations, f"line {number} names {wnid}, which has no folder in {folder.parent / 'train'}",
                           how)
        if file in samples:
            raise damaged(annotations, f"line {number} names {file} a second time", how)
        path = next((p for p in (folder / "images" / file, folder / "images" / wnid / file) if p.is_file()), None)
        if path is None:
            raise damaged(annotations, f"line {number} names {file}, which is neither in {folder / 'images'} nor in "
                                        f"{folder / 'images' / wnid}", how)
        samples[file] = (str(path), index[wnid])
    if not samples:
        raise damaged(annotations, "labels no images", how)
    return [samples[file] for file in sorted(samples)]


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
    """Load and wrap one dataset, built-in or the user's (:func:`_load_user`)."""
    if name not in _SPECS:
        return _load_user(name, root, download)
    spec = _SPECS[name]
    train_x, train_y, test_x, test_y = spec.load(None if root is None else Path(root), download)
    mean, std = (spec.mean, spec.std) if spec.mean is not None else _pixel_stats(train_x)
    return Dataset(name, train_x.contiguous(), train_y.long(), test_x.contiguous(), test_y.long(),
                   NUM_CLASSES[name], mean, std, spec.augment)


def _load_user(name: str, root: str | None, download: bool) -> Dataset:
    """The plug-in ``name`` called, its splits made uint8 NCHW and int64 like every built-in's."""
    answer = resolve("dataset", name)(None if root is None else Path(root), download)
    if not isinstance(answer, UserDataset):
        raise FLTuneError(f"data.dataset: {name!r} returned a {type(answer).__name__}; expected "
                          f"{EXPECTED['dataset']}")
    train_x, train_y = _user_split(name, "train", answer.train, answer.num_classes)
    test_x, test_y = _user_split(name, "test", answer.test, answer.num_classes)
    mean, std = (tuple(answer.mean), tuple(answer.std)) if answer.mean and answer.std else _pixel_stats(train_x)
    return Dataset(label(name), train_x, train_y, test_x, test_y, answer.num_classes, mean, std, answer.augment)


def _user_split(name: str, split: str, data: Any, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One split of a plug-in's as uint8 [N, C, H, W] images and int64 labels in [0, num_classes)."""
    if isinstance(data, tuple) and len(data) == 2:
        x, y = torch.as_tensor(data[0]), torch.as_tensor(data[1])
    else:
        pairs = [data[i] for i in range(len(data))]
        x = torch.stack([_chw(image) for image, _ in pairs])
        y = torch.as_tensor([int(target) for _, target in pairs])
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.is_floating_point():
        x = (x.clamp(0, 1) * 255).round()
    if x.dim() != 4 or len(x) != len(y) or len(x) == 0:
        raise FLTuneError(f"data.dataset: {name!r}: its {split} split has images of shape {tuple(x.shape)} and "
                          f"{len(y)} labels; expected [N, C, H, W] images and N labels, N > 0")
    if y.min() < 0 or y.max() >= num_classes:
        raise FLTuneError(f"data.dataset: {name!r}: its {split} labels lie in [{int(y.min())}, {int(y.max())}]; "
                          f"expected integers in [0, {num_classes}) (its num_classes)")
    return x.to(torch.uint8).contiguous(), y.long()


def _chw(image: Any) -> torch.Tensor:
    """A PIL image, HWC/HW array or CHW tensor as a [C, H, W] tensor (a float tensor stays on [0, 1])."""
    if isinstance(image, torch.Tensor):
        return image if image.dim() == 3 else image.unsqueeze(0)
    array = np.asarray(image)
    return torch.from_numpy(array.copy()).unsqueeze(0) if array.ndim == 2 else torch.from_numpy(
        array.transpose(2, 0, 1).copy())


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
