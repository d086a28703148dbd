"""Image-folder trees (CINIC-10's ``train/<class>/*.png``, Tiny-ImageNet-200's cs231n zip), decoded once
into a uint8 cache file beside them."""

from __future__ import annotations

import hashlib
import os
import tarfile
import zipfile
import zlib
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fltune.catalog import NUM_CLASSES
from fltune.data.locations import Splits, damaged, default_root, missing
from fltune.folders import ReplaceOnClose

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
    if found is None and download:
        _download_tree(tree, dirs, into)
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


def _download_tree(tree: _ImageTree, dirs: list[Path], into: Path) -> None:
    """Fetch ``tree``'s archive into ``into`` and extract it there, in two steps to tell a failed download
    (DatasetMissing) from a bad archive (DatasetCorrupt). A partial download is deleted: without an MD5
    torchvision would take it for complete next time."""
    from torchvision.datasets.utils import download_url, extract_archive

    archive = into / Path(tree.url).name
    try:
        download_url(tree.url, str(into), archive.name, md5=tree.md5)
    except (RuntimeError, OSError) as err:  # urllib: OSError; torchvision: RuntimeError when the MD5 differs
        archive.unlink(missing_ok=True)
        raise missing(tree.name, dirs, tree.how_to_get, err) from err
    try:
        extract_archive(str(archive), str(into), remove_finished=True)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as err:
        raise damaged(archive, f"cannot be extracted ({' '.join(str(err).split())})",
                       "delete it and rerun with --set data.download=true (needs internet)") from err


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

