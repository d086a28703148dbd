"""SCAFFOLD: gradient g − c_k + c; c_k⁺ = c_k − c + (θ_g − θ_k)/(K_eff·lr); server c += mean over all N of Δc_k,
θ = θ_g + η_g·mean_S(θ_k − θ_g) (docs/methods.md §2; K_eff under momentum as the FedSOL authors' code,
``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py``)."""

import numpy as np
import torch

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.methods import get_method
from fltune.methods._drift import parameter_tensors
from fltune.methods.base import Aggregate, ServerContext, effective_steps
from tests.conftest import needs_fmnist
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_batch, tiny_model
from tests.methods.local_helpers import engine_grads


def scaffold(server_lr: float = 1.0):
    return get_method("scaffold")(get_method("scaffold").Params(server_lr=server_lr))


def variates(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in model.named_parameters()}


def test_gradient_is_corrected_by_c_minus_c_k():
    model = tiny_model()
    x, y = tiny_batch()
    c, c_k = variates(model, 0), variates(model, 1)
    ctx = make_ctx(model, state={"c": c_k}, server={"c": c})
    method = scaffold()
    method.setup_client(ctx)
    _, grads = engine_grads(method, ctx, x, y)
    _, plain = engine_grads(get_method("fedavg")(), ctx, x, y)
    for n in grads:
        torch.testing.assert_close(grads[n], plain[n] - torch.tensor(c_k[n]) + torch.tensor(c[n]))


def test_c_is_the_rounds_shared_copy_and_c_k_goes_over_in_one_buffer():
    """The server's c is read from the round's one device copy (``ctx.server_tensors``); the client's own c_k
    goes over in one copy, not one a parameter; both keep the arrays' bits."""
    model = tiny_model()
    c, c_k = variates(model, 0), variates(model, 1)
    ctx = make_ctx(model, state={"c": c_k}, server={"c": c})
    server_c = parameter_tensors(ctx, ctx.server_tensors["c"])
    own = parameter_tensors(ctx, ctx.state["c"])
    assert all(server_c[n] is ctx.server_tensors["c"][n] for n in c)
    assert len({t.untyped_storage().data_ptr() for t in own.values()}) == 1
    for tensors, arrays in ((server_c, c), (own, c_k)):
        assert {n: t.numpy().tobytes() for n, t in tensors.items()} == {n: a.tobytes() for n, a in arrays.items()}


def test_zero_variates_give_the_fedavg_step_exactly():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    method = scaffold()
    method.setup_client(ctx)
    _, grads = engine_grads(method, ctx, x, y)
    _, plain = engine_grads(get_method("fedavg")(), ctx, x, y)
    assert all(torch.equal(grads[n], plain[n]) for n in plain)


def test_local_variate_after_k_sgd_steps():
    """Two plain SGD steps at lr 0.1, c = c_k = 0: c_k⁺ = (θ_g − θ_k)/(2·0.1), the mean corrected gradient."""
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model, lr=0.1)
    method = scaffold()
    method.setup_client(ctx)
    for _ in range(2):
        _, grads = engine_grads(method, ctx, x, y)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.sub_(0.1 * grads[n])
        ctx.steps += 1
    result = method.client_result(ctx)
    for n, p in model.named_parameters():
        expected = (ctx.global_state[n] - p.detach()) / 0.2
        np.testing.assert_allclose(result.state["c"][n], expected.numpy(), rtol=1e-5, atol=1e-7)
    assert result.weight == 1.0


def test_local_variate_under_momentum_is_the_mean_gradient():
    """50 momentum-SGD steps (ρ = 0.9) with a constant gradient g move θ by lr·K_eff·g, K_eff ≈ 410.5: c_k⁺
    must be g, not the ~8× larger (θ_g − θ_k)/(50·lr) the plain-SGD divisor gives."""
    model = tiny_model()
    ctx = make_ctx(model, lr=0.01)
    method = scaffold()
    method.setup_client(ctx)
    g = variates(model, 2)
    ctx.steps, ctx.momentum = 50, 0.9
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.sub_(0.01 * effective_steps(50, 0.9) * torch.tensor(g[n]))
    result = method.client_result(ctx)
    for n in g:
        np.testing.assert_allclose(result.state["c"][n], g[n], rtol=1e-3, atol=1e-4)


def test_server_step_and_global_variate():
    """θ_g = 1, mean_S θ_k = 3, η_g = 0.5 → θ = 2; c = mean over N = 4 of stored c_k = (2 + 6)/4."""
    global_state = {"w": np.ones(3, np.float32), "n": np.array(4, np.int64)}
    mean = {"w": np.full(3, 3.0, np.float32), "n": np.array(6, np.int64)}
    store = {2: {"c": {"w": np.full(3, 6.0, np.float32)}}, 0: {"c": {"w": np.full(3, 2.0, np.float32)}}}
    round_states = {0: store[0]}
    ctx = ServerContext(1, global_state, Aggregate(mean, 2.0, round_states, {}), {"kept": 1}, store, num_clients=4)
    new = pure_aggregate(scaffold(0.5), ctx)
    np.testing.assert_array_equal(new.global_state["w"], [2.0, 2.0, 2.0])
    assert new.global_state["n"] == 6 and new.global_state["w"].dtype == np.float32
    np.testing.assert_array_equal(new.server_state["c"]["w"], [2.0, 2.0, 2.0])
    assert new.server_state["kept"] == 1 and new.client_states == round_states


def test_server_lr_one_is_the_plain_mean_bit_for_bit():
    rng = np.random.default_rng(0)
    global_state = {"w": rng.standard_normal(50).astype(np.float32)}
    mean = {"w": rng.standard_normal(50).astype(np.float32)}
    ctx = ServerContext(1, global_state, Aggregate(mean, 2.0, {}, {}), {}, {}, num_clients=4)
    assert pure_aggregate(scaffold(1.0), ctx).global_state["w"].tobytes() == mean["w"].tobytes()


def test_global_variate_does_not_depend_on_store_order():
    """c = (1/N)·Σ_k c_k is summed in client-id order (float64), so the order in which workers returned the
    clients cannot change its bits, even for values spanning eight orders of magnitude."""
    rng = np.random.default_rng(0)
    store = {cid: {"c": {"w": (rng.standard_normal(200) * 10.0 ** rng.uniform(-6, 2, 200)).astype(np.float32)}}
             for cid in range(7)}
    state = {"w": np.zeros(200, np.float32)}

    def variate(ordered: dict) -> bytes:
        ctx = ServerContext(1, state, Aggregate(state, 1.0, {}, {}), {}, ordered, num_clients=10)
        return pure_aggregate(scaffold(), ctx).server_state["c"]["w"].tobytes()

    assert variate(store) == variate(dict(reversed(list(store.items()))))


@needs_fmnist
def test_fedsol_table_optimiser_no_longer_diverges(ray_session):
    """The FedSOL Table 2 optimiser (``Lee-Gihun/FedSOL:configs/baselines/scaffold.json``: lr 0.01, momentum
    0.9, wd 1e-5, lr × 0.99 per round, B = 50, E = 5, LDA α = 0.1) on a small FMNIST federation. Dividing by
    K instead of K_eff made c ~8× too large: this run's train loss went 0.62, 0.83, 2.6, 691, 1e18, NaN
    (diverged in round 6); with K_eff it stays below 0.62 and finite."""
    fed = build_federation(build_config(overrides=[
        "method.name=scaffold", "data.dataset=fmnist", "data.subsample=0.05", "model.name=mlp",
        "partition.kind=dirichlet", "partition.alpha=0.1", "federation.clients=10", "federation.fraction=0.5",
        "federation.rounds=5", "training.local_epochs=5", "training.batch_size=50", "training.lr=0.01",
        "training.momentum=0.9", "training.weight_decay=1e-5", "training.lr_decay=0.99",
        "metrics.protocols=[global]", "tracking.enabled=false", "resources.workers=1",
    ]))
    try:
        fed.run()
    finally:
        fed.close()
    losses = [row["train_loss"] for row in fed.history]
    assert fed.status == "finished", losses
    assert max(losses) < 1.0 and losses[-1] < losses[0], losses
