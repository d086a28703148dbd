"""ResNet-56 (FedML): pinned size and shapes, width-ω slicing against narrow copies, stochastic depth."""

from __future__ import annotations

import pytest
import torch

from fltune.models import build_model
from fltune.models.resnet56 import Bottleneck, ResNet56, make_divisible, make_stage, run_stage, slim

CIFAR, FMNIST = (3, 32, 32), (1, 28, 28)


def tiny(seed: int = 0) -> ResNet56:
    """2 blocks per stage, base 8: stage outputs 32, 64, 128 channels; quick on 3x16x16 inputs."""
    torch.manual_seed(seed)
    return build_model("resnet56", (3, 16, 16), 10, blocks=2, base=8)


def images(shape: tuple[int, int, int], n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def randomise(module: torch.nn.Module) -> None:
    """Random weights and BN affine parameters, so that slicing the wrong channels would show."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        # stem conv 3*9*16 = 432 + BN 32. Bottleneck(c_in, p) = c_in*p + 9p² + 4p² weights + BN 2p+2p+8p,
        # plus a c_in*4p + 8p projection in each stage's first block:
        # stage 1 (p=16): 4,928 + 5 x 4,544 = 27,648; stage 2 (p=32): 24,192 + 5 x 17,792 = 113,152;
        # stage 3 (p=64): 95,488 + 5 x 70,400 = 447,488. Body 588,752; head 256*C + C.
        (10, 591_322),
        (100, 614_452),  # FedAlign Tables 5/7: "0.61 M"
    ],
)
def test_parameter_count_is_fedml_resnet56(classes, expected):
    torch.manual_seed(0)
    model = build_model("resnet56", CIFAR, classes)

    assert sum(p.numel() for p in model.parameters()) == expected
    assert len(list(model.body.blocks())) == 18  # 3 stages x 6 bottlenecks = 54 convs + stem + fc


def test_forward_cost_matches_fedalign_table_5():
    """87.3 "MFLOPs" per CIFAR sample in FedAlign Table 5 are multiply-accumulates; fltune counts 2 per MAC."""
    from fltune.metrics.cost import forward_flops_per_sample

    torch.manual_seed(0)
    model = build_model("resnet56", CIFAR, 100)

    assert forward_flops_per_sample(model, CIFAR) / 2 == pytest.approx(87.3, abs=0.1)


@pytest.mark.parametrize(("shape", "side"), [(CIFAR, 32), (FMNIST, 28)])
def test_stage_shapes_and_width_passes(shape, side):
    torch.manual_seed(0)
    model = build_model("resnet56", shape, 10)

    x2, x3, logits = model.feature_maps(images(shape))
    x2_s, x3_s = model.stage3_at_width(x2, 0.25)

    assert x2.shape == (2, 128, side // 2, side // 2) and x3.shape == (2, 256, side // 4, side // 4)
    assert logits.shape == (2, 10)
    assert x2_s.shape == (2, 32, side // 2, side // 2) and x3_s.shape == (2, 64, side // 4, side // 4)
    assert torch.equal(x2_s, x2[:, :32])


@pytest.mark.parametrize(("value", "expected"), [(128 * 0.25, 32), (64 * 0.25, 16), (16 * 0.8, 16), (64 * 0.8, 48),
                                                 (3.0, 8), (128 * 0.1, 16)])
def test_make_divisible_rounds_to_multiples_of_eight(value, expected):
    assert make_divisible(value) == expected


@pytest.mark.parametrize("width", [0.25, 0.5])
def test_sliced_stage3_equals_a_narrow_stage_with_copied_weights(width):
    model = tiny()
    randomise(model.body.layer3)
    x2 = torch.relu(images((64, 4, 4), n=4))
    narrow = make_stage(slim(64, width), slim(32, width), blocks=2, stride=2)
    full_params = dict(model.body.layer3.named_parameters())
    with torch.no_grad():
        for name, p in narrow.named_parameters():
            p.copy_(full_params[name][tuple(slice(0, n) for n in p.shape)])
    running = {k: v.clone() for k, v in model.body.layer3.state_dict().items() if "running" in k}

    _, sliced = model.stage3_at_width(x2, width)
    expected = run_stage(narrow.train(), x2[:, : slim(64, width)], 1.0)

    torch.testing.assert_close(sliced, expected, rtol=1e-5, atol=1e-5)
    after = model.body.layer3.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in running.items())  # full-width BN stats untouched


def test_reduced_width_bn_ignores_running_stats_in_eval():
    model = tiny().eval()
    x = images((3, 16, 16), n=4)
    before = model.forward_at_width(x, 0.5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.fill_(3.0)

    torch.testing.assert_close(model.forward_at_width(x, 0.5), before)


def test_width_one_is_the_plain_network():
    model = tiny().train()
    x = images((3, 16, 16), n=4)

    x2, x3, logits = model.feature_maps(x)

    assert torch.equal(model.forward_at_width(x, 1.0), logits)
    assert torch.equal(model(x), logits)
    assert torch.equal(model.stage3_at_width(x2, 1.0)[1], x3)


def test_stochastic_depth_survival_falls_linearly_to_rho_l():
    model = tiny()  # 6 blocks

    model.set_stochastic_depth(0.7)

    expected = [1 - l / 6 * 0.3 for l in range(1, 7)]
    assert [b.survival for b in model.body.blocks()] == pytest.approx(expected)


def block_parts(block: Bottleneck, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    branch = block.conv3(block.relu2(block.conv2(block.relu1(block.conv1(x)))))
    return branch, block.shortcut(x)


def test_stochastic_depth_eval_scales_the_branch_by_its_survival():
    block = make_stage(16, 8, blocks=1, stride=2)[0].eval()
    randomise(block)
    block.survival = 0.6
    x = torch.relu(images((16, 8, 8)))

    branch, identity = block_parts(block, x)

    torch.testing.assert_close(block(x), torch.relu(0.6 * branch + identity))


def test_stochastic_depth_training_keeps_the_branch_with_its_survival_probability():
    block = make_stage(16, 8, blocks=1, stride=2)[0].train()
    block.survival = 0.5
    x = torch.relu(images((16, 8, 8)))
    branch, identity = block_parts(block, x)
    kept = []
    for seed in range(8):
        torch.manual_seed(seed)
        keep = float(torch.rand(())) < 0.5
        torch.manual_seed(seed)
        out = block(x)
        torch.testing.assert_close(out, torch.relu(branch + identity) if keep else torch.relu(identity))
        kept.append(keep)

    assert any(kept) and not all(kept)


def test_plain_model_draws_no_random_numbers():
    model = tiny().train()
    state = torch.get_rng_state()

    model(images((3, 16, 16)))

    assert torch.equal(torch.get_rng_state(), state)
