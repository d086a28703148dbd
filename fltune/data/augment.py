"""Batched, seeded image augmentation and normalisation. Each kind is one paper code's recipe, written as that code
runs it (the table: docs/methods.md §0, "Augmentation"). All randomness comes from the caller's ``torch.Generator``;
each transform is one vectorised op per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError

AUGMENTATIONS: tuple[str, ...] = (
    "none", "flip", "crop_flip", "crop_flip_cutout", "reflect_crop_flip", "flip_crop_half",
)
CROP_PADDING = 4  # RandomCrop(32, padding=4), the CIFAR recipe of every paper here
CUTOUT_SIZE = 16  # Cutout(16), FedSOL


def to_float(x_uint8: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 [B, C, H, W] → float32, scaled to [0, 1], then normalised per channel: (x − mean) / std."""
    shape = (1, -1, 1, 1)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=x_uint8.device).view(shape)
    std_t = torch.tensor(std, dtype=torch.float32, device=x_uint8.device).view(shape)
    return x_uint8.float().div_(255).sub_(mean_t).div_(std_t)


def normalise_table(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """[C, 256] float32 ``to_float`` of each pixel value per channel; made by ``to_float`` itself, so
    :func:`lookup_float` matches it bit for bit."""
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256, 1).expand(1, len(mean), 256, 1)
    return to_float(values, mean, std).view(len(mean), 256)


def lookup_float(x_uint8: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``to_float`` of a uint8 batch [B, C, H, W] in one gather from :func:`normalise_table` (one pass)."""
    channels = table.shape[0]
    index = x_uint8.long()
    if channels > 1:  # channel c's entries start at 256·c (one channel: nothing to add, two launches fewer)
        index = index + torch.arange(0, 256 * channels, 256, device=x_uint8.device).view(1, channels, 1, 1)
    return table.view(-1).index_select(0, index.reshape(-1)).view(x_uint8.shape)  # faster than advanced indexing


def augment(x: torch.Tensor, kind: str, generator: torch.Generator, black: torch.Tensor | None = None) -> torch.Tensor:
    """Augment a batch [B, C, H, W] independently per sample; ``"none"`` returns ``x`` itself. ``black``: a black pixel
    per channel [C] in ``x``'s scale, the padding of ``crop_flip`` and ``crop_flip_cutout`` (torchvision pads before
    ``Normalize``; the engine passes ``normalise_table(...)[:, 0]``); None: 0, for unnormalised batches. Cutout and
    ``flip_crop_half`` write zeros of ``x``'s scale (the mean colour when normalised), as their reference code does."""
    if kind not in AUGMENTATIONS:
        raise FLTuneError(f"data.augment: unknown augmentation {kind!r}; allowed: {', '.join(AUGMENTATIONS)}")
    if kind == "none":
        return x
    if kind == "flip":  # a mirror with probability 1/2, one draw per sample
        return torch.where(_randint(2, (len(x), 1, 1, 1), generator, x.device).bool(), x.flip(-1), x)
    if kind == "flip_crop_half":
        return random_crop_flip(x, generator, crop_half=True)
    fill = "reflect" if kind == "reflect_crop_flip" else black
    x = random_crop_flip(x, generator, fill=fill)
    return cutout(x, generator) if kind == "crop_flip_cutout" else x


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, fill: torch.Tensor | str | None = None,
                     crop_half: bool = False) -> torch.Tensor:
    """Pad by :data:`CROP_PADDING`, crop back to H×W at a random offset, mirror with probability 1/2. ``fill``: a
    colour per channel [C], None for zeros, or ``"reflect"``. ``crop_half``: each sample is cropped with probability
    1/2, drawn after the offsets and flips so the other kinds' draws are unchanged. One gather: sample b reads rows
    dy_b + i, columns dx_b + j (dx_b + W − 1 − j when flipped)."""
    b, _, h, w = x.shape
    padding = CROP_PADDING
    dy, dx = _randint(2 * padding + 1, (2, b), generator, x.device)
    flip = _randint(2, (b, 1), generator, x.device).bool()
    if crop_half:
        cropped = _randint(2, (b,), generator, x.device).bool()
        dy, dx = (torch.where(cropped, d, padding) for d in (dy, dx))
    rows = dy[:, None] + torch.arange(h, device=x.device)
    cols_in_crop = torch.arange(w, device=x.device).expand(b, w)
    cols = dx[:, None] + torch.where(flip, w - 1 - cols_in_crop, cols_in_crop)
    padded = _padded(x, padding, fill)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def _padded(x: torch.Tensor, padding: int, fill: torch.Tensor | str | None) -> torch.Tensor:
    """``x`` padded on every side: with zeros, by reflection, or with a colour per channel."""
    if fill is None or isinstance(fill, str):
        return F.pad(x, (padding,) * 4, mode="reflect" if fill == "reflect" else "constant")
    b, c, h, w = x.shape
    out = fill.to(x.dtype).view(1, c, 1, 1).expand(b, c, h + 2 * padding, w + 2 * padding).clone()
    out[:, :, padding:padding + h, padding:padding + w] = x
    return out


def cutout(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """DeVries & Taylor's Cutout as FedSOL uses it: zero a :data:`CUTOUT_SIZE`-wide square per sample, centred
    uniformly, clipped at the borders."""
    b, _, h, w = x.shape
    rows = _window(h, _randint(h, (b, 1), generator, x.device))
    cols = _window(w, _randint(w, (b, 1), generator, x.device))
    return x.masked_fill((rows[:, :, None] & cols[:, None, :])[:, None], 0)


def _window(length: int, centre: torch.Tensor) -> torch.Tensor:
    """[B, length] mask of positions in [centre − s/2, centre + s/2), s = :data:`CUTOUT_SIZE`, for centres [B, 1]."""
    pos = torch.arange(length, device=centre.device)
    return (pos >= centre - CUTOUT_SIZE // 2) & (pos < centre + CUTOUT_SIZE // 2)


def _randint(high: int, shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Integers in [0, high) drawn on the generator's device, then moved to the batch's device."""
    return torch.randint(high, shape, generator=generator, device=generator.device).to(device)
