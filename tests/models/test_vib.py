"""FedCR/SimFAFL VIB nets (fltune/models/vib.py): architecture, sampling, exact evaluation, KL."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

from fltune.models import SplitModel, build_model, split_keys
from fltune.methods.objective import Batch, Forward
from fltune.models.vib import VIBNet, gaussian_kl, posterior

FMNIST, CIFAR = (1, 28, 28), (3, 32, 32)


def vib(name: str = "vib_cnn", shape=FMNIST, classes: int = 10, **kwargs) -> VIBNet:
    torch.manual_seed(0)
    return build_model(name, shape, classes, **kwargs)


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    ("name", "shape", "expected"),
    [
        # conv 1*25*4+4 = 104; conv 4*25*12+12 = 1,212; 28 -> 24 -> 12 -> 8 -> 4: 12*16 = 192;
        # fc 192*1024+1024 = 197,632; fc 1024*1024+1024 = 1,049,600; encoder 1024*1024+1024 (2*512 outputs)
        # = 1,049,600; head 512*10+10 = 5,130.
        ("vib_cnn", FMNIST, 2_303_278),
        # conv 3*25*64+64 = 4,864; conv 64*25*64+64 = 102,464; 32 -> 28 -> 14 -> 10 -> 5: 1600;
        # fc 1600*1024+1024 = 1,639,424; fc 1,049,600; encoder 1,049,600; head 5,130.
        ("vib_cnn", CIFAR, 3_851_082),
        # fc 784*1024+1024 = 803,840; fc 1,049,600; encoder 1,049,600; head 5,130.
        ("vib_mlp", FMNIST, 2_908_170),
        # the plain twins: the same trunks, head 1024*10+10 = 10,250 instead of encoder + head.
        ("fedcr_cnn", FMNIST, 104 + 1_212 + 197_632 + 1_049_600 + 10_250),
        ("fedcr_cnn", CIFAR, 4_864 + 102_464 + 1_639_424 + 1_049_600 + 10_250),
        ("fedcr_mlp", FMNIST, 803_840 + 1_049_600 + 10_250),
    ],
)
def test_parameter_counts_match_fedcr_nets(name, shape, expected):
    assert n_params(vib(name, shape)) == expected


def test_trunk_is_chosen_by_channel_count_and_body_outputs_two_dim_z():
    gray, colour = vib(shape=FMNIST, dim_z=7), vib(shape=CIFAR, dim_z=7)

    assert gray.body.conv1.conv.out_channels == 4 and colour.body.conv1.conv.out_channels == 64
    assert gray.body(torch.zeros(2, *FMNIST)).shape == (2, 14)
    assert gray.feature_dim == 7 and gray.head.in_features == 7
    body, head = split_keys(gray)
    assert head == ["head.weight", "head.bias"] and "body.encoder.weight" in body


def test_vib_samples_z_by_reparameterisation_with_softplus_sigma():
    m = vib("vib_mlp", (1, 4, 4), 3, dim_z=5, samples=4)
    x = torch.randn(6, 1, 4, 4)

    torch.manual_seed(1)
    out = m.vib(x)
    torch.manual_seed(1)
    eps = torch.randn(4, 6, 5)

    mu, sigma_raw = m.body(x).chunk(2, dim=1)
    assert torch.equal(out.mu, mu) and torch.allclose(out.sigma, torch.log1p(torch.exp(sigma_raw)))
    assert torch.allclose(out.z, mu + out.sigma * eps)
    assert torch.allclose(out.logits, m.head(out.z))
    assert out.logits.shape == (4, 6, 3)
    assert m.vib(x, samples=2).z.shape == (2, 6, 5)


def test_eval_is_exact_head_of_mu_and_training_averages_the_samples():
    m = vib("vib_mlp", (1, 4, 4), 3, dim_z=5, samples=4)
    x = torch.randn(6, 1, 4, 4)

    m.eval()
    assert torch.equal(m.features(x), posterior(m.body(x))[0])
    assert torch.equal(m(x), m(x))  # deterministic

    m.train()
    torch.manual_seed(2)
    features = m.features(x)
    torch.manual_seed(2)
    assert torch.allclose(features, m.vib(x).z.mean(0))
    assert not torch.equal(features, posterior(m.body(x))[0])
    assert isinstance(m, SplitModel)


def test_gaussian_kl_hand_value_and_torch_agreement():
    # KL(N(0, 1) ‖ N(1, 2²)) = log 2 + (1 + 1)/(2·4) − ½ = log 2 − 0.25, per dimension, summed over 2.
    one = torch.ones(1, 2)
    value = gaussian_kl(0 * one, one, one, 2 * one)
    assert torch.allclose(value, torch.tensor([2 * (math.log(2) - 0.25)]))

    gen = torch.Generator().manual_seed(0)
    mu_q, mu_p = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    s_q, s_p = torch.rand(3, 4, generator=gen) + 0.1, torch.rand(3, 4, generator=gen) + 0.1
    expected = kl_divergence(Normal(mu_q, s_q), Normal(mu_p, s_p)).sum(-1)
    assert torch.allclose(gaussian_kl(mu_q, s_q, mu_p, s_p), expected, atol=1e-5)
    assert torch.allclose(gaussian_kl(mu_q, s_q, mu_q, s_q), torch.zeros(3), atol=1e-6)


def test_sampled_cross_entropy_is_the_mean_over_samples():
    logits, y = torch.randn(3, 5, 4), torch.randint(0, 4, (5,))
    batch = Batch(Forward(torch.nn.Identity()), {}, torch.zeros(5, 1), y)

    expected = torch.stack([F.cross_entropy(logits[s], y) for s in range(3)]).mean()

    assert torch.allclose(batch.cross_entropy(logits), expected)
