"""StochDepth: plain CE on a ResNet-56 whose blocks survive with p_ℓ = 1 − (ℓ/L)(1 − ρ_L)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError
from fltune.methods import get_method
from tests.methods.helpers import loss_of, make_ctx, tiny_model
from tests.methods.resnet56_helpers import resnet_batch, tiny_resnet

StochDepth = get_method("stochdepth")


def test_adapt_model_sets_the_linear_survival_schedule():
    model = StochDepth(StochDepth.Params(rho_L=0.4)).adapt_model(tiny_resnet())  # 3 blocks

    assert [b.survival for b in model.body.blocks()] == pytest.approx([0.8, 0.6, 0.4])
    assert StochDepth.Params().rho_L == 0.9 and StochDepth.default_model == "resnet56"


def test_the_codes_schedule_keeps_the_first_block_and_falls_to_rho_l_at_the_last():
    """FedAlign's ``resnet_stochdepth.py``: p starts at 1 and falls by (1 − ρ_L)/(L − 1) a block."""
    model = StochDepth(StochDepth.Params(rho_L=0.4, schedule="code")).adapt_model(tiny_resnet())  # 3 blocks

    assert [b.survival for b in model.body.blocks()] == pytest.approx([1.0, 0.7, 0.4])


def test_loss_is_ce_of_the_stochastic_forward_and_differs_across_seeds():
    method = StochDepth(StochDepth.Params(rho_L=0.1))
    model = method.adapt_model(tiny_resnet()).train()
    ctx, (x, y) = make_ctx(model), resnet_batch()
    losses = []
    for seed in range(4):
        torch.manual_seed(seed)
        loss, _ = loss_of(method, ctx, x, y)
        torch.manual_seed(seed)
        torch.testing.assert_close(loss, F.cross_entropy(model(x), y))
        losses.append(loss.item())

    assert len(set(losses)) > 1


def test_rho_one_is_exactly_fedavg_on_resnet56():
    method = StochDepth(StochDepth.Params(rho_L=1.0))
    model, (x, y) = method.adapt_model(tiny_resnet()).train(), resnet_batch()
    ctx = make_ctx(model)

    loss, _ = loss_of(method, ctx, x, y)

    assert torch.equal(loss, F.cross_entropy(tiny_resnet().train()(x), y))


def test_other_models_are_a_one_line_user_error():
    refusal = r"^model.name: stochdepth needs ResNet-56's slimmable stages; allowed: auto, resnet56"
    with pytest.raises(FLTuneError, match=refusal) as err:
        StochDepth().adapt_model(tiny_model())

    assert "\n" not in str(err.value)
