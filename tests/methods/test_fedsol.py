"""FedSOL (Alg. 1, Eq. 5-8): g = ∇L_p, L_p = KL(softmax(z_g/3) ‖ softmax(z_l/3)) on the perturbed scope;
s = |w − w_g| L2-normalised along dim 0; ε = ρ·s⊙g/‖g‖; CE gradient at w + ε (docs/methods.md §2)."""

import pytest
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import (
    assert_close, ce, engine_grads, grad_of, mlp, move_away, norm, params_of, shifted,
)


def fedsol(**params):
    return get_method("fedsol")(get_method("fedsol").Params(**params))


def expected_gradients(model, global_state, x, y, rho: float, prefixes: tuple[str, ...], adaptive: bool = True):
    """Eq. 5-8 written out: ascent on the proximal KL over ``prefixes``, CE gradient at w + ε."""
    w = params_of(model)
    w_g = {n: global_state[n] for n in w}
    z_g = mlp(w_g, x)[0]

    def proximal(p):
        p_g, log_p_l = torch.softmax(z_g / 3, 1), torch.log_softmax(mlp(p, x)[0] / 3, 1)
        return (p_g * (p_g.log() - log_p_l)).sum() / len(x)

    g = {n: v for n, v in grad_of(proximal, w).items() if n.startswith(prefixes)}
    s = {n: F.normalize((w[n] - w_g[n]).abs(), dim=0) if adaptive else torch.ones_like(w[n]) for n in g}
    eps = {n: rho * s[n] * g[n] / norm(g) for n in g}
    return grad_of(lambda p: ce(p, x, y), shifted(w, eps))


@pytest.mark.parametrize(("scope", "prefixes"), [("head", ("head.",)), ("all", ("body.", "head."))])
def test_gradient_is_ce_at_the_adaptive_proximal_perturbation(scope, prefixes):
    model = tiny_model()
    global_state = move_away(model, scale=0.05)
    x, y = tiny_batch()
    expected = expected_gradients(model, global_state, x, y, rho=2.0, prefixes=prefixes)
    ctx = make_ctx(model, global_state=global_state)
    method = fedsol(rho=2.0, scope=scope)
    method.setup_client(ctx)
    loss, grads = engine_grads(method, ctx, x, y)
    assert_close(grads, expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loss, ce(params_of(model), x, y))


def test_fixed_strength_perturbs_along_the_normalised_proximal_gradient():
    model = tiny_model()
    global_state = move_away(model, scale=0.05)
    x, y = tiny_batch()
    expected = expected_gradients(model, global_state, x, y, rho=0.5, prefixes=("head.",), adaptive=False)
    ctx = make_ctx(model, global_state=global_state)
    method = fedsol(rho=0.5, adaptive=False)
    method.setup_client(ctx)
    assert_close(engine_grads(method, ctx, x, y)[1], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("moved", [False, True])
def test_no_perturbation_is_fedavg_exactly(moved):
    """ρ = 0 anywhere, or any ρ at w = w_g (s = 0, and the KL gradient is 0): FedAvg's gradient."""
    model = tiny_model()
    global_state = move_away(model) if moved else None
    x, y = tiny_batch()
    ctx = make_ctx(model, global_state=global_state)
    method = fedsol(rho=0.0 if moved else 1.0, scope="all")
    method.setup_client(ctx)
    _, sol = engine_grads(method, ctx, x, y)
    _, avg = engine_grads(get_method("fedavg")(), ctx, x, y)
    assert all(torch.equal(sol[n], avg[n]) for n in avg)
