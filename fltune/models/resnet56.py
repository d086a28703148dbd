"""FedML's CIFAR ResNet-56 (docs/methods.md §1), slimmable and with optional stochastic depth.

Stem conv3x3 C→16 + BN + ReLU; three stages of 6 bottlenecks (expansion 4) giving 64@32², 128@16², 256@8²
on 32x32 inputs; average pool; fc 256→classes (``FedML-AI/FedML`` ``resnet56``, as ``mmendiet/FedAlign``).

Every layer can run *sliced* at width ω without copying weights: a conv uses its first ``slim(c_out, ω)``
filters over its input's channels, and BN at ω < 1 uses batch statistics (its running averages, the full
width's, are neither used nor updated, as the authors' ``USBatchNorm2d``). That gives FedAlign's width-ω
stage 3 (Alg. 1) and GradAug's sub-networks; ``width == 1`` is exactly the plain ResNet. Stochastic depth
(Huang et al. 2016) is a per-block float, not state, so a method wanting it sets it on every copy.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fltune.models.base import InShape, SplitModel
from fltune.models.registry import register_model

EXPANSION = 4
"""Output channels of a bottleneck block per ``planes`` (He et al. 2016)."""


def make_divisible(value: float, divisor: int = 8) -> int:
    """The nearest multiple of ``divisor``, never more than 10 % below: the slimmable-network rule (TF-slim MobileNet,
    ``taoyang1122/GradAug``, FedAlign)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def slim(channels: int, width: float) -> int:
    """Channels a layer keeps at width ω."""
    return channels if width == 1.0 else min(channels, make_divisible(channels * width))


class SlimConv2d(nn.Conv2d):
    """Bias-free 'same' conv; at width ω its first filters over the input's channels."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1) -> None:
        super().__init__(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)

    def forward(self, x: Tensor, width: float = 1.0) -> Tensor:
        weight = self.weight[: slim(self.out_channels, width), : x.shape[1]]
        return F.conv2d(x, weight, None, self.stride, self.padding)


class SlimBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm; at ω < 1 batch statistics (the running ones are the full width's)."""

    def forward(self, x: Tensor, width: float = 1.0) -> Tensor:
        if width == 1.0:
            return super().forward(x)
        c = x.shape[1]
        return F.batch_norm(x, None, None, self.weight[:c], self.bias[:c], training=True, eps=self.eps)


class SlimLinear(nn.Linear):
    """Linear layer reading as many input features as it is given (a width-ω net's head)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight[:, : x.shape[1]], self.bias)


class ConvBN(nn.Module):
    """SlimConv2d followed by SlimBatchNorm2d, both at the caller's width; ``running_stats=False``: batch statistics
    in evaluation too."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, running_stats: bool = True) -> None:
        super().__init__()
        self.conv = SlimConv2d(c_in, c_out, kernel, stride)
        self.bn = SlimBatchNorm2d(c_out, track_running_stats=running_stats)

    def forward(self, x: Tensor, width: float = 1.0) -> Tensor:
        return self.bn(self.conv(x, width), width)


class Bottleneck(nn.Module):
    """``relu(p·branch(x) + shortcut(x))`` with branch 1x1 → 3x3 (stride) → 1x1 (×4 channels). ``survival`` p: in
    training the branch is kept with probability p (one draw from torch's global RNG per block and batch), in eval
    scaled by p (FedAlign §3.2, Huang et al. 2016 Eq. 3-5). Three distinct ReLUs, so MAN sees each."""

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        c_out = planes * EXPANSION
        self.conv1 = ConvBN(c_in, planes, 1)
        self.relu1 = nn.ReLU()
        self.conv2 = ConvBN(planes, planes, 3, stride)
        self.relu2 = nn.ReLU()
        self.conv3 = ConvBN(planes, c_out, 1)
        self.shortcut = ConvBN(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else None
        self.relu3 = nn.ReLU()
        self.survival = 1.0

    def forward(self, x: Tensor, width: float = 1.0) -> Tensor:
        identity = x if self.shortcut is None else self.shortcut(x, width)
        if self.training and self.survival < 1.0 and float(torch.rand(())) >= self.survival:
            return self.relu3(identity)
        branch = self.conv3(self.relu2(self.conv2(self.relu1(self.conv1(x, width)), width)), width)
        if not self.training:
            branch = self.survival * branch
        return self.relu3(branch + identity)


def make_stage(c_in: int, planes: int, blocks: int, stride: int) -> nn.ModuleList:
    """``blocks`` bottlenecks; the first changes resolution and width."""
    first = Bottleneck(c_in, planes, stride)
    return nn.ModuleList([first, *(Bottleneck(planes * EXPANSION, planes, 1) for _ in range(blocks - 1))])


def run_stage(stage: nn.ModuleList, x: Tensor, width: float) -> Tensor:
    for block in stage:
        x = block(x, width)
    return x


class ResNet56Body(nn.Module):
    """Stem and three stages, globally pooled: ``[B, 16·base]``."""

    def __init__(self, in_channels: int, blocks: int, base: int) -> None:
        super().__init__()
        self.stem = ConvBN(in_channels, base, 3)
        self.stem_relu = nn.ReLU()
        self.layer1 = make_stage(base, base, blocks, 1)
        self.layer2 = make_stage(base * EXPANSION, 2 * base, blocks, 2)
        self.layer3 = make_stage(2 * base * EXPANSION, 4 * base, blocks, 2)

    def trunk(self, x: Tensor, width: float = 1.0) -> Tensor:
        """FedAlign's f_{θ_{L-1}} (x2, 128@16² at full width)."""
        x = self.stem_relu(self.stem(x, width))
        return run_stage(self.layer2, run_stage(self.layer1, x, width), width)

    def stage3(self, x2: Tensor, width: float = 1.0) -> Tensor:
        """FedAlign's block L, f_{θ_L} (x3, 256@8² at full width)."""
        return run_stage(self.layer3, x2, width)

    def forward(self, x: Tensor, width: float = 1.0) -> Tensor:
        return self.stage3(self.trunk(x, width), width).mean(dim=(2, 3))

    def blocks(self) -> Iterator[Bottleneck]:
        yield from (*self.layer1, *self.layer2, *self.layer3)


class ResNet56(SplitModel):
    """The SplitModel plus the width-ω and stochastic-depth entry points."""

    def feature_maps(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One full-width pass → (x2, x3, logits) (FedAlign Alg. 1)."""
        x2 = self.body.trunk(x)
        x3 = self.body.stage3(x2)
        return x2, x3, self.head(x3.mean(dim=(2, 3)))

    def stage3_at_width(self, x2: Tensor, width: float) -> tuple[Tensor, Tensor]:
        """Stage 3 at width ω on ``x2``'s first channels → (that slice, its output): FedAlign Eq. 7's pair."""
        x2 = x2[:, : slim(x2.shape[1], width)]
        return x2, self.body.stage3(x2, width)

    def forward_at_width(self, x: Tensor, width: float) -> Tensor:
        """A GradAug sub-network's logits."""
        return self.head(self.body(x, width))

    def set_stochastic_depth(self, last_survival: float, first_kept: bool = False) -> None:
        """p_ℓ = 1 − (ℓ/L)(1 − p_L) (FedAlign §3.2, Huang et al. 2016), or with ``first_kept`` 1 − ((ℓ − 1)/(L − 1))(1 − p_L),
        as the FedAlign authors' ``models/resnet_stochdepth.py``."""
        blocks = list(self.body.blocks())
        for depth, block in enumerate(blocks, 1):
            fall = (depth - 1) / max(len(blocks) - 1, 1) if first_kept else depth / len(blocks)
            block.survival = 1.0 - fall * (1.0 - last_survival)


@register_model("resnet56")
def resnet56(in_shape: InShape, num_classes: int, blocks: int = 6, base: int = 16) -> ResNet56:
    """FedML ResNet-56 (``blocks=6, base=16``: 9·6 + 2 = 56 layers); smaller values build test variants."""
    feature_dim = 4 * base * EXPANSION
    model = ResNet56(ResNet56Body(in_shape[0], blocks, base), SlimLinear(feature_dim, num_classes), feature_dim)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return model
