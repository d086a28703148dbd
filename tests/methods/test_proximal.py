"""The proximal loss's two uses (FedSOL §2, Table 1): L = CE + β·L_p (Eq. 2) or ∇CE projected off ∇L_p
(Eq. 3), L_p = ½‖w − w_g‖² or KL(softmax(z_g/T) ‖ softmax(z_l/T)). References are the tiny MLP written out
by hand (``local_helpers``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.proximal import project_off
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, ce, engine_grads, grad_of, mlp, move_away, params_of

Proximal = get_method("proximal")


def proximal(**params):
    return Proximal(Proximal.Params(**params))


def half_l2(params, global_params):
    return 0.5 * sum(((params[n] - global_params[n]) ** 2).sum() for n in params)


def kl(params, global_params, x, temperature):
    """KL(softmax(z_g/T) ‖ softmax(z_l/T)), batch mean, written out."""
    teacher = F.softmax(mlp(global_params, x)[0] / temperature, dim=1)
    log_student = F.log_softmax(mlp(params, x)[0] / temperature, dim=1)
    return (teacher * (teacher.log() - log_student)).sum(1).mean()


def eq3(g_l, g_p):
    """Eq. 3 over all parameters as one vector, only where ⟨g_l, g_p⟩ < 0."""
    dot = sum((g_l[n] * g_p[n]).sum() for n in g_l)
    if dot >= 0:
        return g_l
    norm = sum((g_p[n] ** 2).sum() for n in g_l)
    return {n: g_l[n] - dot / norm * g_p[n] for n in g_l}


def setup(loss: str, usage: str, beta: float = 1.0, seed: int = 1, uphill: float = 0.0):
    """A method, its client context, the model's parameters and the global ones: the model moved randomly
    away from the global model, which with ``uphill`` also lies ``uphill``·∇CE from it (> 0: the proximal
    gradient conflicts with CE's, ⟨g_l, g_p⟩ < 0; < 0: they agree)."""
    model = tiny_model()
    global_state = move_away(model, scale=0.05, seed=seed)
    x, y = tiny_batch(seed=seed)
    g_l = grad_of(lambda p: ce(p, x, y), params_of(model))
    global_state = {k: v + uphill * g_l[k] if k in g_l else v for k, v in global_state.items()}
    method = proximal(loss=loss, usage=usage, beta=beta, temperature=2.0)
    ctx = make_ctx(model, global_state=global_state)
    method.setup_client(ctx)
    globals_ = {n: global_state[n] for n, _ in model.named_parameters()}
    return method, ctx, params_of(model), globals_


@pytest.mark.parametrize("loss", ["l2", "kl"])
def test_base_is_ce_plus_beta_times_the_proximal_loss(loss: str) -> None:
    method, ctx, params, globals_ = setup(loss, "base", beta=0.7)
    x, y = tiny_batch()

    value, grads = engine_grads(method, ctx, x, y)

    def expected(p):
        prox = half_l2(p, globals_) if loss == "l2" else kl(p, globals_, x, 2.0)
        return ce(p, x, y) + 0.7 * prox

    assert torch.allclose(value, expected(params), rtol=1e-5)
    assert_close(grads, grad_of(expected, params), rtol=1e-4, atol=1e-6)


CASES = [("l2", 1, 0.5), ("l2", 2, -0.5), ("l2", 3, 0.0), ("kl", 1, 0.5), ("kl", 2, -0.5), ("kl", 3, 0.0)]
"""(loss, seed, uphill): the global model uphill of CE from the local one (the two gradients conflict),
downhill (they agree) and moved at random only."""


def gradients(loss: str, seed: int, uphill: float):
    """g_l = ∇CE and g_p = ∇L_p at the case's local model, by hand."""
    _, _, params, globals_ = setup(loss, "projection", seed=seed, uphill=uphill)
    x, y = tiny_batch(seed=seed)
    g_l = grad_of(lambda p: ce(p, x, y), params)
    g_p = grad_of(lambda p: half_l2(p, globals_) if loss == "l2" else kl(p, globals_, x, 2.0), params)
    return g_l, g_p


@pytest.mark.parametrize("loss, seed, uphill", CASES)
def test_projection_removes_the_conflicting_component_of_the_ce_gradient(loss: str, seed: int,
                                                                         uphill: float) -> None:
    method, ctx, params, _ = setup(loss, "projection", seed=seed, uphill=uphill)
    x, y = tiny_batch(seed=seed)

    value, grads = engine_grads(method, ctx, x, y)

    g_l, g_p = gradients(loss, seed, uphill)
    assert torch.allclose(value, ce(params, x, y), rtol=1e-5)  # the reported loss is CE
    assert_close(grads, eq3(g_l, g_p), rtol=1e-4, atol=1e-6)
    dot = sum((grads[n] * g_p[n]).sum() for n in grads)
    assert dot >= -1e-5  # never against the proximal gradient


def test_the_cases_meet_both_signs_of_the_inner_product() -> None:
    """Uphill cases conflict and downhill ones agree, for each loss: both branches of Eq. 3 are tested."""
    for loss, seed, uphill in CASES:
        g_l, g_p = gradients(loss, seed, uphill)
        dot = float(sum((g_l[n] * g_p[n]).sum() for n in g_l))
        assert (dot < 0) == (uphill > 0), (loss, seed, uphill, dot)


def test_projection_ignores_beta_and_a_zero_proximal_gradient_leaves_ce() -> None:
    """Eq. 3 is scale-free in g_p; at w = w_g the L2 gradient is 0 and the CE gradient passes unchanged."""
    x, y = tiny_batch()
    a, ctx_a, _, _ = setup("kl", "projection", beta=0.1)
    b, ctx_b, _, _ = setup("kl", "projection", beta=5.0)
    assert_close(engine_grads(a, ctx_a, x, y)[1], engine_grads(b, ctx_b, x, y)[1], rtol=0, atol=0)

    model = tiny_model()
    at_global = make_ctx(model)
    _, grads = engine_grads(proximal(loss="l2", usage="projection"), at_global, x, y)
    assert_close(grads, grad_of(lambda p: ce(p, x, y), params_of(model)))
    assert project_off([torch.ones(2)], [torch.zeros(2)])[0].tolist() == [1.0, 1.0]


def test_l2_base_is_fedprox_with_mu_beta() -> None:
    x, y = tiny_batch()
    method, ctx, _, _ = setup("l2", "base", beta=0.4)
    fedprox = get_method("fedprox")(get_method("fedprox").Params(mu=0.4))
    assert torch.allclose(loss_of(method, ctx, x, y)[0], loss_of(fedprox, ctx, x, y)[0], rtol=1e-6)


def test_costs_follow_the_loss_and_its_use() -> None:
    assert proximal(loss="l2", usage="projection").passes_per_step == 1.0
    assert proximal(loss="kl", usage="base").passes_per_step == pytest.approx(4 / 3)
    assert proximal(loss="kl", usage="projection").passes_per_step == 2.0
    assert proximal().stored_models == 2.0
