"""FedSpeed: gradient ∇CE(w + ε) + λ(θ − θ_g + h_k), ε = ρ·∇CE(w)/‖∇CE(w)‖; h_k += θ_k − θ_g;
server θ = mean_S θ_k + mean_all h (docs/methods.md §2)."""

import numpy as np
import torch

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_batch, tiny_model
from tests.methods.local_helpers import (
    assert_close, ce, engine_grads, grad_of, move_away, norm, params_of, shifted,
)


def fedspeed(lam: float, rho: float):
    return get_method("fedspeed")(get_method("fedspeed").Params(lam=lam, rho=rho))


def test_gradient_is_sam_gradient_plus_prox_correction():
    model = tiny_model()
    global_state = move_away(model)
    h = {n: np.full(p.shape, 0.02, np.float32) for n, p in model.named_parameters()}
    ctx = make_ctx(model, global_state=global_state, state={"h": h})
    x, y = tiny_batch()
    w = params_of(model)
    g = grad_of(lambda p: ce(p, x, y), w)
    sam = grad_of(lambda p: ce(p, x, y), shifted(w, {n: 0.1 * v / norm(g) for n, v in g.items()}))
    expected = {n: sam[n] + 0.1 * (w[n] - global_state[n] + 0.02) for n in w}

    method = fedspeed(lam=0.1, rho=0.1)
    method.setup_client(ctx)
    _, grads = engine_grads(method, ctx, x, y)
    assert_close(grads, expected, rtol=1e-4, atol=1e-6)


def test_lambda_and_rho_zero_give_fedavg_gradients_exactly():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    method = fedspeed(lam=0.0, rho=0.0)
    method.setup_client(ctx)
    _, speed = engine_grads(method, ctx, x, y)
    _, avg = engine_grads(get_method("fedavg")(), ctx, x, y)
    assert all(torch.equal(speed[n], avg[n]) for n in avg)


def test_server_is_the_plain_mean_plus_mean_drift():
    store = {0: {"h": {"w": np.full(2, 3.0, np.float32)}}}
    mean = {"w": np.array([1.0, 2.0], np.float32)}
    ctx = ServerContext(1, {"w": np.zeros(2, np.float32)}, Aggregate(mean, 3.0, {}, {}), {}, store, num_clients=3)
    np.testing.assert_array_equal(pure_aggregate(fedspeed(0.1, 0.1), ctx).global_state["w"], [2.0, 3.0])
    assert get_method("fedspeed").weighted_by_samples is False
