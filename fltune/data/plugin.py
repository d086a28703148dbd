"""A dataset of the user's own: what its loader returns, and how it becomes fltune's uint8 splits.

``data.dataset`` may name a loader ``loader(root, download) -> UserDataset`` (``fltune.plugins``). Its splits,
(images, labels) tensors or torchvision-style datasets, become uint8 NCHW tensors like every built-in's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fltune.errors import FLTuneError
from fltune.plugins import EXPECTED, resolve


@dataclass(frozen=True)
class UserDataset:
    """A dataset plug-in's answer: its two splits, its class count and its normalisation. ``train``/``test``: (images,
    labels), images uint8 [N, C, H, W] (or [N, H, W]) or float in [0, 1], or a torchvision-style dataset of (image,
    label). ``mean``/``std``: per channel on [0, 1]; None = the train split's. ``augment``: what ``data.augment: auto``
    picks."""

    train: Any
    test: Any
    num_classes: int
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    augment: str = "none"


def load_user(name: str, root: str | None, download: bool) -> tuple[tuple[torch.Tensor, ...], UserDataset]:
    """The plug-in ``name`` called and its splits as (train_x, train_y, test_x, test_y), uint8 and int64."""
    loader = resolve("dataset", name)
    answer = loader(None if root is None else Path(root), download)
    if not isinstance(answer, UserDataset):
        raise FLTuneError(f"data.dataset: {name!r} returned a {type(answer).__name__}; expected "
                          f"{EXPECTED['dataset']}")
    return (*_tensors(name, "train", answer.train), *_tensors(name, "test", answer.test)), answer


def _tensors(name: str, split: str, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One split as uint8 [N, C, H, W] images and int64 labels."""
    if isinstance(data, tuple) and len(data) == 2:
        x, y = torch.as_tensor(data[0]), torch.as_tensor(data[1])
    else:
        pairs = [data[i] for i in range(len(data))]
        x = torch.stack([_image(image) for image, _ in pairs])
        y = torch.as_tensor([int(target) for _, target in pairs])
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.is_floating_point():
        x = (x.clamp(0, 1) * 255).round()
    if x.dim() != 4 or len(x) != len(y) or len(x) == 0:
        raise FLTuneError(f"data.dataset: {name!r}: its {split} split has images of shape {tuple(x.shape)} and "
                          f"{len(y)} labels; expected [N, C, H, W] images and N labels, N > 0")
    return x.to(torch.uint8).contiguous(), y.long()


def _image(image: Any) -> torch.Tensor:
    """A PIL image, HWC/HW array or CHW tensor as a [C, H, W] tensor (a float tensor stays on [0, 1])."""
    if isinstance(image, torch.Tensor):
        return image if image.dim() == 3 else image.unsqueeze(0)
    array = np.asarray(image)
    return torch.from_numpy(array.copy()).unsqueeze(0) if array.ndim == 2 else torch.from_numpy(
        array.transpose(2, 0, 1).copy())
