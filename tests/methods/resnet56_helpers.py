"""A ResNet-56 small enough for unit tests (1 block per stage, base width 8) and a batch for it."""

from __future__ import annotations

import torch

from fltune.models import build_model
from fltune.models.resnet56 import ResNet56

SHAPE = (3, 8, 8)
"""Stage outputs 32@8², 64@4², 128@2²: x2 and x3 still differ in size, so TM's pooling is exercised."""


def tiny_resnet(seed: int = 0, num_classes: int = 3) -> ResNet56:
    torch.manual_seed(seed)
    return build_model("resnet56", SHAPE, num_classes, blocks=1, base=8)


def resnet_batch(seed: int = 0, n: int = 4, num_classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *SHAPE, generator=gen), torch.randint(0, num_classes, (n,), generator=gen)
