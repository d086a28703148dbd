"""Image-folder trees (data/datasets.py) in a tmp dir. Tiny-ImageNet-200 (MAN's Table 1) from a small fake
``tiny-imagenet-200/`` tree laid out as the cs231n zip is: its class order, val labels, pixels, cache, the
layout MAN's code moves val/ into, a download from a local zip, and its missing and damaged files. CINIC-10
(FedSOL's Table 2): its image-folder tree with its decoded cache, its missing and damaged files."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets.utils
from PIL import Image

from fltune.data.augment import augment, to_float
from fltune.data.datasets import load_dataset, release_loaded
from fltune.data.datasets import DECODED_CACHE, TINYIMAGENET_URL
from fltune.errors import DatasetCorrupt, DatasetMissing
from tests.data.conftest import corrupt_line

WNIDS = ("n09999999", "n01443537", "n02124075")  # written unsorted: n01443537 is class 0
TRAIN_PER_CLASS = 2
VAL = {"val_3.JPEG": "n02124075", "val_0.JPEG": "n09999999", "val_10.JPEG": "n01443537",
       "val_2.JPEG": "n09999999"}  # by file name: val_0, val_10, val_2, val_3
GREY = ("train", "n02124075", 1)  # this one JPEG is greyscale (mode L), as some of Tiny-ImageNet's are


def _pixels(seed: tuple[int, ...], grey: bool = False) -> np.ndarray:
    """Smooth random images (JPEG keeps them close; the tests compare with PIL's own decoding anyway)."""
    small = np.random.default_rng(seed).integers(0, 256, (8, 8) if grey else (8, 8, 3), dtype=np.uint8)
    return np.kron(small, np.ones((8, 8) if grey else (8, 8, 1), np.uint8))


def write_tiny(folder: Path) -> Path:
    """The zip's layout: wnids.txt, train/<wnid>/images/<wnid>_<i>.JPEG and <wnid>_boxes.txt, val/images/ with
    val/val_annotations.txt (file, wnid, 4 box numbers, tab-separated), and an unlabelled test/."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    for c, wnid in enumerate(WNIDS):
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        for i in range(TRAIN_PER_CLASS):
            grey = GREY == ("train", wnid, i)
            Image.fromarray(_pixels((0, c, i), grey)).save(images / f"{wnid}_{i}.JPEG")
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
    (folder / "val" / "images").mkdir(parents=True)
    for i, file in enumerate(VAL):
        Image.fromarray(_pixels((1, i))).save(folder / "val" / "images" / file)
    (folder / "val" / "val_annotations.txt").write_text(
        "".join(f"{file}\t{wnid}\t1\t2\t60\t61\n" for file, wnid in VAL.items()))
    (folder / "test" / "images").mkdir(parents=True)
    Image.fromarray(_pixels((2, 0))).save(folder / "test" / "images" / "test_0.JPEG")
    return folder


def pil_rgb(path: Path) -> np.ndarray:
    """What torchvision's default loader makes of a file: PIL's ``convert("RGB")``, as [3, H, W]."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).transpose(2, 0, 1)


def expected_train(folder: Path) -> tuple[np.ndarray, list[int]]:
    """torchvision ImageFolder's order: wnids by name, then files by path."""
    order = [(wnid, i) for wnid in sorted(WNIDS) for i in range(TRAIN_PER_CLASS)]
    images = np.stack([pil_rgb(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG") for wnid, i in order])
    return images, [sorted(WNIDS).index(wnid) for wnid, _ in order]


def expected_val(folder: Path) -> tuple[np.ndarray, list[int]]:
    files = sorted(VAL)
    return (np.stack([pil_rgb(folder / "val" / "images" / file) for file in files]),
            [sorted(WNIDS).index(VAL[file]) for file in files])


@pytest.mark.parametrize("layout", ["tiny-imagenet-200", "tinyimagenet", ""])
def test_train_in_imagefolder_order_val_labelled_by_its_annotations(tmp_path: Path, layout: str) -> None:
    folder = write_tiny(tmp_path / layout)
    ds = load_dataset("tinyimagenet", root=tmp_path)

    for x, y, (images, labels) in ((ds.train_x, ds.train_y, expected_train(folder)),
                                   (ds.test_x, ds.test_y, expected_val(folder))):
        assert x.shape == (len(labels), 3, 64, 64) and x.dtype == torch.uint8 and y.dtype == torch.int64
        assert np.array_equal(x.numpy(), images) and y.tolist() == labels
    assert ds.train_y.tolist() == [0, 0, 1, 1, 2, 2]  # n01443537, n02124075, n09999999
    assert ds.test_y.tolist() == [2, 0, 2, 1]  # val_0 n09999999, val_10 n01443537, val_2, val_3 n02124075
    assert ds.num_classes == 200 and ds.augment == "flip_crop_half"
    assert ds.mean == (0.485, 0.456, 0.406) and ds.std == (0.229, 0.224, 0.225)
    assert (folder / DECODED_CACHE).is_file()


def test_a_grey_jpeg_becomes_three_equal_channels(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    _, wnid, i = GREY
    with Image.open(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG") as image:
        assert image.mode == "L"
        grey = np.asarray(image)
    ds = load_dataset("tinyimagenet", root=tmp_path)
    sample = ds.train_x[TRAIN_PER_CLASS * sorted(WNIDS).index(wnid) + i]
    assert all(np.array_equal(sample[c].numpy(), grey) for c in range(3))


def test_val_images_moved_into_wnid_folders_as_mans_code_does_load_the_same(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    flat = load_dataset("tinyimagenet", root=tmp_path)
    for file, wnid in VAL.items():  # MAN's code: val/images/<file> → val/images/<wnid>/<file>
        (folder / "val" / "images" / wnid).mkdir(exist_ok=True)
        (folder / "val" / "images" / file).rename(folder / "val" / "images" / wnid / file)
    release_loaded()
    moved = load_dataset("tinyimagenet", root=tmp_path)
    assert torch.equal(flat.test_x, moved.test_x) and torch.equal(flat.test_y, moved.test_y)
    assert torch.equal(flat.train_x, moved.train_x) and torch.equal(flat.train_y, moved.train_y)


def test_second_load_reads_the_cache_until_the_listing_changes(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    first = load_dataset("tinyimagenet", root=tmp_path)
    assert (folder / DECODED_CACHE).is_file() and not list(folder.glob(".*.part"))

    # same name and size, undecodable: only a load from the cache still succeeds
    broken = folder / "val" / "images" / "val_2.JPEG"
    broken.write_bytes(b"\0" * broken.stat().st_size)
    release_loaded()
    second = load_dataset("tinyimagenet", root=tmp_path)
    assert second is not first and torch.equal(first.test_x, second.test_x) and torch.equal(first.train_x,
                                                                                            second.train_x)

    # a train image added: the cache is stale, everything is decoded again (and the broken file is found)
    shutil.copy(folder / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_0.JPEG",
                folder / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_9.JPEG")
    release_loaded()
    with pytest.raises(DatasetCorrupt, match=f"data.root: {broken} cannot be decoded as an image"):
        load_dataset("tinyimagenet", root=tmp_path)


def test_relabelled_val_images_are_decoded_again(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    load_dataset("tinyimagenet", root=tmp_path)
    annotations = folder / "val" / "val_annotations.txt"
    annotations.write_text(annotations.read_text().replace("val_0.JPEG\tn09999999", "val_0.JPEG\tn01443537"))
    release_loaded()
    assert load_dataset("tinyimagenet", root=tmp_path).test_y.tolist() == [0, 0, 2, 1]


def test_missing_tinyimagenet_names_every_folder_looked_in(tmp_path: Path) -> None:
    (tmp_path / "tiny-imagenet-200" / "train").mkdir(parents=True)  # no val/: not Tiny-ImageNet
    with pytest.raises(DatasetMissing) as err:
        load_dataset("tinyimagenet", root=tmp_path)
    message = str(err.value)
    looked_in = f"{tmp_path / 'tiny-imagenet-200'}, {tmp_path / 'tinyimagenet'}, {tmp_path}"
    assert message.startswith(f"data.dataset: tinyimagenet not found in {looked_in};")
    assert f"holding tiny-imagenet-200/ ({TINYIMAGENET_URL} extracted)" in message
    assert "data.download=true" in message and "\n" not in message


def test_a_32x32_image_is_one_line_naming_it(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    small = folder / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_0.JPEG"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(small)
    corrupt_line("tinyimagenet", tmp_path, small, "is 32x32 pixels; Tiny-ImageNet images are 64x64")
    assert not (folder / DECODED_CACHE).exists()


def _annotations(folder: Path) -> Path:
    return folder / "val" / "val_annotations.txt"


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.unlink(), "is missing (it labels the val images)"),
    (lambda p: p.write_text(p.read_text() + "val_2.JPEG\tn00000001\t0\t0\t9\t9\n"),
     "line 5 names n00000001, which has no folder in"),
    (lambda p: p.write_text(p.read_text() + "val_7.JPEG\tn01443537\t0\t0\t9\t9\n"), "line 5 names val_7.JPEG, "
                                                                                     "which is neither in"),
    (lambda p: p.write_text(p.read_text() + "val_3.JPEG\tn01443537\t0\t0\t9\t9\n"),
     "line 5 names val_3.JPEG a second time"),
    (lambda p: p.write_text("val_0.JPEG n09999999 0 0 9 9\n"), "line 1 is not a file name, a tab and a wnid"),
    (lambda p: p.write_text(""), "labels no images"),
    (lambda p: p.write_bytes(b"\xff\xfe\0"), "is not UTF-8 text"),
], ids=["missing", "unknown wnid", "no such image", "twice", "not tab-separated", "empty", "binary"])
def test_unusable_val_annotations_are_one_line_naming_them(tmp_path: Path, damage: Callable[[Path], object],
                                                           says: str) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    damage(_annotations(folder))
    corrupt_line("tinyimagenet", tmp_path, _annotations(folder), says)


def test_more_class_folders_than_200_are_corrupt(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny-imagenet-200")
    for c in range(198):  # 3 + 198 = 201
        (folder / "train" / f"n1{c:07d}").mkdir()
        (folder / "train" / f"n1{c:07d}" / "x.JPEG").write_bytes(b"")
    corrupt_line("tinyimagenet", tmp_path, folder / "train", "holds 201 class folders; Tiny-ImageNet has 200")


def _zip_of(tree: Path, archive: Path) -> None:
    """The cs231n zip's shape: every member under ``tiny-imagenet-200/``."""
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(tree.rglob("*")):
            z.write(path, Path("tiny-imagenet-200") / path.relative_to(tree))


def test_download_extracts_the_zip_into_the_root_and_deletes_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_tiny(tmp_path / "source")
    _zip_of(source, tmp_path / "published.zip")
    calls = []

    def download_url(url: str, root: str, filename: str, md5: str | None) -> None:  # the network, offline
        calls.append((url, md5))
        shutil.copy(tmp_path / "published.zip", Path(root) / filename)

    monkeypatch.setattr(torchvision.datasets.utils, "download_url", download_url)
    root = tmp_path / "root"
    root.mkdir()
    ds = load_dataset("tinyimagenet", root=root, download=True)
    assert calls == [(TINYIMAGENET_URL, "90528d7ca1a48142e341f4ef8d21d0de")]
    assert (root / "tiny-imagenet-200" / "val" / "val_annotations.txt").is_file()
    assert not (root / "tiny-imagenet-200.zip").exists() and (root / "tiny-imagenet-200" / DECODED_CACHE).is_file()
    assert np.array_equal(ds.train_x.numpy(), expected_train(source)[0])


def test_download_failures_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, root: str, filename: str, md5: str | None) -> None:
        (Path(root) / filename).write_bytes(b"partial")
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(torchvision.datasets.utils, "download_url", offline)
    with pytest.raises(DatasetMissing, match=r"tinyimagenet not found in .*\(<urlopen error .*\); pass --set"):
        load_dataset("tinyimagenet", root=tmp_path, download=True)
    assert not (tmp_path / "tiny-imagenet-200.zip").exists()

    def html(url: str, root: str, filename: str, md5: str | None) -> None:
        (Path(root) / filename).write_text("<html>503</html>")

    monkeypatch.setattr(torchvision.datasets.utils, "download_url", html)
    release_loaded()
    with pytest.raises(DatasetCorrupt) as err:
        load_dataset("tinyimagenet", root=tmp_path, download=True)
    assert str(err.value).startswith(f"data.root: {tmp_path / 'tiny-imagenet-200.zip'} cannot be extracted")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["flip_crop_half", "crop_flip"])
def test_augmentation_keeps_64x64_batches_whole(kind: str) -> None:
    x = torch.randint(0, 256, (8, 3, 64, 64), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    x = to_float(x, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    out = augment(x, kind, torch.Generator().manual_seed(1))
    assert out.shape == (8, 3, 64, 64) and out.dtype == torch.float32
    assert not torch.equal(out, x)


# --- CINIC-10 ---------------------------------------------------------------------------------------------

CLASSES = ("cat", "airplane")  # written unsorted: airplane is class 0, cat class 1
FILES = ("b.png", "a.png")  # written unsorted: a.png comes first


def _cinic_pixels(split: str, cls: str, file: str) -> np.ndarray:
    """A distinct image per file, so a test can see which file landed where."""
    seed = [("train", "test", "valid").index(split), CLASSES.index(cls), FILES.index(file)]
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def write_cinic(folder: Path) -> None:
    """CINIC-10's tarball layout with 2 classes × 2 PNGs per split (valid/ too, which is not read)."""
    for split in ("train", "valid", "test"):
        for cls in CLASSES:
            (folder / split / cls).mkdir(parents=True)
            for file in FILES:
                Image.fromarray(_cinic_pixels(split, cls, file)).save(folder / split / cls / file)


def expected_cinic(split: str) -> tuple[np.ndarray, list[int]]:
    """torchvision DatasetFolder's order: classes by name, then files by name."""
    order = [(cls, file) for cls in sorted(CLASSES) for file in sorted(FILES)]
    images = np.stack([_cinic_pixels(split, cls, file).transpose(2, 0, 1) for cls, file in order])
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
    assert cache.is_file() and not list(cache.parent.glob(".*.part"))

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
    Image.fromarray(_cinic_pixels("train", "cat", "a.png")).save(tmp_path / "cinic10" / "train" / "cat" / "c.png")
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
