"""FedDyn: L = CE − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ_g‖², h_k += θ_k − θ_g, server θ = mean_S θ_k + mean_all h
(docs/methods.md §2); the drift bookkeeping of _drift.py that FedDC and FedSpeed share."""

import numpy as np
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, ce, engine_grads, grad_of, params_of


def feddyn(alpha: float):
    return get_method("feddyn")(get_method("feddyn").Params(alpha=alpha))


def drifted_ctx(shift: float = 0.2, h: float = 0.1):
    """Every parameter ``shift`` above the global model; every entry of h_k equal to ``h``."""
    model = tiny_model()
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    state = {"h": {n: np.full(p.shape, h, np.float32) for n, p in model.named_parameters()}}
    return make_ctx(model, global_state=global_state, state=state)


def test_loss_is_ce_plus_the_drift_penalty():
    """θ − θ_g = 0.2, h_k = 0.1: (α/2)‖θ − (θ_g − h_k)‖² = (0.1/2)·n·0.3² = 0.0045·n."""
    ctx = drifted_ctx()
    method = feddyn(0.1)
    method.setup_client(ctx)
    x, y = tiny_batch()
    loss, _ = loss_of(method, ctx, x, y)
    n = sum(p.numel() for p in ctx.model.parameters())
    torch.testing.assert_close(loss, F.cross_entropy(ctx.model(x), y) + 0.0045 * n)


def test_gradient_matches_feddyn_linear_plus_proximal_form():
    """∇[CE − ⟨g_k, θ⟩ + (α/2)‖θ − θ_g‖²] with FedDyn's state g_k = −α·h_k."""
    ctx = drifted_ctx()
    method = feddyn(0.1)
    method.setup_client(ctx)
    x, y = tiny_batch()
    theta_g = {n: ctx.global_state[n] for n, _ in ctx.model.named_parameters()}
    g_k = {n: -0.1 * torch.tensor(v) for n, v in ctx.state["h"].items()}

    def feddyn_objective(p):
        linear = sum((g_k[n] * p[n]).sum() for n in p)
        prox = sum(((p[n] - theta_g[n]) ** 2).sum() for n in p)
        return ce(p, x, y) - linear + 0.05 * prox

    _, grads = engine_grads(method, ctx, x, y)
    assert_close(grads, grad_of(feddyn_objective, params_of(ctx.model)), rtol=1e-4, atol=1e-6)


def test_alpha_zero_and_no_drift_is_exactly_ce():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    method = feddyn(0.0)
    method.setup_client(ctx)
    assert torch.equal(loss_of(method, ctx, x, y)[0], loss_of(get_method("fedavg")(), ctx, x, y)[0])


def test_client_accumulates_its_drift_and_uploads_with_weight_one():
    ctx = drifted_ctx(shift=0.2, h=0.1)
    method = feddyn(0.1)
    method.setup_client(ctx)
    result = method.client_result(ctx)
    assert result.weight == 1.0
    for name, h in result.state["h"].items():
        np.testing.assert_allclose(h, 0.3, rtol=1e-5)
    assert set(result.update) == set(ctx.model.state_dict())


def test_server_adds_the_mean_drift_of_all_clients():
    """N = 4, clients 0, 2, 3 hold h = 1, 2, 5 (client 1 never sampled, h = 0): mean_all h = 8/4 = 2."""
    global_state = {"head.weight": np.zeros(2, np.float32), "head.count": np.array(7, np.int64)}
    mean = {"head.weight": np.array([1.0, -1.0], np.float32), "head.count": np.array(9, np.int64)}
    store = {cid: {"h": {"head.weight": np.full(2, h, np.float32)}} for cid, h in ((3, 5.0), (0, 1.0), (2, 2.0))}
    ctx = ServerContext(3, global_state, Aggregate(mean, 2.0, {3: store[3]}, {}), {}, store, num_clients=4)
    out = pure_aggregate(feddyn(0.1), ctx)
    new = out.global_state
    assert out.server_state == {} and out.client_states == {3: store[3]}
    np.testing.assert_array_equal(new["head.weight"], [3.0, 1.0])
    assert new["head.count"] == 9  # buffers are averaged, not drift-corrected
