"""FedASAM: ε = ρ·T²g/‖Tg‖ with T = |w| + η on weight tensors, 1 on biases (docs/methods.md §2)."""

import torch

from fltune.methods import get_method
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, ce, engine_grads, grad_of, norm, params_of, shifted


def fedasam(rho: float, eta: float):
    return get_method("fedasam")(get_method("fedasam").Params(rho=rho, eta=eta))


def test_gradient_is_taken_at_the_adaptive_perturbation():
    model = tiny_model()
    x, y = tiny_batch()
    w = params_of(model)
    g = grad_of(lambda p: ce(p, x, y), w)
    t = {n: v.abs() + 0.2 if n.endswith("weight") else torch.ones_like(v) for n, v in w.items()}
    tg_norm = norm({n: t[n] * g[n] for n in g})
    eps = {n: 0.5 * t[n] ** 2 * g[n] / tg_norm for n in g}
    expected = grad_of(lambda p: ce(p, x, y), shifted(w, eps))

    _, grads = engine_grads(fedasam(0.5, 0.2), make_ctx(model), x, y)

    assert_close(grads, expected)
    assert all(torch.equal(p.detach(), w[n]) for n, p in model.named_parameters())


def test_rho_zero_gives_fedavg_gradients_exactly():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    _, asam = engine_grads(fedasam(0.0, 0.2), ctx, x, y)
    _, avg = engine_grads(get_method("fedavg")(), ctx, x, y)
    assert all(torch.equal(asam[n], avg[n]) for n in avg)
