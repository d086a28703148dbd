"""Building blocks shared by the plain CNNs/MLPs of docs/methods.md §1 (and the VIB trunks built on them)."""

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fltune.models.base import InShape


class ConvBlock(nn.Sequential):
    """conv → [GroupNorm] → ReLU → maxpool(2); the ReLU is its own module before the pool, so MAN's hook sees
    the pre-pool map, as ``vcl-iisc/fedMAN:code/utils_models.py`` regularises it."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, padding: int = 0, gn_groups: int | None = None
    ) -> None:
        layers: OrderedDict[str, nn.Module] = OrderedDict(conv=nn.Conv2d(c_in, c_out, kernel, padding=padding))
        if gn_groups is not None:
            layers["norm"] = nn.GroupNorm(gn_groups, c_out)
        super().__init__(OrderedDict(**layers, relu=nn.ReLU(), pool=nn.MaxPool2d(2)))


def dense(in_dim: int, out_dim: int) -> nn.Sequential:
    """Linear → ReLU, a hidden fully connected layer (its ReLU is an activation point)."""
    return nn.Sequential(OrderedDict(linear=nn.Linear(in_dim, out_dim), relu=nn.ReLU()))


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for a statistics or a dummy pass; the previous mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def flat_size(trunk: nn.Module, in_shape: InShape) -> int:
    """Width of ``trunk``'s flattened output for one sample of ``in_shape``, by a dummy pass in eval mode
    (statistics untouched, no random draw). Raises ValueError if the input is too small."""
    try:
        with evaluating(trunk):
            return trunk(torch.zeros(1, *in_shape)).flatten(1).shape[1]
    except RuntimeError as err:
        raise ValueError("the input is too small for its conv/pool layers") from err
