"""Augmentation: shapes, determinism, identity for "none", crops that really are crops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltune.data.augment import augment, cutout, lookup_float, normalise_table, random_crop_flip, to_float
from fltune.data.datasets import _SPECS, DATASETS, load_dataset
from fltune.errors import FLTuneError


def _batch() -> torch.Tensor:
    return torch.randint(0, 256, (16, 3, 32, 32), generator=torch.Generator().manual_seed(0)).to(torch.uint8)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_to_float_scales_then_normalises_per_channel() -> None:
    x = torch.tensor([0, 255], dtype=torch.uint8).view(1, 2, 1, 1).expand(1, 2, 2, 2)
    out = to_float(x, (0.5, 0.25), (0.5, 0.25))

    assert out.dtype == torch.float32
    assert out[0, 0].unique().tolist() == [-1.0] and out[0, 1].unique().tolist() == [3.0]


def test_none_is_the_identity() -> None:
    x = _batch()
    assert augment(x, "none", _gen(0)) is x


@pytest.mark.parametrize("kind", ["flip", "crop_flip", "crop_flip_cutout", "reflect_crop_flip", "flip_crop_half"])
def test_shapes_kept_and_seed_determines_the_result(kind: str) -> None:
    x = to_float(_batch(), (0.5,) * 3, (0.25,) * 3)
    first, again, other = augment(x, kind, _gen(1)), augment(x, kind, _gen(1)), augment(x, kind, _gen(2))

    assert first.shape == x.shape and first.dtype == x.dtype
    assert torch.equal(first, again) and not torch.equal(first, other)


def _window(image: torch.Tensor, dy: int, dx: int, flip: bool) -> torch.Tensor:
    crop = image[:, dy:dy + 32, dx:dx + 32]
    return crop.flip(-1) if flip else crop


def test_crop_flip_output_is_a_window_of_the_padded_image_maybe_mirrored() -> None:
    x = _batch()
    out = augment(x, "crop_flip", _gen(3))
    padded = F.pad(x, (4, 4, 4, 4))

    mirrored = 0
    for b in range(len(x)):
        matches = [flip for dy in range(9) for dx in range(9) for flip in (False, True)
                   if torch.equal(out[b], _window(padded[b], dy, dx, flip))]
        assert matches, f"sample {b} is not a crop of its padded image"
        mirrored += all(matches)
    assert 0 < mirrored < len(x)  # both mirrored and plain crops occur


def test_crop_flip_pads_black_as_torchvision_pads_the_image_before_normalising() -> None:
    """On a normalised batch the padding is a black pixel's normalised value (``black``), so augmenting then
    normalising and normalising then augmenting give the same bits, as RandomCrop before Normalize."""
    x, table = _batch(), normalise_table((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))
    on_pixels = lookup_float(augment(x, "crop_flip", _gen(6)), table)
    assert torch.equal(augment(lookup_float(x, table), "crop_flip", _gen(6), table[:, 0]), on_pixels)
    assert not torch.equal(augment(lookup_float(x, table), "crop_flip", _gen(6)), on_pixels)  # zeros: the mean


def _crops(out: torch.Tensor, padded: torch.Tensor, offsets: range = range(9)) -> list[list[bool]]:
    """Per sample, the flips under which it is a 32×32 window of its padded image at one of ``offsets``."""
    return [[flip for dy in offsets for dx in offsets for flip in (False, True)
             if torch.equal(out[b], _window(padded[b], dy, dx, flip))] for b in range(len(out))]


def test_reflect_crop_flip_crops_the_reflection_padded_image() -> None:
    x = to_float(_batch(), (0.5,) * 3, (0.25,) * 3)
    matches = _crops(augment(x, "reflect_crop_flip", _gen(7)), F.pad(x, (4, 4, 4, 4), mode="reflect"))
    assert all(matches)


def test_flip_crop_half_keeps_about_half_the_samples_whole_and_crops_the_rest() -> None:
    """FedDyn's code: flip with probability 1/2, then crop the zero-padded image with probability 1/2."""
    x = to_float(torch.randint(0, 256, (64, 3, 32, 32), generator=_gen(8)).to(torch.uint8), (0.5,) * 3, (0.25,) * 3)
    out = augment(x, "flip_crop_half", _gen(9))
    assert all(_crops(out, F.pad(x, (4, 4, 4, 4))))
    whole = sum(torch.equal(out[b], x[b]) or torch.equal(out[b], x[b].flip(-1)) for b in range(len(x)))
    assert 16 < whole < 48


def test_flip_mirrors_some_samples_and_leaves_the_rest() -> None:
    x = _batch()
    out = augment(x, "flip", _gen(10))
    mirrored = [torch.equal(out[b], x[b].flip(-1)) for b in range(len(x))]
    assert all(m or torch.equal(out[b], x[b]) for b, m in enumerate(mirrored)) and 0 < sum(mirrored) < len(x)


def test_cutout_zeroes_one_square_of_at_most_16x16_per_sample() -> None:
    cut = cutout(torch.ones(64, 1, 32, 32), _gen(4)) == 0

    per_sample = cut.sum((1, 2, 3))
    assert per_sample.max() == 256 and per_sample.min() >= 64  # a centre in a corner still cuts 8×8
    rows, cols = cut.any(3).sum(2), cut.any(2).sum(2)
    assert (rows * cols == per_sample[:, None]).all()  # a single rectangle


def test_crop_flip_cutout_is_crop_flip_then_cutout() -> None:
    x = _batch()
    generator = _gen(5)
    expected = cutout(random_crop_flip(x, generator), generator)

    assert torch.equal(augment(x, "crop_flip_cutout", _gen(5)), expected)


def test_unknown_kind_names_data_augment() -> None:
    with pytest.raises(FLTuneError, match=r"data\.augment: unknown augmentation 'rotate'; allowed: none"):
        augment(_batch(), "rotate", _gen(0))


@pytest.mark.parametrize("name", DATASETS)
def test_table_lookup_gives_to_floats_bits_for_every_value_and_dataset(name: str) -> None:
    """The fast executor normalises by table lookup: for each dataset's mean/std and every pixel value 0–255
    in every channel, at positions where ``to_float``'s vectorised loop and its tail both see them, the
    float32 bits are those of ``to_float`` on the whole batch."""
    spec = _SPECS[name]  # the published constants, else (synthetic) the train split's, computed at load
    mean, std = (spec.mean, spec.std) if spec.mean is not None else (load_dataset(name).mean, load_dataset(name).std)
    gen = torch.Generator().manual_seed(0)
    for batch, height, width in [(3, 17, 19), (5, 28, 28), (2, 32, 32)]:  # odd sizes: values in the tails too
        x = torch.randint(0, 256, (batch, len(mean), height, width), dtype=torch.uint8, generator=gen)
        for c in range(len(mean)):  # every value in every channel, first and last sample
            x[0, c] = (torch.arange(height * width) % 256).to(torch.uint8).view(height, width)
            x[-1, c] = x[0, c].flip(0, 1)
        got = lookup_float(x, normalise_table(mean, std))
        assert got.dtype == torch.float32
        assert torch.equal(got.view(torch.int32), to_float(x, mean, std).view(torch.int32))
