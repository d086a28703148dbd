"""FedDC: L = CE + (α/2)‖θ − (θ_g − h_k)‖² + ⟨θ, c − c_k⟩; c_k ← c_k − c + (θ_g − θ_k)/(K·lr_0), lr_0 the first
round's lr;
server c += Σ_S Δc_k/N, θ = mean_S θ_k + mean_all h_k (docs/methods.md §2)."""

import numpy as np
import torch

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, ce, engine_grads, grad_of, params_of


def feddc(alpha: float):
    return get_method("feddc")(get_method("feddc").Params(alpha=alpha))


def full(model, value: float) -> dict[str, np.ndarray]:
    return {n: np.full(p.shape, value, np.float32) for n, p in model.named_parameters()}


def client(shift: float = 0.2, h: float = 0.1, c_k: float = 0.3, c: float = 0.1):
    model = tiny_model()
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    return make_ctx(
        model, global_state=global_state, state={"h": full(model, h), "c": full(model, c_k)},
        server={"c": full(model, c)}, lr=0.1,
    )


def test_gradient_is_ce_drift_penalty_and_control_variate_correction():
    ctx = client()
    method = feddc(0.1)
    method.setup_client(ctx)
    x, y = tiny_batch()
    theta_g = {n: ctx.global_state[n] for n, _ in ctx.model.named_parameters()}

    def objective(p):
        penalty = sum(((p[n] - (theta_g[n] - 0.1)) ** 2).sum() for n in p)
        linear = sum((p[n] * (0.1 - 0.3)).sum() for n in p)  # ⟨θ, c − c_k⟩
        return ce(p, x, y) + 0.05 * penalty + linear

    _, grads = engine_grads(method, ctx, x, y)
    assert_close(grads, grad_of(objective, params_of(ctx.model)), rtol=1e-4, atol=1e-6)


def test_client_updates_drift_and_control_variate():
    """K = 4 steps at lr 0.1, θ_k − θ_g = 0.2: c_k⁺ = 0.3 − 0.1 + (−0.2)/(4·0.1) = −0.3; h_k⁺ = 0.1 + 0.2."""
    ctx = client()
    method = feddc(0.1)
    method.setup_client(ctx)
    ctx.steps = 4
    result = method.client_result(ctx)
    for name in result.state["c"]:
        np.testing.assert_allclose(result.state["c"][name], -0.3, rtol=1e-5)
        np.testing.assert_allclose(result.state["h"][name], 0.3, rtol=1e-5)
    assert result.weight == 1.0


def test_the_control_variate_divides_by_the_first_rounds_lr_as_the_authors_code():
    """A decayed round (lr 0.05, training.lr 0.1): ``beta = 1/n_minibatch/learning_rate`` takes the lr the code was
    given, so c_k⁺ is again 0.3 − 0.1 + (−0.2)/(4·0.1) = −0.3 (the round's lr would give −0.8); SCAFFOLD's c_k⁺
    divides by the round's."""
    ctx = client()
    ctx.lr, ctx.initial_lr, ctx.steps = 0.05, 0.1, 4
    method = feddc(0.1)
    method.setup_client(ctx)
    for value in method.client_result(ctx).state["c"].values():
        np.testing.assert_allclose(value, -0.3, rtol=1e-5)
    scaffold = get_method("scaffold")()
    scaffold.setup_client(ctx)
    for value in scaffold.client_result(ctx).state["c"].values():
        np.testing.assert_allclose(value, 0.3 - 0.1 + (-0.2) / (4 * 0.05), rtol=1e-5)


def test_no_drift_and_no_variates_with_alpha_zero_is_exactly_fedavg():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    method = feddc(0.0)
    method.setup_client(ctx)
    _, dc = engine_grads(method, ctx, x, y)
    _, avg = engine_grads(get_method("fedavg")(), ctx, x, y)
    assert all(torch.equal(dc[n], avg[n]) for n in avg)


def test_server_updates_c_and_adds_the_mean_drift():
    """N = 2; both clients in the store: c = mean(c_k) = (1 + 3)/2, θ = mean_S θ_k + (2 + 4)/2."""
    store = {
        1: {"h": {"head.bias": np.full(2, 4.0, np.float32)}, "c": {"head.bias": np.full(2, 3.0, np.float32)}},
        0: {"h": {"head.bias": np.full(2, 2.0, np.float32)}, "c": {"head.bias": np.full(2, 1.0, np.float32)}},
    }
    mean = {"head.bias": np.array([1.0, 2.0], np.float32)}
    ctx = ServerContext(1, {"head.bias": np.zeros(2, np.float32)}, Aggregate(mean, 2.0, {}, {}), {}, store, 2)
    method = feddc(0.1)
    new = pure_aggregate(method, ctx)
    np.testing.assert_array_equal(new.global_state["head.bias"], [4.0, 5.0])
    np.testing.assert_array_equal(new.server_state["c"]["head.bias"], [2.0, 2.0])
    np.testing.assert_array_equal(method.server_payload(new.server_state)["c"]["head.bias"], [2.0, 2.0])
