"""FedNTD: L = CE + β·τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃_l/τ)), z̃ = logits without the true class
(docs/methods.md §2)."""

import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.fedntd import not_true
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import mlp, move_away, params_of


def fedntd(tau: float, beta: float):
    return get_method("fedntd")(get_method("fedntd").Params(tau=tau, beta=beta))


def test_not_true_drops_the_label_column():
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(not_true(logits, torch.tensor([1, 0])), torch.tensor([[1.0, 3.0], [5.0, 6.0]]))


def test_loss_adds_scaled_not_true_distillation():
    model = tiny_model()
    global_state = move_away(model, scale=0.2)
    global_params = {n: global_state[n] for n, _ in model.named_parameters()}
    x, y = tiny_batch()
    ctx = make_ctx(model, global_state=global_state)
    method = fedntd(tau=2.0, beta=0.5)
    method.setup_client(ctx)
    loss, _ = loss_of(method, ctx, x, y)

    local, glob = mlp(params_of(model), x)[0], mlp(global_params, x)[0]
    kl = 0.0
    for i in range(len(y)):  # KL(p_g ‖ p_l) over the not-true classes, softened by τ = 2
        keep = [c for c in range(3) if c != y[i]]
        p_g = torch.softmax(glob[i, keep] / 2.0, 0)
        p_l = torch.softmax(local[i, keep] / 2.0, 0)
        kl = kl + (p_g * (p_g.log() - p_l.log())).sum()
    expected = F.cross_entropy(local, y) + 0.5 * 2.0**2 * kl / len(y)
    torch.testing.assert_close(loss, expected)


def test_global_model_is_frozen_and_untouched_by_training():
    model = tiny_model()
    ctx = make_ctx(model)
    method = fedntd(1.0, 1.0)
    method.setup_client(ctx)
    teacher = ctx.scratch["global_model"]
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    x, y = tiny_batch()
    loss_of(method, ctx, x, y)[0].backward()
    assert all(p.grad is None for p in teacher.parameters())


def test_beta_zero_is_exactly_ce():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    method = fedntd(1.0, 0.0)
    method.setup_client(ctx)
    assert torch.equal(loss_of(method, ctx, x, y)[0], loss_of(get_method("fedavg")(), ctx, x, y)[0])
