"""GradAug: CE(full) + μ·Σ_i KL(softmax(full).detach() ‖ softmax(width-ω_i net on T_i(x)))."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.gradaug import sub_widths
from tests.methods.helpers import loss_of, make_ctx, tiny_model
from tests.methods.resnet56_helpers import resnet_batch, tiny_resnet

GradAug = get_method("gradaug")


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Σ_c p (log p − log q), averaged over the batch."""
    p, log_p, log_q = p_logits.softmax(1), p_logits.log_softmax(1), q_logits.log_softmax(1)
    return (p * (log_p - log_q)).sum(1).mean()


def test_sub_widths_are_omega_b_plus_uniform_draws_widest_first():
    torch.manual_seed(0)
    widths = sub_widths(4, 0.6)

    assert len(widths) == 4 and widths == sorted(widths, reverse=True) and 0.6 in widths
    assert all(0.6 <= w <= 1.0 for w in widths)


def test_loss_is_ce_plus_mu_sum_of_kl_to_the_detached_full_net():
    params = GradAug.Params(mu=1.5, n=3, omega_b=0.5, resolutions=(8, 6, 4))
    model, (x, y) = tiny_resnet().train(), resnet_batch()

    torch.manual_seed(3)
    loss, logits = loss_of(GradAug(params), make_ctx(model), x, y)

    torch.manual_seed(3)  # replay the draws: n − 1 uniform widths, then one size per sub-network
    widths = sorted([0.5, *(0.5 + 0.5 * torch.rand(2)).tolist()], reverse=True)
    full = model(x)
    expected = F.cross_entropy(full, y)
    for width in widths:
        size = (8, 6, 4)[int(torch.randint(3, ()))]
        resized = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=True)
        expected = expected + 1.5 * kl(full.detach(), model.forward_at_width(resized, width))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits, full)


def test_mu_zero_is_exactly_fedavg_and_draws_nothing():
    model, (x, y) = tiny_resnet().train(), resnet_batch()
    rng = torch.get_rng_state()

    loss, _ = loss_of(GradAug(GradAug.Params(mu=0.0)), make_ctx(model), x, y)

    assert torch.equal(loss, F.cross_entropy(tiny_resnet().train()(x), y))
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_full_width_full_size_sub_network_adds_nothing():
    params = GradAug.Params(mu=2.0, n=1, omega_b=1.0, resolutions=(8,))
    model, (x, y) = tiny_resnet().train(), resnet_batch()

    loss, logits = loss_of(GradAug(params), make_ctx(model), x, y)

    torch.testing.assert_close(loss, F.cross_entropy(logits, y), rtol=0, atol=1e-6)


def test_defaults_and_model_requirement():
    assert GradAug.Params().model_dump() == {"mu": 1.75, "n": 2, "omega_b": 0.8, "resolutions": (32, 28, 24, 20)}
    assert GradAug.default_model == "resnet56"
    with pytest.raises(FLTuneError, match="model.name"):
        GradAug().adapt_model(tiny_model())


@pytest.mark.parametrize(("sizes", "message"), [
    ("[0]", "method.resolutions.0: Input should be greater than or equal to 1 (got 0)"),
    ("[]", "method.resolutions: at least one input size"),
])
def test_input_sizes_are_positive_and_at_least_one(sizes: str, message: str) -> None:
    """A size of 0 used to fail inside a worker (F.interpolate), after the run had started."""
    with pytest.raises(FLTuneError, match=re.escape(message)):
        build_config(overrides=["method.name=gradaug", f"method.resolutions={sizes}"])
