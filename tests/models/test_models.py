"""Contract tests for every registered model plus pinned numbers for the paper architectures."""

from functools import cache

import pytest
import torch
from torch import nn

from fltune.errors import FLTuneError
from fltune.methods.man import first_activations
from fltune.models import MODELS, SplitModel, build_model, default_model, split_keys
from fltune.models import registry

FMNIST, CIFAR = (1, 28, 28), (3, 32, 32)
SHAPES = [FMNIST, CIFAR]  # every architecture here takes both
CASES = [(name, shape) for name in sorted(MODELS) for shape in SHAPES]


@cache
def model(name: str, shape: tuple[int, int, int], classes: int = 10) -> SplitModel:
    torch.manual_seed(0)
    return build_model(name, shape, classes).eval()


def batch(shape: tuple[int, int, int], size: int = 2) -> torch.Tensor:
    return torch.randn(size, *shape, generator=torch.Generator().manual_seed(1))


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_forward_features_and_head_compose(name, shape):
    m, x = model(name, shape), batch(shape)

    with torch.no_grad():
        logits, feats = m(x), m.features(x)

    assert logits.shape == (2, 10)
    assert feats.shape == (2, m.feature_dim)
    assert torch.equal(m.head(feats), logits)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_state_dict_splits_into_body_and_head(name, shape):
    m = model(name, shape)

    body, head = split_keys(m)

    assert body and head
    assert sorted(body + head) == sorted(m.state_dict())
    assert all(k.startswith("body.") for k in body) and all(k.startswith("head.") for k in head)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_activation_points_fire_once_each_in_forward_order(name, shape):
    """MAN hooks these: each must be a distinct non-inplace ReLU of the body, listed in firing order."""
    m = model(name, shape)
    fired: list[nn.Module] = []
    handles = [p.register_forward_hook(lambda mod, i, o: fired.append(mod)) for p in m.activation_points]

    with torch.no_grad():
        m(batch(shape))
    for h in handles:
        h.remove()

    assert fired == m.activation_points
    assert all(isinstance(p, nn.ReLU) and not p.inplace for p in m.activation_points)
    assert not any(isinstance(mod, nn.ReLU) for mod in m.head.modules())


def test_feddyn_cnn_activations_are_the_four_man_layers_and_hooks_are_removed():
    m, x = model("feddyn_cnn", CIFAR, 100), batch(CIFAR)

    with first_activations(m.activation_points) as acts:
        logits = m(x)

    assert logits.shape == (2, 100)
    assert list(acts) == m.activation_points  # each fires, in the order they are listed
    # conv activations are taken before pooling: 32-5+1 = 28, pool 14, 14-5+1 = 10.
    assert [tuple(a.shape) for a in acts.values()] == [(2, 64, 28, 28), (2, 64, 10, 10), (2, 384), (2, 192)]
    assert all((a >= 0).all() for a in acts.values())
    assert not any(mod._forward_hooks for mod in m.modules())


def test_activations_removes_hooks_when_forward_raises():
    m = model("feddyn_cnn", CIFAR)

    with pytest.raises(RuntimeError), first_activations(m.activation_points):
        m(torch.zeros(2, 5, 32, 32))  # wrong channel count

    assert not any(mod._forward_hooks for mod in m.modules())


def test_activation_penalty_backpropagates_into_the_body():
    torch.manual_seed(0)
    m = build_model("mlp", FMNIST, 10)

    with first_activations(m.activation_points) as acts:
        m(batch(FMNIST))
    sum(a.pow(2).mean() for a in acts.values()).backward()

    assert all(p.grad is not None for p in m.body.parameters())
    assert all(p.grad is None for p in m.head.parameters())


@pytest.mark.parametrize(
    ("name", "shape", "classes", "expected"),
    [
        # flatten 784 -> fc 784*200+200 = 157,000; fc 200*200+200 = 40,200; head 200*10+10 = 2,010.
        ("mlp", FMNIST, 10, 199_210),
        # conv 1*25*32+32 = 832; conv 32*25*64+64 = 51,264; 28 -> 14 -> 7, fc 7*7*64 = 3136: 3136*512+512
        # = 1,606,144; head 512*10+10 = 5,130. Total 1,663,370, the count McMahan et al. report.
        ("fedavg_cnn", FMNIST, 10, 1_663_370),
        # conv 3*25*32+32 = 2,432; conv 51,264; 32 -> 16 -> 8, fc 4096*512+512 = 2,097,664; head 5,130.
        ("fedavg_cnn", CIFAR, 10, 2_156_490),
        # conv 3*25*64+64 = 4,864; conv 64*25*64+64 = 102,464; 32 -> 28 -> 14 -> 10 -> 5, fc 1600*384+384
        # = 614,784; fc 384*192+192 = 73,920; head 192*100+100 = 19,300.
        ("feddyn_cnn", CIFAR, 100, 815_332),
        # convs 3*9*64+64 = 1,792 and 2 x (64*9*64+64 = 36,928); 3 GroupNorms 3 x 128; 64 -> 32 -> 16 -> 8,
        # fc 4096*512+512 = 2,097,664; fc 512*384+384 = 196,992; head 384*200+200 = 77,000.
        ("tinyimagenet_cnn", (3, 64, 64), 200, 2_447_688),
        # The standard CIFAR ResNet-18 count (e.g. kuangliu/pytorch-cifar): 11,168,832 + head 512*10+10.
        ("resnet18", CIFAR, 10, 11_173_962),
        # VGG-11 convs (3x3, with bias): 3*9*64+64 = 1,792; 64*9*128+128 = 73,856; 128*9*256+256 = 295,168;
        # 256*9*256+256 = 590,080; 256*9*512+512 = 1,180,160; 3 x (512*9*512+512 = 2,359,808) = 7,079,424: 9,220,480.
        # 32 -> 1 after five pools, flatten 512; fc 2 x (512*512+512 = 262,656) = 525,312; head 512*10+10 = 5,130.
        ("vgg11", CIFAR, 10, 9_750_922),
        # SL-ViT at 32x32: patch 8, 16 patches, patch_dim 5*3*8*8 = 960; SPT LayerNorm 2*960 = 1,920 + Linear
        # 960*192+192 = 184,512; pos 17*192 = 3,264; cls 192. Per block: LN 384, temperature 1, qkv 192*2304
        # = 442,368 (no bias), out 768*192+192 = 147,648, LN 384, FF 2 x (192*192+192 = 37,056): 664,897; x 9 =
        # 5,984,073. Head LN 384 + 192*10+10 = 1,930.
        ("sl_vit", CIFAR, 10, 6_176_275),
        # At 28x28 (PathMNIST): patch 7, 16 patches, patch_dim 5*3*49 = 735; SPT 1,470 + 735*192+192 = 141,312;
        # pos 3,264; cls 192; blocks 5,984,073; head 384 + 192*9+9 = 1,737.
        ("sl_vit", (3, 28, 28), 9, 6_132_432),
    ],
)
def test_parameter_counts_match_the_paper_architectures(name, shape, classes, expected):
    """VGG-11 and SL-ViT's counts are also those of FedSOL's ``vgg.vgg11`` and ``small_vit.ViT`` as its
    ``create_models`` builds them (``Lee-Gihun/FedSOL:train_tools``)."""
    assert n_params(model(name, shape, classes)) == expected


def test_feddyn_cnn_first_dense_layer_is_1600_to_384_on_cifar():
    fc1 = model("feddyn_cnn", CIFAR, 100).body.fc1.linear

    assert (fc1.in_features, fc1.out_features) == (1600, 384)


def test_tinyimagenet_cnn_widths_are_configurable():
    torch.manual_seed(0)
    m = build_model("tinyimagenet_cnn", (3, 64, 64), 200, widths=(384, 192))

    assert m.feature_dim == 192 and m.body.fc1.linear.in_features == 4096


@pytest.mark.parametrize("name", sorted(MODELS))
def test_construction_is_deterministic_given_the_seed(name):
    torch.manual_seed(3)
    a = build_model(name, CIFAR, 10).state_dict()
    torch.manual_seed(3)
    b = build_model(name, CIFAR, 10).state_dict()

    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_model_name_is_a_user_error_listing_the_allowed_names():
    with pytest.raises(FLTuneError, match="model.name") as err:
        build_model("vgg99", CIFAR, 10)

    assert "vgg99" in str(err.value) and "feddyn_cnn" in str(err.value)


def test_input_too_small_for_the_architecture_is_a_user_error():
    expected = r"model.name: 'feddyn_cnn' cannot take inputs of shape \(3, 8, 8\)"
    with pytest.raises(FLTuneError, match=expected):
        build_model("feddyn_cnn", (3, 8, 8), 10)


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [("fmnist", "fedavg_cnn"), ("emnist_letters", "fedavg_cnn"), ("synthetic", "fedavg_cnn"),
     ("mnist", "fedavg_cnn"), ("cifar10", "feddyn_cnn"), ("cifar100", "feddyn_cnn"), ("svhn", "feddyn_cnn")],
)
def test_default_model_per_dataset(dataset, expected):
    assert default_model(dataset) == expected
    assert expected in MODELS


def test_default_model_for_unknown_dataset_asks_for_model_name():
    with pytest.raises(FLTuneError, match="model.name"):
        default_model("imagenet21k")


def test_a_new_model_file_can_register_itself(monkeypatch):
    """A new model = its builder file plus its name in ``fltune.catalog.MODELS`` (what the config checks)."""
    from fltune import catalog

    monkeypatch.setattr(registry, "MODELS", dict(registry.MODELS))
    monkeypatch.setattr(catalog, "MODELS", (*catalog.MODELS, "toy"))

    @registry.register_model("toy")
    def toy(in_shape, num_classes):
        return SplitModel(nn.Flatten(), nn.Linear(3, num_classes), feature_dim=3)

    assert isinstance(build_model("toy", (3, 1, 1), 2), SplitModel)
    with pytest.raises(ValueError, match="twice"):
        registry.register_model("toy")(toy)


def test_split_keys_rejects_keys_outside_body_and_head():
    m = SplitModel(nn.Flatten(), nn.Linear(3, 2), feature_dim=3)
    m.extra = nn.Linear(1, 1)

    with pytest.raises(ValueError, match="extra.weight"):
        split_keys(m)
