"""MOON: L = CE + μ·CE([cos(z, z_g), cos(z, z_prev)]/τ, 0), z from the projector adapt_model inserts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Aggregate, Method, ServerContext
from fltune.methods.moon import PROJECTION_DIM, contrastive_loss
from fltune.models import SplitModel, split_keys
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch, tiny_model
from tests.methods.resnet56_helpers import resnet_batch, tiny_resnet

Moon = get_method("moon")


def moon(**params) -> Method:
    return Moon(Moon.Params(**params))


def adapted(seed: int = 0) -> SplitModel:
    return moon().adapt_model(tiny_model(seed))


def shifted_state(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def test_contrastive_loss_hand_checked():
    # cos(z, z_g) = 1, cos(z, z_prev) = 0, τ = 0.5: logits [2, 0], loss = log(1 + e^-2).
    z, z_g, z_prev = torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 3.0]])

    assert contrastive_loss(z, z_g, z_prev, tau=0.5).item() == pytest.approx(math.log1p(math.exp(-2)), rel=1e-6)


def test_adapt_model_puts_the_projector_between_body_and_a_new_head():
    base = tiny_model()
    model = moon().adapt_model(base)
    x, _ = tiny_batch()

    projector = model.body.projector
    assert (projector.fc1.in_features, projector.fc1.out_features) == (base.feature_dim, base.feature_dim)
    assert projector.fc2.out_features == PROJECTION_DIM == model.feature_dim
    assert (model.head.in_features, model.head.out_features) == (PROJECTION_DIM, 3)
    assert model.body.encoder is base.body
    assert split_keys(model)[0][0].startswith("body.encoder.")
    assert model.features(x).shape == (len(x), PROJECTION_DIM)


def test_loss_is_ce_plus_mu_times_the_contrastive_term():
    model = adapted()
    global_state = shifted_state(model, 1)
    prev_state = {k: v.numpy() for k, v in shifted_state(model, 2).items()}
    ctx = make_ctx(model, global_state=global_state, state={"prev": prev_state})
    method = moon(mu=0.7, tau=0.3)
    x, y = tiny_batch()

    method.setup_client(ctx)
    loss, logits = loss_of(method, ctx, x, y)

    def z_of(state):
        other = adapted()
        other.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        return other.features(x)

    z, z_g, z_p = model.features(x), z_of(global_state), z_of(prev_state)
    cos_g = (z * z_g).sum(1) / (z.norm(dim=1) * z_g.norm(dim=1))
    cos_p = (z * z_p).sum(1) / (z.norm(dim=1) * z_p.norm(dim=1))
    term = -torch.log(torch.exp(cos_g / 0.3) / (torch.exp(cos_g / 0.3) + torch.exp(cos_p / 0.3))).mean()
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y) + 0.7 * term)
    assert torch.equal(logits, model(x))


def test_first_participation_uses_the_global_model_so_the_term_is_log_two():
    model = adapted()
    ctx = make_ctx(model)  # local = global, no previous model
    x, y = tiny_batch()
    method = moon(mu=2.0)

    method.setup_client(ctx)
    loss, _ = loss_of(method, ctx, x, y)

    torch.testing.assert_close(loss, F.cross_entropy(model(x), y) + 2.0 * math.log(2))


def test_mu_zero_is_exactly_ce():
    model = adapted()
    ctx = make_ctx(model, global_state=shifted_state(model, 1))
    x, y = tiny_batch()
    method = moon(mu=0.0)

    method.setup_client(ctx)

    assert torch.equal(loss_of(method, ctx, x, y)[0], F.cross_entropy(model(x), y))


def test_trained_model_becomes_the_next_previous_model():
    model = adapted()
    method = moon()
    ctx = make_ctx(model)
    method.setup_client(ctx)
    with torch.no_grad():
        model.head.bias.add_(1.0)  # "training"

    result = method.client_result(ctx)
    nxt = make_ctx(adapted(), state=result.state)
    method.setup_client(nxt)

    x, _ = tiny_batch()
    assert set(result.state["prev"]) == set(model.state_dict())
    torch.testing.assert_close(nxt.scratch["prev"](x), model(x))
    assert not any(p.requires_grad for p in nxt.scratch["prev"].parameters())


def test_model_without_a_linear_head_is_a_user_error():
    model = SplitModel(nn.Flatten(), nn.Sequential(nn.Linear(16, 3)), feature_dim=16)

    with pytest.raises(FLTuneError, match="model.name"):
        moon().adapt_model(model)


@pytest.mark.parametrize("anchors", ["eval", "train"])
def test_the_frozen_copies_run_in_the_anchors_mode_and_leave_the_shared_state_alone(anchors):
    """``anchors: train`` is FedAlign's code (its global and previous nets are never put in eval mode): on a
    ResNet with batch norm z_g and z_prev then come from each batch's own statistics, not the running ones.
    The copies' running-statistics updates stay theirs: the round's global state, which every client of a
    worker shares, keeps its bits."""
    model = moon().adapt_model(tiny_resnet())
    global_state = {k: v + 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    kept = {k: v.clone() for k, v in global_state.items()}
    prev = {k: v.numpy() for k, v in shifted_state(model, 2).items()}
    ctx = make_ctx(model, global_state=global_state, state={"prev": prev})
    x, _ = resnet_batch()
    moon(anchors=anchors).setup_client(ctx)

    def z_of(state, train: bool):
        other = moon().adapt_model(tiny_resnet())
        other.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        with torch.no_grad():
            return other.train(train).features(x)

    with torch.no_grad():
        z_g, z_p = ctx.scratch["global"].features(x), ctx.scratch["prev"].features(x)
    train = anchors == "train"
    torch.testing.assert_close(z_g, z_of(global_state, train))
    torch.testing.assert_close(z_p, z_of(prev, train))
    assert not torch.allclose(z_g, z_of(global_state, not train))  # the mode matters on this model
    assert all(torch.equal(global_state[k], kept[k]) for k in kept)


def test_a_first_participation_takes_the_initial_model_as_its_previous_one_with_first_prev_initial():
    """FedAlign's code starts every client's previous model as the initial one: a client first sampled in a
    later round contrasts against it (not the round's global model, which would make ℓ_con log 2). The server
    sends it until every client has a model of its own, then stops."""
    method = moon(first_prev="initial")
    model = adapted()
    initial = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    server_state = method.init_server_state(initial)
    later_global = shifted_state(model, 1)  # round 5's global model: no longer the initial one
    ctx = make_ctx(model, global_state=later_global, server=method.server_payload(server_state))
    x, y = tiny_batch()

    method.setup_client(ctx)
    loss, _ = loss_of(method, ctx, x, y)

    z_init = adapted()
    z_init.load_state_dict({k: torch.tensor(v) for k, v in initial.items()})
    torch.testing.assert_close(ctx.scratch["prev"].features(x), z_init.features(x))
    assert loss.item() != pytest.approx(F.cross_entropy(model(x), y).item() + math.log(2))

    mean = {k: v + 1 for k, v in initial.items()}
    half = {0: {"prev": initial}}
    full = {0: {"prev": initial}, 1: {"prev": initial}}
    for store, keeps in ((half, True), (full, False)):
        ctx_s = ServerContext(5, initial, Aggregate(mean, 1.0, {0: store[0]}, {}), server_state, store, num_clients=2)
        update = pure_aggregate(method, ctx_s)
        assert ("initial" in method.server_payload(update.server_state)) is keeps
    assert moon().init_server_state(initial) == {} and moon().server_payload({}) == {}
