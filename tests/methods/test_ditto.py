"""Ditto: w by FedAvg; personal v ← v − η·∇[CE(v) + (λ/2)‖v − w_g‖²] on the same batches."""

import pytest
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from fltune.engine.functional import client_backward, functional_gradient
from fltune.methods.objective import Batch, Forward
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_batch, tiny_model

Ditto = get_method("ditto")


def ditto(lam):
    return Ditto(Ditto.Params(lam=lam))


def shifted(model, delta):
    return {k: v.detach().clone() + delta for k, v in model.state_dict().items()}


def personal_after_one_step(method, global_state, lr=0.1, grad_clip=None):
    """A client whose personal model is tiny_model(seed 1) and whose round global is ``global_state``."""
    ctx = make_ctx(tiny_model(seed=1), global_state=global_state, lr=lr, grad_clip=grad_clip)
    method.setup_client(ctx)
    x, y = tiny_batch()
    client_backward(method)(ctx, x, y)
    return ctx, {n: p.detach() for n, p in ctx.scratch["personal"].model.named_parameters()}


def test_personal_step_is_sgd_on_ce_plus_half_lambda_squared_distance():
    """Gradient of (λ/2)‖v − w_g‖² is λ(v − w_g): with w_g = v − 0.1 it adds λ·0.1 to every coordinate."""
    start = tiny_model(seed=1)
    global_state = shifted(start, -0.1)
    x, y = tiny_batch()
    F.cross_entropy(start(x), y).backward()

    _, personal = personal_after_one_step(ditto(2.0), global_state, lr=0.1)

    for name, param in start.named_parameters():
        assert torch.allclose(personal[name], param - 0.1 * (param.grad + 2.0 * 0.1), atol=1e-6)


def test_lambda_zero_personal_models_ignore_the_global_model():
    base = tiny_model(seed=2)
    _, a = personal_after_one_step(ditto(0.0), shifted(base, 0.0))
    _, b = personal_after_one_step(ditto(0.0), shifted(base, 5.0))

    assert all(torch.equal(a[n], b[n]) for n in a)


def test_global_copy_trains_from_w_g_and_personal_model_stays_in_the_state():
    global_state = shifted(tiny_model(seed=2), 0.0)
    ctx, personal = personal_after_one_step(ditto(0.1), global_state)

    result = ditto(0.1).client_result(ctx)

    assert all(torch.equal(ctx.model.state_dict()[k], global_state[k]) for k in global_state)  # grads only
    assert set(result.update) == set(global_state)
    assert all((result.state["personal"][n] == personal[n].numpy()).all() for n in personal)
    assert all(ctx.model.get_parameter(n).grad is not None for n in personal)


def test_with_grad_clip_the_personal_step_is_clipped_as_fedcrs_code():
    """FedCR's ``train_cnn_local``: loss CE(v) − λ⟨v, w_g⟩, ``clip_grad_norm_(max_norm)``, then SGD with weight
    decay λ, i.e. v ← v − η·(clip(∇CE − λ·w_g) + λ·v). Rebuilt here with torch's own clip and SGD."""
    lam, lr, max_norm = 2.0, 0.1, 0.5
    reference = tiny_model(seed=1)
    global_state = shifted(reference, -0.1)
    x, y = tiny_batch()
    linear = sum((p * global_state[n]).sum() for n, p in reference.named_parameters())
    (F.cross_entropy(reference(x), y) - lam * linear).backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    torch.optim.SGD(reference.parameters(), lr=lr, weight_decay=lam).step()
    assert norm > max_norm  # the bound is active

    _, clipped = personal_after_one_step(ditto(lam), global_state, lr=lr, grad_clip=max_norm)
    _, unclipped = personal_after_one_step(ditto(lam), global_state, lr=lr)

    for name, param in reference.named_parameters():
        assert torch.allclose(clipped[name], param.detach(), atol=1e-6)
    assert not all(torch.allclose(clipped[n], unclipped[n], atol=1e-4) for n in clipped)


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_both_paths_step_v_with_the_bits_of_autograd_through_eq_2(grad_clip):
    """The personal step adds λ(v − w_g) to ∇CE(v) instead of differentiating (λ/2)‖v − w_g‖², and steps all
    parameters as one flat vector: autograd's (λ/2)·2(v − w_g) rounds to the same floats and every op is
    elementwise, so the exact ``backward`` and the batched ``step`` leave v where autograd
    through CE + (λ/2)‖v − w_g‖², parameter by parameter, would, to the last bit."""
    lam, lr = 0.3, 0.1
    model = tiny_model(seed=1)  # v, as personal_after_one_step starts it
    global_state = shifted(tiny_model(seed=2), 0.0)
    x, y = tiny_batch()
    v = {n: p.detach().clone() for n, p in model.named_parameters()}
    forward = Forward(model)

    def stepped(ce_of):
        def eq_2(params):
            distance = sum(((p - global_state[n]) ** 2).sum() for n, p in params.items())
            return ce_of(params) + 0.5 * lam * distance, ()

        grads, _, _ = functional_gradient(eq_2, v)
        if grad_clip is not None:  # FedCR's code: ∇CE − λ·w_g clipped (clip_grad_norm_'s rule), λ·v added back
            bounded = {n: g - lam * v[n] for n, g in grads.items()}
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in bounded.values()]))
            scale = (grad_clip / (norm + 1e-6)).clamp(max=1.0)
            grads = {n: g * scale + lam * v[n] for n, g in bounded.items()}
        return {n: v[n] - lr * grads[n] for n in v}

    _, exact = personal_after_one_step(ditto(lam), global_state, lr=lr, grad_clip=grad_clip)
    expected = stepped(lambda params: F.cross_entropy(forward(params, x), y))
    assert all(torch.equal(exact[n], expected[n]) for n in v)

    weight = torch.ones(len(y))
    batch = Batch(forward, v, x, y, weight, {"personal": v}, {}, global_state, trainable=tuple(v), lr=lr,
                  grad_clip=grad_clip, gradient=functional_gradient)
    ditto(lam).step(batch)
    functional = batch.kept["personal"]
    expected = stepped(lambda params: batch.cross_entropy(forward(params, x)))
    assert all(torch.equal(functional[n], expected[n]) for n in v)


def test_first_personal_initial_starts_a_new_clients_personal_model_from_the_initial_one():
    """FedCR's code makes every client's ``model_local`` a copy of the initial model before round 1: a client
    first sampled later starts v there, not at the round's global model. A client with a personal model keeps
    its own; the server stops sending the initial model once every client has one."""
    method = Ditto(Ditto.Params(lam=0.1, first_personal="initial"))
    initial = {k: v.detach().numpy().copy() for k, v in tiny_model(seed=3).state_dict().items()}
    server_state = method.init_server_state(initial)
    payload = method.server_payload(server_state)
    round_global = shifted(tiny_model(seed=2), 0.0)

    new = make_ctx(tiny_model(seed=2), global_state=round_global, server=payload)
    method.setup_client(new)
    assert all(torch.equal(t, torch.tensor(initial[k])) for k, t in new.scratch["personal"].model.state_dict().items())
    assert all(torch.equal(new.model.state_dict()[k], round_global[k]) for k in round_global)  # w trains from w_g

    own = {k: v + 1.0 for k, v in initial.items()}
    returning = make_ctx(tiny_model(seed=2), global_state=round_global, server=payload, state={"personal": own})
    returning.model.load_state_dict({k: torch.tensor(v) for k, v in own.items()})  # as the engine loads it
    method.setup_client(returning)
    assert all(torch.equal(t, torch.tensor(own[k])) for k, t in returning.scratch["personal"].model.state_dict().items())

    mean = {k: v + 1 for k, v in initial.items()}
    for store, keeps in (({0: {"personal": own}}, True), ({0: {"personal": own}, 1: {"personal": own}}, False)):
        ctx = ServerContext(4, initial, Aggregate(mean, 1.0, {0: store[0]}, {}), server_state, store, num_clients=2)
        assert ("initial" in method.server_payload(pure_aggregate(method, ctx).server_state)) is keeps
    assert ditto(0.1).init_server_state(initial) == {}
