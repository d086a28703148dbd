"""SimFAFL Eq. 10: L = mean_s CE(head_i(z_s), y) + β1·KL(q(z|x) ‖ N(0,I)) + β2·mean_s CE(head_f(z_s), y)."""

import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from fltune.errors import FLTuneError
from fltune.methods import get_method
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model
from tests.methods.vib_helpers import global_copy, numpy_state, tiny_vib

SimFAFL = get_method("simfafl")


def simfafl(**params):
    return SimFAFL(SimFAFL.Params(**params))


def loss_at_seed(method, ctx, x, y, seed=5):
    method.setup_client(ctx)  # head_f: the round's global head
    torch.manual_seed(seed)
    return loss_of(method, ctx, x, y)


def test_defaults_are_table_2_ten_class_settings():
    assert (SimFAFL.Params().beta1, SimFAFL.Params().beta2) == (0.0025, 0.1)


def test_loss_is_eq_10_with_the_frozen_global_head():
    model = tiny_vib()
    global_state = global_copy(model)
    global_state["head.weight"] = torch.randn_like(global_state["head.weight"])  # head_f ≠ head_i
    x, y = tiny_batch()
    ctx = make_ctx(model, global_state=global_state)

    loss, logits = loss_at_seed(simfafl(beta1=0.3, beta2=0.7), ctx, x, y)

    torch.manual_seed(5)
    out = model.vib(x)
    ce = torch.stack([F.cross_entropy(out.logits[s], y) for s in range(4)]).mean()
    mu, sigma = out.mu, out.sigma
    kl = (0.5 * (sigma**2 + mu**2 - 1 - 2 * torch.log(sigma))).sum(1).mean()  # KL(q ‖ N(0, I))
    head_f = [F.linear(out.z[s], global_state["head.weight"], global_state["head.bias"]) for s in range(4)]
    ce_f = torch.stack([F.cross_entropy(h, y) for h in head_f]).mean()
    assert torch.allclose(loss, ce + 0.3 * kl + 0.7 * ce_f, rtol=1e-5)
    assert torch.allclose(logits, out.logits.mean(0))


def test_zero_heads_give_log_classes_for_both_cross_entropies():
    """Hand case: every logit 0 ⇒ CE = log 3 for head_i and head_f, so L = (1 + β2)·log 3 + β1·KL."""
    model = tiny_vib()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    x, y = tiny_batch()
    ctx = make_ctx(model)

    loss, _ = loss_at_seed(simfafl(beta1=0.0, beta2=0.5), ctx, x, y)

    assert loss.item() == pytest.approx(1.5 * math.log(3), rel=1e-6)


def test_prior_first_kl_order():
    model = tiny_vib()
    x, y = tiny_batch()
    ctx = make_ctx(model)

    loss, _ = loss_at_seed(simfafl(beta1=1.0, beta2=0.0, kl_order="prior_first"), ctx, x, y)

    torch.manual_seed(5)
    out = model.vib(x)
    ce = F.cross_entropy(out.logits.flatten(0, 1), y.repeat(4))
    mu, sigma = out.mu, out.sigma
    kl = (0.5 * (1 / sigma**2 + mu**2 / sigma**2 - 1 + 2 * torch.log(sigma))).sum(1).mean()  # KL(N(0,I) ‖ q)
    assert torch.allclose(loss, ce + kl, rtol=1e-5)


def test_beta_zero_is_the_plain_vib_personal_head_loss_and_fedcr_with_beta_zero():
    model = tiny_vib()
    x, y = tiny_batch()
    ctx = make_ctx(model)

    loss, _ = loss_at_seed(simfafl(beta1=0.0, beta2=0.0), ctx, x, y)

    torch.manual_seed(5)
    plain = F.cross_entropy(model.vib(x).logits.flatten(0, 1), y.repeat(4))
    fedcr = get_method("fedcr")(get_method("fedcr").Params(beta=0.0))
    fedcr_ctx = make_ctx(model, server=fedcr.server_payload(fedcr.init_server_state(numpy_state(model))))
    fedcr.setup_client(fedcr_ctx)
    assert torch.equal(loss, plain)
    assert torch.equal(loss, loss_at_seed(fedcr, fedcr_ctx, x, y)[0])


def test_shape_alignment_trains_the_body_only():
    """L_sa's gradient reaches the body but neither head_i nor the global head_f."""
    model = tiny_vib()
    ctx = make_ctx(model, global_state=global_copy(model))
    x, y = tiny_batch()

    loss_at_seed(simfafl(beta1=0.0, beta2=1.0), ctx, x, y)[0].backward()
    with_sa = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss_at_seed(simfafl(beta1=0.0, beta2=0.0), ctx, x, y)[0].backward()

    assert torch.allclose(model.head.weight.grad, with_sa["head.weight"])
    assert not torch.allclose(model.body.encoder.weight.grad, with_sa["body.encoder.weight"])
    assert all(not t.requires_grad for t in ctx.global_state.values())


def test_head_is_personal_yet_uploaded_with_the_body_at_weight_one():
    model = tiny_vib()
    ctx = make_ctx(model)

    result = simfafl().client_result(ctx)

    assert set(result.state["personal"]) == {"head.weight", "head.bias"}
    assert set(result.update) == set(model.state_dict())
    assert result.weight == 1.0


def test_model_auto_resolves_to_the_vib_nets_and_other_models_are_rejected():
    assert SimFAFL.model_for("emnist_letters") == "vib_mlp"
    assert SimFAFL.model_for("fmnist") == SimFAFL.model_for("cifar100") == "vib_cnn"
    with pytest.raises(FLTuneError, match="model.name: simfafl needs a VIB model"):
        simfafl().adapt_model(tiny_model())


def test_negative_betas_are_rejected():
    with pytest.raises(ValidationError):
        SimFAFL.Params(beta1=-1.0)
