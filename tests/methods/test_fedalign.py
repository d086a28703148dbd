"""FedAlign (Eq. 5-7, Alg. 1): CE + μ·MSE(K_S, K_F) with K = ‖TM‖_SN by power iteration."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Method
from fltune.methods.fedalign import lipschitz_loss, spectral_norm, transmitting_matrix
from tests.methods.helpers import loss_of, make_ctx, tiny_model
from tests.methods.resnet56_helpers import resnet_batch, tiny_resnet

FedAlign = get_method("fedalign")


def fedalign(**params) -> Method:
    return FedAlign(FedAlign.Params(**params))


def test_transmitting_matrix_and_lipschitz_hand_checked():
    # f1: one 2x2 channel, pooled to f2's 1x1 → 2.5; f2: two 1x1 channels (5, 6). TM = 2.5·[5, 6] / 1.
    f1 = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    f2 = torch.tensor([[[[5.0]], [[6.0]]]])

    tm = transmitting_matrix(f1, f2)

    torch.testing.assert_close(tm, torch.tensor([[[12.5, 15.0]]]))
    assert spectral_norm(tm).item() == pytest.approx(math.hypot(12.5, 15.0), rel=1e-6)


def test_power_iteration_matches_the_svd_largest_singular_value():
    gen = torch.Generator().manual_seed(0)
    f1 = torch.rand(3, 12, 8, 8, generator=gen)  # post-ReLU-like, non-negative, larger map
    f2 = torch.rand(3, 20, 4, 4, generator=gen)

    tm = transmitting_matrix(f1, f2)

    pooled = F.adaptive_avg_pool2d(f1, (4, 4))
    direct = torch.einsum("bchw,bdhw->bcd", pooled, f2) / 16
    torch.testing.assert_close(tm, direct)
    torch.testing.assert_close(spectral_norm(tm), torch.linalg.matrix_norm(tm, ord=2), rtol=0.01, atol=0)


def test_loss_is_ce_plus_mu_mse_of_student_and_teacher_lipschitz_constants():
    model, (x, y) = tiny_resnet().train(), resnet_batch()

    loss, logits = loss_of(fedalign(mu=0.3, omega_s=0.5, rescale=False), make_ctx(model), x, y)

    x2, x3, full = model.feature_maps(x)
    x2_s, x3_s = model.stage3_at_width(x2, 0.5)
    assert x2_s.shape[1] == 32 and x3_s.shape[1] == 64  # make_divisible(64·0.5), make_divisible(128·0.5)
    k_s = spectral_norm(transmitting_matrix(x2_s, x3_s))
    k_f = spectral_norm(transmitting_matrix(x2, x3))
    torch.testing.assert_close(loss, F.cross_entropy(full, y) + 0.3 * ((k_s - k_f) ** 2).mean())
    torch.testing.assert_close(logits, full)


def test_rescaled_term_has_the_value_mu_times_ce():
    model, (x, y) = tiny_resnet().train(), resnet_batch()

    loss, logits = loss_of(fedalign(mu=0.45), make_ctx(model), x, y)

    torch.testing.assert_close(loss, 1.45 * F.cross_entropy(logits, y))


def test_lipschitz_term_trains_only_stage_3():
    model, (x, _) = tiny_resnet().train(), resnet_batch()
    x2, x3, _ = model.feature_maps(x)

    lipschitz_loss(model, x2, x3, 0.25).backward()

    for name, p in model.named_parameters():
        moved = p.grad is not None and bool(p.grad.abs().sum() > 0)
        assert moved == name.startswith("body.layer3."), name


@pytest.mark.parametrize("params", [{"mu": 0.0}, {"omega_s": 1.0}], ids=["mu=0", "omega_s=1"])
def test_degenerate_settings_are_plain_ce(params):
    model, (x, y) = tiny_resnet().train(), resnet_batch()

    loss, logits = loss_of(fedalign(**params), make_ctx(model), x, y)

    assert torch.equal(loss, F.cross_entropy(logits, y))


def test_defaults_and_model_requirement():
    assert FedAlign.Params().model_dump() == {"mu": 0.45, "omega_s": 0.25, "rescale": True}
    assert FedAlign.default_model == "resnet56"
    with pytest.raises(FLTuneError, match="model.name"):
        FedAlign().adapt_model(tiny_model())
