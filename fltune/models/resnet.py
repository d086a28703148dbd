"""CIFAR-style ResNet-18 (He et al. 2016): 3x3 stem without max-pool, four stages of two basic blocks.

docs/methods.md §1 uses it for ImageNet-200 and FedSOL's Table 3. Written here rather than taken from
torchvision, whose 7x7 stride-2 stem and max-pool shrink 32x32 inputs to 8x8 before the first stage.
"""

from collections import OrderedDict

from torch import Tensor, nn

from fltune.models.base import InShape, SplitModel
from fltune.models.registry import register_model


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """Bias-free conv followed by BatchNorm (the bias would duplicate BN's shift)."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return nn.Sequential(OrderedDict(conv=conv, bn=nn.BatchNorm2d(c_out)))


class BasicBlock(nn.Module):
    """``relu(conv_bn(relu(conv_bn(x))) + shortcut(x))``; a 1x1 projection shortcut when the shape changes.

    Two distinct ReLU modules, so both hidden activations are activation points (MAN).
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(c_in, c_out, 3, stride)
        self.relu1 = nn.ReLU()
        self.conv2 = conv_bn(c_out, c_out, 3)
        reshape = stride != 1 or c_in != c_out
        self.shortcut = conv_bn(c_in, c_out, 1, stride) if reshape else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu2(self.conv2(self.relu1(self.conv1(x))) + self.shortcut(x))


def stage(c_in: int, c_out: int, stride: int, blocks: int = 2) -> nn.Sequential:
    """``blocks`` basic blocks; only the first changes resolution/width."""
    first = BasicBlock(c_in, c_out, stride)
    return nn.Sequential(first, *(BasicBlock(c_out, c_out, 1) for _ in range(blocks - 1)))


@register_model("resnet18")
def resnet18(in_shape: InShape, num_classes: int) -> SplitModel:
    """Body: stem, stages 64/128/256/512 (strides 1/2/2/2), global average pool, flatten: 512-d."""
    body = nn.Sequential(
        OrderedDict(
            stem=nn.Sequential(OrderedDict(conv_bn=conv_bn(in_shape[0], 64, 3), relu=nn.ReLU())),
            layer1=stage(64, 64, 1),
            layer2=stage(64, 128, 2),
            layer3=stage(128, 256, 2),
            layer4=stage(256, 512, 2),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
        )
    )
    return SplitModel(body, nn.Linear(512, num_classes), feature_dim=512)
