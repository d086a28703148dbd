"""FedSOL's Table 3 models: VGG-11, SL-ViT and ResNet-18 without BatchNorm running statistics
(``Lee-Gihun/FedSOL:train_tools/models/{vgg,small_vit,resnet}.py``)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltune.errors import FLTuneError
from fltune.models import MODELS, SplitModel, build_model, split_keys
from fltune.models.vit import SHIFTS, ShiftedPatchTokens

CIFAR, PATHMNIST = (3, 32, 32), (3, 28, 28)


def built(name: str, shape: tuple[int, int, int], seed: int = 0, **options: object) -> SplitModel:
    torch.manual_seed(seed)
    return build_model(name, shape, 10, **options)


def batch(shape: tuple[int, ...], size: int = 4) -> torch.Tensor:
    return torch.randn(size, *shape, generator=torch.Generator().manual_seed(1))


def test_resnet18_without_running_stats_normalises_by_the_batch_in_train_and_eval_alike():
    default, stateless = built("resnet18", CIFAR), built("resnet18", CIFAR, running_stats=False)
    x = batch(CIFAR)

    with torch.no_grad():
        train_out, eval_out = stateless.train()(x), stateless.eval()(x)

    assert list(stateless.buffers()) == [] and len(list(default.buffers())) > 0
    assert torch.equal(train_out, eval_out)
    params = dict(default.named_parameters())
    assert all(torch.equal(params[k], p) for k, p in stateless.named_parameters())  # same seed, same weights
    assert sum(p.numel() for p in stateless.parameters()) == sum(p.numel() for p in default.parameters())


def test_vgg11_on_28x28_is_the_same_net_on_the_nearest_upsampled_32x32_input():
    small, large = built("vgg11", PATHMNIST).eval(), built("vgg11", CIFAR).eval()
    x = batch(PATHMNIST)

    assert isinstance(small.body.upsample, nn.Upsample) and not hasattr(large.body, "upsample")
    large.load_state_dict(small.state_dict())
    with torch.no_grad():
        assert torch.equal(small(x), large(F.interpolate(x, size=32, mode="nearest")))


def test_vgg11_head_is_the_last_linear_and_convs_are_initialised_as_the_authors():
    m = built("vgg11", CIFAR)
    convs = [mod for mod in m.modules() if isinstance(mod, nn.Conv2d)]

    assert isinstance(m.head, nn.Linear) and (m.head.in_features, m.head.out_features) == (512, 10)
    assert len(convs) == 8 and all(torch.equal(c.bias, torch.zeros_like(c.bias)) for c in convs)
    std = convs[-1].weight.std().item()  # N(0, 2 / (3*3*512)): 0.0208
    assert std == pytest.approx((2 / (9 * 512)) ** 0.5, rel=0.01)
    assert len(m.activation_points) == 10  # 8 conv ReLUs, 2 fc ReLUs


def test_shifted_patch_tokens_cut_patches_row_major_with_pixel_then_channel_inside():
    """Their einops pattern "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", checked pixel by pixel on the raw patches."""
    spt = ShiftedPatchTokens(patch=2, dim=4, channels=1)
    spt.norm, spt.linear = nn.Identity(), nn.Identity()
    x = batch((1, 4, 4), size=1)
    stacked = torch.cat([x, *(F.pad(x, s) for s in SHIFTS)], dim=1)

    tokens = spt(x)

    assert tokens.shape == (1, 4, 2 * 2 * 5)
    for h in range(2):
        for w in range(2):
            for p1 in range(2):
                for p2 in range(2):
                    for c in range(5):
                        got = tokens[0, h * 2 + w, (p1 * 2 + p2) * 5 + c]
                        assert got == stacked[0, c, h * 2 + p1, w * 2 + p2]


def test_sl_vit_never_attends_a_token_to_itself():
    m = built("sl_vit", CIFAR).eval()
    softmaxes = [mod for mod in m.modules() if isinstance(mod, nn.Softmax)]
    seen: list[torch.Tensor] = []
    handles = [s.register_forward_hook(lambda mod, i, o: seen.append(o)) for s in softmaxes]

    with torch.no_grad():
        m(batch(CIFAR, size=2))
    for h in handles:
        h.remove()

    assert len(seen) == 9  # one attention per block
    for attention in seen:
        assert attention.shape == (2, 12, 17, 17)  # 12 heads, cls + 16 patches
        assert torch.equal(attention.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 12, 17))
        assert torch.allclose(attention.sum(-1), torch.ones(2, 12, 17))


def test_sl_vit_repeats_a_grayscale_input_to_three_channels():
    gray, rgb = built("sl_vit", (1, 28, 28)).eval(), built("sl_vit", PATHMNIST).eval()
    x = batch((1, 28, 28))

    assert all(torch.equal(a, b) for a, b in zip(gray.state_dict().values(), rgb.state_dict().values()))
    assert gray.body.patches.linear.in_features == 3 * 5 * 7 * 7
    with torch.no_grad():
        assert torch.equal(gray(x), rgb(x.repeat(1, 3, 1, 1)))


def test_sl_vit_head_is_the_authors_mlp_head_and_it_has_no_activation_points():
    """FedSOL's head-only perturbation perturbs ``mlp_head``, LayerNorm included, so the head holds both."""
    m = built("sl_vit", CIFAR)
    _, head = split_keys(m)

    assert head == ["head.norm.weight", "head.norm.bias", "head.linear.weight", "head.linear.bias"]
    assert m.activation_points == []
    assert all(built(name, CIFAR).activation_points for name in sorted(MODELS) if name != "sl_vit")


@pytest.mark.parametrize("shape", [(3, 32, 28), (3, 30, 30), (2, 32, 32), (3, 3, 3)])
def test_sl_vit_rejects_inputs_its_patching_cannot_cut(shape):
    with pytest.raises(FLTuneError, match=r"model.name: 'sl_vit' cannot take inputs of shape"):
        build_model("sl_vit", shape, 10)
