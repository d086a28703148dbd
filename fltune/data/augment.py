"""Batched, seeded image augmentation and normalisation (docs/methods.md §0, "Augmentation").

CIFAR recipes use random-crop (pad 4) + horizontal flip; FedSOL adds Cutout(16); the MNIST family uses
none. Every random number comes from the caller's ``torch.Generator`` so a client's batches are a
function of its seed, and each transform is one vectorised gather or mask over the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError

AUGMENTATIONS: tuple[str, ...] = ("none", "crop_flip", "crop_flip_cutout")
CROP_PADDING = 4  # RandomCrop(32, padding=4), the CIFAR recipe of every paper here
CUTOUT_SIZE = 16  # Cutout(16), FedSOL


def to_float(x_uint8: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 [B, C, H, W] → float32, scaled to [0, 1], then normalised per channel: (x − mean) / std."""
    shape = (1, -1, 1, 1)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=x_uint8.device).view(shape)
    std_t = torch.tensor(std, dtype=torch.float32, device=x_uint8.device).view(shape)
    return x_uint8.float().div_(255).sub_(mean_t).div_(std_t)


def normalise_table(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """[C, 256] float32: entry (c, v) is ``to_float`` of pixel value v in channel c.

    Made by ``to_float`` itself, whose steps are elementwise and correctly rounded, so looking a pixel up
    (:func:`lookup_float`) gives the very bits ``to_float`` would compute for it in any batch.
    """
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256, 1).expand(1, len(mean), 256, 1)
    return to_float(values, mean, std).view(len(mean), 256)


def lookup_float(x_uint8: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``to_float`` of a uint8 batch [B, C, H, W] by one gather from :func:`normalise_table` (on x's device):
    one pass over the batch instead of four, and no per-batch mean/std tensors."""
    channels = table.shape[0]
    index = x_uint8.long()
    if channels > 1:  # channel c's entries start at 256·c (one channel: nothing to add, two launches fewer)
        index = index + torch.arange(0, 256 * channels, 256, device=x_uint8.device).view(1, channels, 1, 1)
    return table.view(-1).index_select(0, index.reshape(-1)).view(x_uint8.shape)  # ~3× advanced indexing (CPU)


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Augment a batch [B, C, H, W] independently per sample; ``"none"`` returns ``x`` itself.

    Padding and cutout write zeros of ``x``'s own scale: on normalised batches (as the engine passes)
    that is the dataset's mean colour, as in the reference Cutout, which runs after ``Normalize``;
    torchvision's RandomCrop on PIL images pads black instead (pass uint8 batches for that).
    """
    if kind not in AUGMENTATIONS:
        raise FLTuneError(f"data.augment: unknown augmentation {kind!r}; allowed: {', '.join(AUGMENTATIONS)}")
    if kind == "none":
        return x
    x = random_crop_flip(x, generator)
    return cutout(x, generator) if kind == "crop_flip_cutout" else x


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = CROP_PADDING) -> torch.Tensor:
    """Zero-pad by ``padding``, crop back to H×W at a random offset, mirror with probability 1/2.

    One advanced-indexing gather: sample b reads rows dy_b + i and columns dx_b + j (or
    dx_b + W − 1 − j when flipped) of its padded image.
    """
    b, _, h, w = x.shape
    dy, dx = _randint(2 * padding + 1, (2, b), generator, x.device)
    flip = _randint(2, (b, 1), generator, x.device).bool()
    rows = dy[:, None] + torch.arange(h, device=x.device)
    cols_in_crop = torch.arange(w, device=x.device).expand(b, w)
    cols = dx[:, None] + torch.where(flip, w - 1 - cols_in_crop, cols_in_crop)
    padded = F.pad(x, (padding,) * 4)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def cutout(x: torch.Tensor, generator: torch.Generator, size: int = CUTOUT_SIZE) -> torch.Tensor:
    """Zero one size×size square per sample, centred uniformly on the image and clipped at its borders.

    DeVries & Taylor's Cutout as FedSOL uses it: the centre may lie near an edge, so less than the full
    square can be cut.
    """
    b, _, h, w = x.shape
    rows = _window(h, _randint(h, (b, 1), generator, x.device), size)
    cols = _window(w, _randint(w, (b, 1), generator, x.device), size)
    return x.masked_fill((rows[:, :, None] & cols[:, None, :])[:, None], 0)


def _window(length: int, centre: torch.Tensor, size: int) -> torch.Tensor:
    """[B, length] mask of positions in [centre − size/2, centre + size/2) for centres of shape [B, 1]."""
    pos = torch.arange(length, device=centre.device)
    return (pos >= centre - size // 2) & (pos < centre + size // 2)


def _randint(high: int, shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Integers in [0, high) drawn on the generator's device, then moved to the batch's device."""
    return torch.randint(high, shape, generator=generator, device=generator.device).to(device)
