"""CIFAR-style ResNet-18 (He et al. 2016): 3x3 stem without max-pool, four stages of two basic blocks. Not
torchvision's, whose 7x7 stride-2 stem and max-pool shrink 32x32 inputs to 8x8 before the first stage. It is FedSOL's
``resnet18`` (``Lee-Gihun/FedSOL:train_tools/models/resnet.py``) layer for layer; their ``avg_pool2d(out, 4)`` is this
global pool at 32x32 and 28x28 inputs. Their stem takes 3 channels only."""

from collections import OrderedDict
from itertools import pairwise

from torch import Tensor, nn

from fltune.models.base import InShape, SplitModel
from fltune.models.registry import register_model
from fltune.models.resnet56 import ConvBN


class BasicBlock(nn.Module):
    """``relu(conv_bn(relu(conv_bn(x))) + shortcut(x))``, ResNet-56's full-width conv+BN; two ReLUs, so MAN sees both."""

    def __init__(self, c_in: int, c_out: int, stride: int, running_stats: bool = True) -> None:
        super().__init__()
        self.conv1 = ConvBN(c_in, c_out, 3, stride, running_stats)
        self.relu1 = nn.ReLU()
        self.conv2 = ConvBN(c_out, c_out, 3, running_stats=running_stats)
        reshape = stride != 1 or c_in != c_out
        self.shortcut = ConvBN(c_in, c_out, 1, stride, running_stats) if reshape else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu2(self.conv2(self.relu1(self.conv1(x))) + self.shortcut(x))


@register_model("resnet18")
def resnet18(in_shape: InShape, num_classes: int, running_stats: bool = True) -> SplitModel:
    """Body: stem, stages 64/128/256/512 (strides 1/2/2/2), global average pool: 512-d. ``running_stats=False`` is
    FedSOL's variant (no BN running buffers); the parameters and their random draws are the same either way."""
    stem = nn.Sequential(OrderedDict(conv_bn=ConvBN(in_shape[0], 64, 3, running_stats=running_stats), relu=nn.ReLU()))
    stages = {f"layer{i}": nn.Sequential(BasicBlock(c_in, c_out, 1 if i == 1 else 2, running_stats),
                                         BasicBlock(c_out, c_out, 1, running_stats))
              for i, (c_in, c_out) in enumerate(pairwise((64, 64, 128, 256, 512)), 1)}
    body = nn.Sequential(OrderedDict(stem=stem, **stages, pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten()))
    return SplitModel(body, nn.Linear(512, num_classes), feature_dim=512)
