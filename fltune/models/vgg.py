"""VGG-11 as FedSOL's Table 3 trains it (``Lee-Gihun/FedSOL:train_tools/models/vgg.py``). Their ``create_models`` leaves
``img_size`` at 3·32·32: no BatchNorm, no dropout, every conv keeps its ReLU (their 28x28 ``make_layers`` branch is
never taken)."""

import math
from collections import OrderedDict

from torch import nn

from fltune.models.base import InShape, SplitModel
from fltune.models.convnets import plain_net
from fltune.models.registry import register_model

VGG11: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""Conv widths with "M" for a 2x2 max-pool, their ``cfg["vgg11"]``."""


def init_convs(model: nn.Module) -> None:
    """Their init: conv weights ~ N(0, 2 / (k·k·c_out)), bias 0, drawn after the whole model is built (so one
    seed gives their bits); linear layers keep torch's default."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
            nn.init.zeros_(module.bias)


@register_model("vgg11")
def vgg11(in_shape: InShape, num_classes: int) -> SplitModel:
    """Body: conv blocks of :data:`VGG11`, flatten, fc 512 → 512 → 512 (ReLU); head: their ``classifier``,
    Linear(512, classes), the last child FedSOL's head-only perturbation perturbs. 28-wide inputs are upsampled first
    (nearest) to 32x32, as their ``forward``; others stay. The first conv takes the input's own channels (theirs: 3)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    if in_shape[2] == 28:
        layers["upsample"] = nn.Upsample(size=32, mode="nearest")
    c_in, convs, pools = in_shape[0], 0, 0
    for width in VGG11:
        if isinstance(width, int):
            convs += 1
            conv = nn.Conv2d(c_in, width, 3, padding=1)  # its ReLU a module of its own, for MAN's hook
            layers[f"conv{convs}"] = nn.Sequential(OrderedDict(conv=conv, relu=nn.ReLU()))
            c_in = width
        else:
            pools += 1
            layers[f"pool{pools}"] = nn.MaxPool2d(2)
    model = plain_net(in_shape, num_classes, layers, widths=(512, 512))
    init_convs(model)
    return model
