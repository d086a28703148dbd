"""The plain CNNs and MLP of docs/methods.md §1: conv blocks, flatten, hidden dense layers (body); linear head. Their
building blocks serve VGG-11 and the VIB trunks too."""

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import pairwise

import torch
from torch import nn

from fltune.models.base import InShape, SplitModel
from fltune.models.registry import register_model


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


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for a statistics or a dummy pass, the mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def plain_net(
    in_shape: InShape, num_classes: int, convs: Sequence[ConvBlock] | Mapping[str, nn.Module], widths: Sequence[int],
    model_class: type[SplitModel] = SplitModel,
) -> SplitModel:
    """Body ``convs → flatten → (Linear → ReLU) per width`` (each ReLU an activation point), head
    ``Linear(widths[-1], num_classes)``, for every input size: the flattened width comes from a dummy pass (statistics
    untouched, no random draw). ``convs`` are named ``conv1, ...`` unless given by name."""
    named = convs if isinstance(convs, Mapping) else {f"conv{i}": block for i, block in enumerate(convs, 1)}
    body = nn.Sequential(OrderedDict(named))
    body.add_module("flatten", nn.Flatten())
    try:
        with evaluating(body):
            dims = [body(torch.zeros(1, *in_shape)).shape[1], *widths]
    except RuntimeError as err:
        raise ValueError("the input is too small for its conv/pool layers") from err
    for i, (d_in, d_out) in enumerate(pairwise(dims), 1):
        body.add_module(f"fc{i}", nn.Sequential(OrderedDict(linear=nn.Linear(d_in, d_out), relu=nn.ReLU())))
    return model_class(body, nn.Linear(dims[-1], num_classes), feature_dim=dims[-1])


@register_model("mlp")
def mlp(in_shape: InShape, num_classes: int) -> SplitModel:
    """Two hidden layers of 200: FedDyn's MNIST model (also in ``vcl-iisc/fedMAN``), a cheap baseline."""
    return plain_net(in_shape, num_classes, convs=(), widths=(200, 200))


@register_model("fedavg_cnn")
def fedavg_cnn(in_shape: InShape, num_classes: int) -> SplitModel:
    """McMahan et al.'s CNN as used by FedSOL (``Lee-Gihun/FedSOL:train_tools/models/fedavgnet.py``); the
    first conv takes the data's own C channels, as McMahan's (FedSOL repeats MNIST's grayscale to 3)."""
    c = in_shape[0]
    convs = (ConvBlock(c, 32, 5, padding=2), ConvBlock(32, 64, 5, padding=2))
    return plain_net(in_shape, num_classes, convs, widths=(512,))


@register_model("feddyn_cnn")
def feddyn_cnn(in_shape: InShape, num_classes: int) -> SplitModel:
    """FedDyn's CIFAR CNN, used by MAN (Table 4): unpadded 5x5 convs, fc 1600→384→192 on 32x32 inputs; MAN's
    activation points are the two conv ReLUs (before pooling) and the two fc ReLUs."""
    c = in_shape[0]
    return plain_net(in_shape, num_classes, (ConvBlock(c, 64, 5), ConvBlock(64, 64, 5)), widths=(384, 192))


class TinyImageNetCNN(SplitModel):
    """A plain net whose MAN terms are those of the authors' ``ConvNet.forward``
    (``vcl-iisc/fedMAN:code/utils_models.py``), behind MAN's Tiny-ImageNet columns: that forward overwrites the last
    conv block's activation and adds ``torch.std(x, axis=[0])**2`` of the last dense layer. So the activation points are
    every hidden ReLU but the last conv block's, and the last is also a variance point."""

    @property
    def activation_points(self) -> list[nn.Module]:
        convs = [block for name, block in self.body.named_children() if name.startswith("conv")]
        dropped = convs[-1].relu if convs else None
        return [m for m in super().activation_points if m is not dropped]

    @property
    def variance_points(self) -> list[nn.Module]:
        return super().activation_points[-1:]


@register_model("tinyimagenet_cnn")
def tinyimagenet_cnn(
    in_shape: InShape, num_classes: int, widths: Sequence[int] = (512, 384)
) -> SplitModel:
    """MAN's Tiny-ImageNet CNN (Table 4): three padded 3x3 conv blocks with GroupNorm(4, 64). Dense widths are the
    authors' code's (``ConvNet``: 4096→512→384→200), which agrees with Table 4's FC(384,200); pass ``widths=(384, 192)``
    for the other reading of Table 4. MAN's term on it is the code's, not quite Eq. 15's."""
    c = in_shape[0]
    convs = [ConvBlock(c_in, 64, 3, padding=1, gn_groups=4) for c_in in (c, 64, 64)]
    return plain_net(in_shape, num_classes, convs, widths, model_class=TinyImageNetCNN)
