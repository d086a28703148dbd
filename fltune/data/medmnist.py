"""MedMNIST v2 (PathMNIST, TissueMNIST): one ``.npz`` per dataset, its arrays checked before use."""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fltune.catalog import NUM_CLASSES
from fltune.data.files import HOW_TO_REPLACE, Splits, damaged
from fltune.data.locations import WHERE, missing


@dataclass(frozen=True)
class _MedMNIST:
    """A MedMNIST v2 file as published (``medmnist/info.py``, v2.1 to v3.0; Zenodo 6496656 and 10519652 hold
    the same 28×28 files) and one image's shape in it (H, W or H, W, C)."""

    url: str
    md5: str
    image_shape: tuple[int, ...]


_MEDMNIST: dict[str, _MedMNIST] = {
    "pathmnist": _MedMNIST("https://zenodo.org/records/10519652/files/pathmnist.npz?download=1",
                           "a8b06965200029087d5bd730944a56c1", (28, 28, 3)),
    "tissuemnist": _MedMNIST("https://zenodo.org/records/10519652/files/tissuemnist.npz?download=1",
                             "ebe78ee8b05294063de985d821c1c34b", (28, 28)),
}
_MEDMNIST_SPLITS = ("train", "val", "test")


def load_medmnist(name: str, root: Path | None, download: bool) -> Splits:
    """A MedMNIST v2 ``.npz``, read as FedSOL's code reads it (``train_tools/preprocessing/medmnist``). Train is the
    file's train then val images (FedSOL trains on both). Images keep the file's channels (FedSOL's 3 equal TissueMNIST
    channels span the same function class). An existing file is not hashed but checked (CRC-32, keys, dtypes, shapes,
    labels), so a re-saved file still loads."""
    looked_in, how = WHERE[name](root)
    found = next((p for p in looked_in if p.exists()), None)
    if found is None and download:
        found = _download_medmnist(name, looked_in)
    if found is None:
        raise missing(name, looked_in, how)
    keys = [f"{split}_{kind}" for split in _MEDMNIST_SPLITS for kind in ("images", "labels")]
    arrays = _read_npz(found, keys, HOW_TO_REPLACE)
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = (
        _medmnist_split(found, arrays, split, _MEDMNIST[name].image_shape, NUM_CLASSES[name])
        for split in _MEDMNIST_SPLITS)
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


def _download_medmnist(name: str, looked_in: list[Path]) -> Path:
    """Fetch ``<root>/<name>.npz`` from Zenodo via a ``.part`` file, moved into place only once its MD5
    matches (``download_url`` would leave a mismatching file in place)."""
    from torchvision.datasets.utils import download_url

    info, path = _MEDMNIST[name], looked_in[0]
    part = path.with_name(f"{path.name}.part")
    try:
        download_url(info.url, str(path.parent), part.name, md5=info.md5)
    except (RuntimeError, OSError) as err:  # urllib: OSError; torchvision: RuntimeError when the MD5 differs
        mismatch = isinstance(err, RuntimeError) and part.is_file()
        part.unlink(missing_ok=True)
        if mismatch:
            raise damaged(path, f"as downloaded from {info.url} does not match its published MD5 {info.md5} "
                                 "(not kept)", "rerun to download it again, or copy a good file there") from err
        raise missing(name, looked_in, WHERE[name](None)[1], err) from err
    os.replace(part, path)
    return path

