"""Mixup: λ ~ Beta(γ, γ) from torch's global RNG, L = λ·CE(f(x̃), y) + (1 − λ)·CE(f(x̃), y_π)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.mixup import mix
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model

Mixup = get_method("mixup")


def test_mix_hand_checked():
    x = torch.tensor([[0.0], [10.0]])
    torch.manual_seed(0)
    mixed, perm, lam = mix(x, gamma=0.5)

    assert 0.0 < lam < 1.0 and sorted(perm.tolist()) == [0, 1]
    expected = [lam * x[i, 0] + (1 - lam) * x[perm[i], 0] for i in range(2)]
    assert mixed[:, 0].tolist() == pytest.approx([float(e) for e in expected])


def test_loss_is_the_lambda_weighted_ce_on_mixed_inputs_with_draws_from_torch():
    model, (x, y) = tiny_model(), tiny_batch()
    method = Mixup(Mixup.Params(gamma=0.4))

    torch.manual_seed(7)
    loss, logits = loss_of(method, make_ctx(model), x, y)

    torch.manual_seed(7)  # replay: λ from torch's Beta, then the pairing
    lam = float(torch.distributions.Beta(torch.tensor(0.4), torch.tensor(0.4)).sample())
    perm = torch.randperm(len(y))
    out = model(lam * x + (1 - lam) * x[perm])
    torch.testing.assert_close(loss, lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm]))
    torch.testing.assert_close(logits, out)


def test_the_engine_seed_fixes_the_draw():
    model, (x, y) = tiny_model(), tiny_batch()
    method, ctx = Mixup(), make_ctx(model)
    losses = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        losses.append(loss_of(method, ctx, x, y)[0])

    assert torch.equal(losses[0], losses[1]) and not torch.equal(losses[0], losses[2])


def test_gamma_zero_is_exactly_fedavg_and_draws_nothing():
    model, (x, y) = tiny_model(), tiny_batch()
    ctx = make_ctx(model)
    rng = torch.get_rng_state()

    loss, _ = loss_of(Mixup(Mixup.Params(gamma=0.0)), ctx, x, y)

    assert torch.equal(loss, loss_of(get_method("fedavg")(), ctx, x, y)[0])
    assert torch.equal(torch.get_rng_state(), rng)


def test_default_is_the_fedalign_setting():
    assert Mixup.Params().gamma == 0.1
