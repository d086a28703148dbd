"""MedMNIST v2 (data/datasets.py, FedSOL's Table 2) from real .npz files in a tmp dir: PathMNIST, TissueMNIST,
their missing and damaged files."""


from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fltune.data.datasets import load_dataset, release_loaded
from fltune.errors import DatasetMissing
from tests.data.conftest import corrupt_line

RNG = np.random.default_rng(0)
COUNTS = {"train": 6, "val": 3, "test": 4}


def medmnist_arrays(channels: int, num_classes: int) -> dict[str, np.ndarray]:
    """MedMNIST v2's keys: uint8 images [N, 28, 28] (grey) or [N, 28, 28, 3], uint8 labels [N, 1]."""
    shape = (28, 28) if channels == 1 else (28, 28, channels)
    arrays = {}
    for split, n in COUNTS.items():
        arrays[f"{split}_images"] = RNG.integers(0, 256, (n, *shape), dtype=np.uint8)
        arrays[f"{split}_labels"] = (RNG.permutation(n) % num_classes).astype(np.uint8)[:, None]
    return arrays


def write_npz(path: Path, arrays: dict[str, np.ndarray], compressed: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


@pytest.mark.parametrize("name, channels, num_classes", [("pathmnist", 3, 9), ("tissuemnist", 1, 8)])
def test_medmnist_train_is_train_then_val_test_is_test(tmp_path: Path, name: str, channels: int,
                                                       num_classes: int) -> None:
    arrays = medmnist_arrays(channels, num_classes)
    write_npz(tmp_path / f"{name}.npz", arrays)
    ds = load_dataset(name, root=tmp_path)

    assert ds.train_x.shape == (9, channels, 28, 28) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (4, channels, 28, 28) and ds.train_y.dtype == ds.test_y.dtype == torch.int64
    nhwc = ds.train_x.permute(0, 2, 3, 1).numpy()
    expected = np.concatenate([arrays["train_images"], arrays["val_images"]])
    assert np.array_equal(nhwc, expected if channels == 3 else expected[..., None])
    assert ds.train_y.tolist() == np.concatenate([arrays["train_labels"], arrays["val_labels"]]).ravel().tolist()
    assert ds.test_y.tolist() == arrays["test_labels"].ravel().tolist()
    assert ds.num_classes == num_classes and ds.augment == "flip"
    assert ds.mean == (0.5,) * channels and ds.std == (0.5,) * channels


def test_medmnist_is_found_in_fedsols_medmnist_folder_after_the_root(tmp_path: Path) -> None:
    arrays = medmnist_arrays(3, 9)
    write_npz(tmp_path / "medmnist" / "pathmnist.npz", arrays, compressed=False)
    ds = load_dataset("pathmnist", root=tmp_path)
    assert np.array_equal(ds.test_x.permute(0, 2, 3, 1).numpy(), arrays["test_images"])

    release_loaded()
    flat = medmnist_arrays(3, 9)
    write_npz(tmp_path / "pathmnist.npz", flat)  # <root>/pathmnist.npz is looked at first
    assert np.array_equal(load_dataset("pathmnist", root=tmp_path).test_x.permute(0, 2, 3, 1).numpy(),
                          flat["test_images"])


def test_missing_medmnist_names_both_paths_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing) as err:
        load_dataset("tissuemnist", root=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "tissuemnist.npz") in message and str(tmp_path / "medmnist" / "tissuemnist.npz") in message
    assert "--set data.root=DIR holding tissuemnist.npz" in message and "data.download=true" in message
    assert "\n" not in message


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_data_byte(path: Path) -> None:
    """Change one pixel byte of an uncompressed member: the zip is whole but the member's CRC-32 fails."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("train_images.npy")
    data[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF  # past the local header and the npy header
    path.write_bytes(bytes(data))


def _rewrite(**changes: np.ndarray | None) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        with np.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files}
        for key, value in changes.items():
            if value is None:
                del arrays[key]
            else:
                arrays[key] = value
        write_npz(path, arrays, compressed=False)

    return rewrite


DAMAGE = {  # how pathmnist.npz gets damaged → what the one line must say
    "truncated download": (_truncate, "is damaged or not an npz (zip) file"),
    "an HTML error page": (lambda p: p.write_bytes(b"<html>404</html>"), "is damaged or not an npz (zip) file"),
    "empty": (lambda p: p.write_bytes(b""), "is damaged or not an npz (zip) file"),
    "a flipped byte": (_flip_a_data_byte, "Bad CRC-32"),
    "no val_labels": (_rewrite(val_labels=None), "lacks the array(s) val_labels"),
    "grey images": (_rewrite(test_images=np.zeros((4, 28, 28), np.uint8)), "holds test_images of uint8 [4, 28, 28]"),
    "float images": (_rewrite(val_images=np.zeros((3, 28, 28, 3))), "holds val_images of float64"),
    "a label short": (_rewrite(train_labels=np.zeros((5, 1), np.uint8)), "holds train_labels of uint8 [5, 1] for 6"),
    "label 9 of 9 classes": (_rewrite(test_labels=np.array([[0], [1], [9], [2]], np.uint8)),
                             "holds label 9 in test_labels; allowed 0..8"),
    "a negative label": (_rewrite(val_labels=np.array([[0], [-1], [2]])), "holds label -1 in val_labels"),
    "an object array": (_rewrite(test_labels=np.array([[0], [1], [2], [None]], dtype=object)),
                        "holds a test_labels that is not a numeric .npy array"),
    "a directory": (lambda p: (p.unlink(), p.mkdir()), "cannot be read"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_medmnist_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    path = write_npz(tmp_path / "pathmnist.npz", medmnist_arrays(3, 9), compressed=False)
    make, says = DAMAGE[damage]
    make(path)
    corrupt_line("pathmnist", tmp_path, path, says)
