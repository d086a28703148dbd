"""FedSOL's Table 2 datasets from real files in a tmp dir: MedMNIST's .npz (PathMNIST, TissueMNIST) and
CINIC-10's image-folder tree with its decoded cache, plus their missing and damaged files."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fltune.data.datasets import DECODED_CACHE, load_dataset, release_loaded
from fltune.errors import DatasetCorrupt, DatasetMissing
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


# --- CINIC-10 ------------------------------------------------------------------------------------------

CLASSES = ("cat", "airplane")  # written unsorted: airplane is class 0, cat class 1
FILES = ("b.png", "a.png")  # written unsorted: a.png comes first


def _pixels(split: str, cls: str, file: str) -> np.ndarray:
    """A distinct image per file, so a test can see which file landed where."""
    seed = [("train", "test", "valid").index(split), CLASSES.index(cls), FILES.index(file)]
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def write_cinic(folder: Path) -> None:
    """CINIC-10's tarball layout with 2 classes × 2 PNGs per split (valid/ too, which is not read)."""
    for split in ("train", "valid", "test"):
        for cls in CLASSES:
            (folder / split / cls).mkdir(parents=True)
            for file in FILES:
                Image.fromarray(_pixels(split, cls, file)).save(folder / split / cls / file)


def expected_cinic(split: str) -> tuple[np.ndarray, list[int]]:
    """torchvision DatasetFolder's order: classes by name, then files by name."""
    order = [(cls, file) for cls in sorted(CLASSES) for file in sorted(FILES)]
    images = np.stack([_pixels(split, cls, file).transpose(2, 0, 1) for cls, file in order])
    return images, [sorted(CLASSES).index(cls) for cls, _ in order]


@pytest.mark.parametrize("layout", ["cinic10", "CINIC-10", ""])
def test_cinic10_reads_train_and_test_in_datasetfolder_order(tmp_path: Path, layout: str) -> None:
    write_cinic(tmp_path / layout)
    ds = load_dataset("cinic10", root=tmp_path)

    for x, y, split in ((ds.train_x, ds.train_y, "train"), (ds.test_x, ds.test_y, "test")):
        images, labels = expected_cinic(split)
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
        assert np.array_equal(x.numpy(), images) and y.tolist() == labels == [0, 0, 1, 1]
    assert ds.num_classes == 10 and ds.augment == "reflect_crop_flip"
    assert ds.mean == (0.47889522, 0.47227842, 0.43047404) and ds.std == (0.24205776, 0.23828046, 0.25874835)
    assert (tmp_path / layout / DECODED_CACHE).is_file()


def test_cinic10_grey_pngs_become_three_equal_channels(tmp_path: Path) -> None:
    write_cinic(tmp_path / "cinic10")
    grey = np.arange(32 * 32, dtype=np.uint32).reshape(32, 32).astype(np.uint8)
    Image.fromarray(grey, mode="L").save(tmp_path / "cinic10" / "test" / "airplane" / "a.png")
    ds = load_dataset("cinic10", root=tmp_path)
    assert all(np.array_equal(ds.test_x[0, c].numpy(), grey) for c in range(3))


def test_cinic10_second_load_reads_the_cache_until_the_listing_changes(tmp_path: Path) -> None:
    write_cinic(tmp_path / "cinic10")
    first = load_dataset("cinic10", root=tmp_path)
    cache = tmp_path / "cinic10" / DECODED_CACHE
    assert cache.is_file() and not list(cache.parent.glob("*.tmp"))

    # same name and size, undecodable: only a load from the cache still succeeds
    broken = tmp_path / "cinic10" / "train" / "cat" / "b.png"
    broken.write_bytes(b"\0" * broken.stat().st_size)
    release_loaded()
    second = load_dataset("cinic10", root=tmp_path)
    assert second is not first
    for a, b in ((first.train_x, second.train_x), (first.train_y, second.train_y), (first.test_x, second.test_x),
                 (first.test_y, second.test_y)):
        assert torch.equal(a, b)

    # a file added: the cache is stale, everything is decoded again (and the broken file is found)
    Image.fromarray(_pixels("train", "cat", "a.png")).save(tmp_path / "cinic10" / "train" / "cat" / "c.png")
    release_loaded()
    with pytest.raises(DatasetCorrupt, match=f"data.root: {broken} cannot be decoded as an image"):
        load_dataset("cinic10", root=tmp_path)


def test_cinic10_a_damaged_cache_is_decoded_again(tmp_path: Path) -> None:
    write_cinic(tmp_path / "cinic10")
    (tmp_path / "cinic10" / DECODED_CACHE).write_bytes(b"PK\3\4 cut off")
    ds = load_dataset("cinic10", root=tmp_path)
    assert np.array_equal(ds.train_x.numpy(), expected_cinic("train")[0])
    with np.load(tmp_path / "cinic10" / DECODED_CACHE) as npz:  # rewritten whole
        assert np.array_equal(npz["test_x"], expected_cinic("test")[0])


@pytest.mark.parametrize("damage, says", [("30x30", "is 30x30 pixels; CINIC-10 images are 32x32"),
                                          ("text", "cannot be decoded as an image")])
def test_a_bad_cinic10_image_is_one_line_naming_it(tmp_path: Path, damage: str, says: str) -> None:
    write_cinic(tmp_path / "cinic10")
    bad = tmp_path / "cinic10" / "test" / "cat" / "a.png"
    if damage == "text":
        bad.write_text("<html>404</html>")
    else:
        Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(bad)
    with pytest.raises(DatasetCorrupt) as err:
        load_dataset("cinic10", root=tmp_path)
    message = str(err.value)
    assert message.startswith(f"data.root: {bad} {says}") and "data.download=true" in message
    assert "\n" not in message and not (tmp_path / "cinic10" / DECODED_CACHE).exists()


def test_cinic10_splits_with_different_classes_are_corrupt(tmp_path: Path) -> None:
    write_cinic(tmp_path / "cinic10")
    (tmp_path / "cinic10" / "test" / "cat").rename(tmp_path / "cinic10" / "test" / "dog")
    with pytest.raises(DatasetCorrupt, match=r"cinic10/test holds class folders airplane, dog but train/ holds "
                                             r"airplane, cat"):
        load_dataset("cinic10", root=tmp_path)


def test_missing_cinic10_names_every_folder_looked_in(tmp_path: Path) -> None:
    (tmp_path / "cinic10" / "train").mkdir(parents=True)  # no test/: not CINIC-10
    with pytest.raises(DatasetMissing) as err:
        load_dataset("cinic10", root=tmp_path)
    message = str(err.value)
    assert f"cinic10 not found in {tmp_path / 'cinic10'}, {tmp_path / 'CINIC-10'}, {tmp_path};" in message
    assert "train/ and test/" in message and "data.download=true" in message and "\n" not in message
