"""Fashion-MNIST's idx files and the torchvision formats (data/datasets.py), written to a tmp dir: real
Fashion-MNIST, layouts, missing and damaged files, and a run on a damaged file."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fltune.cli import main
from fltune.data.datasets import load_dataset
from fltune.errors import DatasetCorrupt, DatasetMissing
from tests.data.conftest import corrupt_line

RNG = np.random.default_rng(0)
TRAIN_X, TEST_X = RNG.integers(0, 256, (12, 28, 28)), RNG.integers(0, 256, (4, 28, 28))
TRAIN_Y, TEST_Y = np.arange(12) % 10, np.arange(4)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the idx format of the MNIST family (gzipped if the name ends in .gz)."""
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _write_mnist_family(raw: Path, names: dict[str, np.ndarray], suffix: str = "") -> None:
    for name, array in names.items():
        write_idx(raw / f"{name}{suffix}", array)


MNIST_FILES = {"train-images-idx3-ubyte": TRAIN_X, "train-labels-idx1-ubyte": TRAIN_Y,
               "t10k-images-idx3-ubyte": TEST_X, "t10k-labels-idx1-ubyte": TEST_Y}


def test_real_fmnist_from_debian(fmnist) -> None:
    assert fmnist.train_x.shape == (60000, 1, 28, 28) and fmnist.train_x.dtype == torch.uint8
    assert fmnist.test_x.shape == (10000, 1, 28, 28) and fmnist.test_y.dtype == torch.int64
    assert torch.bincount(fmnist.train_y).tolist() == [6000] * 10
    assert fmnist.train_x.float().mean().item() / 255 == pytest.approx(fmnist.mean[0], abs=1e-3)
    assert fmnist.augment == "none" and fmnist.num_classes == 10
    assert load_dataset("fmnist") is load_dataset("fmnist")  # cached in-process


@pytest.mark.parametrize("layout, suffix", [("", ".gz"), ("fashion-mnist", ".gz"), ("FashionMNIST/raw", ""),
                                            ("FashionMNIST/raw", ".gz")])
def test_fmnist_from_a_root_flat_or_torchvision_layout(tmp_path: Path, layout: str, suffix: str) -> None:
    _write_mnist_family(tmp_path / layout, MNIST_FILES, suffix)
    ds = load_dataset("fmnist", root=tmp_path)

    assert np.array_equal(ds.train_x[:, 0].numpy(), TRAIN_X) and np.array_equal(ds.test_y.numpy(), TEST_Y)


def test_mnist_in_torchvision_raw_format_loads_without_download(tmp_path: Path) -> None:
    _write_mnist_family(tmp_path / "MNIST" / "raw", MNIST_FILES)
    ds = load_dataset("mnist", root=tmp_path)

    assert ds.train_x.shape == (12, 1, 28, 28) and ds.train_x.dtype == torch.uint8
    assert np.array_equal(ds.train_x[:, 0].numpy(), TRAIN_X)
    assert ds.test_y.dtype == torch.int64 and ds.test_y.tolist() == TEST_Y.tolist()
    assert ds.mean == (0.1307,)


def test_emnist_letters_keeps_a_to_j_as_0_to_9_upright(tmp_path: Path) -> None:
    """EMNIST files hold images transposed: a bar stored in column 0 is row 0 once upright."""
    bar = np.zeros((28, 28), dtype=np.uint8)
    bar[:, 0] = 255  # transposed storage of an image whose top row is white
    labels = np.array([1, 10, 11, 26])  # a, j, k, z
    raw = tmp_path / "EMNIST" / "raw"
    for split in ("train", "test"):
        write_idx(raw / f"emnist-letters-{split}-images-idx3-ubyte", np.stack([bar] * 4))
        write_idx(raw / f"emnist-letters-{split}-labels-idx1-ubyte", labels)
    ds = load_dataset("emnist_letters", root=tmp_path)

    assert ds.train_y.tolist() == [0, 9]
    assert (ds.train_x[:, 0, 0] == 255).all() and (ds.train_x[:, 0, 1:] == 0).all()


@pytest.mark.parametrize("name, expected", [("mnist", "MNIST/raw"), ("cifar10", "cifar-10-batches-py"),
                                            ("svhn", "train_32x32.mat")])
def test_missing_torchvision_files_name_the_paths(tmp_path: Path, name: str, expected: str) -> None:
    with pytest.raises(DatasetMissing) as err:
        load_dataset(name, root=tmp_path)
    message = str(err.value)
    assert str(tmp_path / expected) in message and "data.download" in message and "\n" not in message


def test_missing_fmnist_names_every_directory_and_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing) as err:
        load_dataset("fmnist", root=tmp_path)
    message = str(err.value)
    assert str(tmp_path) in message and str(tmp_path / "FashionMNIST" / "raw") in message
    assert "apt-get install dataset-fashion-mnist" in message



def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def _gz_of(payload: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(gzip.compress(payload))


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


IMAGES_HEADER = bytes([0, 0, 8, 3]) + np.array(TEST_X.shape, dtype=">i4").tobytes()
DAMAGE = {  # how a file gets damaged → what the one line must say
    "truncated download": (_truncate, "is truncated"),
    "not gzip (an HTML error page)": (lambda p: p.write_bytes(b"<html>404</html>"), "is not valid gzip data"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "wrong magic number": (_gz_of(b"\0\0\x09\x03" + IMAGES_HEADER[4:]), "not the idx magic number"),
    "a label file in its place": (_gz_of(bytes([0, 0, 8, 1, 0, 0, 0, 4]) + bytes(4)), "not the idx magic number"),
    "payload shorter than its header says": (_gz_of(IMAGES_HEADER + bytes(100)), "(truncated)"),
    "trailing bytes": (_gz_of(IMAGES_HEADER + TEST_X.astype(np.uint8).tobytes() + b"x"), "(trailing bytes)"),
    "a directory": (_directory, "cannot be read"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_fmnist_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    _write_mnist_family(tmp_path, MNIST_FILES, ".gz")
    broken = tmp_path / "t10k-images-idx3-ubyte.gz"
    make, says = DAMAGE[damage]
    make(broken)
    assert "dataset-fashion-mnist" in corrupt_line("fmnist", tmp_path, broken, says)  # how to get a good copy


@pytest.mark.parametrize("labels, says", [(TEST_Y[:3], "has 3 labels but t10k-images-idx3-ubyte.gz has 4 images"),
                                          (np.array([0, 1, 2, 10]), "holds label 10; allowed 0..9")])
def test_fmnist_labels_must_fit_their_images(tmp_path: Path, labels: np.ndarray, says: str) -> None:
    _write_mnist_family(tmp_path, {**MNIST_FILES, "t10k-labels-idx1-ubyte": labels}, ".gz")
    with pytest.raises(DatasetCorrupt, match=f"t10k-labels-idx1-ubyte.gz {says};"):
        load_dataset("fmnist", root=tmp_path)


def test_a_truncated_mnist_raw_file_is_named_before_torchvision_reads_it(tmp_path: Path) -> None:
    _write_mnist_family(tmp_path / "MNIST" / "raw", MNIST_FILES)
    _truncate(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte")
    with pytest.raises(DatasetCorrupt, match=r"MNIST/raw/train-images-idx3-ubyte holds 40 bytes but its header"):
        load_dataset("mnist", root=tmp_path)


@pytest.mark.parametrize("name, broken", [("cifar10", "cifar-10-batches-py/data_batch_1"),
                                          ("cifar100", "cifar-100-python/test"), ("svhn", "test_32x32.mat")])
def test_a_torchvision_file_with_the_wrong_checksum_is_named(tmp_path: Path, name: str, broken: str) -> None:
    """CIFAR's pickles and SVHN's .mat files have published MD5s; a cut-off or foreign file fails them."""
    (tmp_path / broken).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / broken).write_bytes(b"\x80\x04\x95 cut off")
    with pytest.raises(DatasetCorrupt) as err:
        load_dataset(name, root=tmp_path)
    message = str(err.value)
    assert f"{tmp_path / broken} does not match its published MD5 checksum" in message and "\n" not in message


def test_run_on_a_damaged_file_exits_2_with_one_line_and_logs_nothing(tmp_path: Path, capsys) -> None:
    _write_mnist_family(tmp_path / "data", MNIST_FILES, ".gz")
    _truncate(tmp_path / "data" / "train-images-idx3-ubyte.gz")
    store = tmp_path / "mlruns" / "mlflow.db"
    code = main(["run", "--method", "fedavg", "--data-root", str(tmp_path / "data"), "--rounds", "1",
                 "--set", f"tracking.uri=sqlite:///{store}"])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("fltune: data.root: ")
    assert "train-images-idx3-ubyte.gz is truncated" in err
    assert not store.exists()  # no MLflow run, not even a store
