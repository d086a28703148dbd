"""FedNova: d_k = (θ_g − θ_k)/a_k, θ = θ_g − (Σ p_k a_k)·Σ p_k d_k with momentum-corrected a_k (docs/methods.md §2)."""

import numpy as np
import pytest
import torch

from fltune.engine.aggregate import WeightedSum
from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from fltune.methods.fednova import NORMALISER
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_model


def test_client_uploads_normalised_update_and_a_k():
    model = tiny_model()
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.5)  # θ_g − θ_k = 0.5
    ctx = make_ctx(model, global_state=global_state)
    ctx.steps, ctx.momentum = 2, 0.5
    result = get_method("fednova")().client_result(ctx)
    assert float(result.update[NORMALISER]) == pytest.approx(2.5)
    for name, value in result.update.items():
        if name != NORMALISER:
            np.testing.assert_allclose(value, 0.2, rtol=1e-5)  # 0.5 / 2.5
    assert result.weight == ctx.num_samples


def server_round(uploads):
    """Sum (n_k, update) as the engine does, then aggregate from θ_g = 1."""
    total = WeightedSum()
    for weight, update in uploads:
        total.add(weight, update)
    global_state = {"w": np.ones(2, np.float32), "n": np.array(3, np.int64)}
    ctx = ServerContext(1, global_state, Aggregate(total.mean(), total.total_weight, {}, {}), {}, {}, 4)
    return pure_aggregate(get_method("fednova")(), ctx).global_state


def test_server_rescales_the_mean_normalised_update():
    """n = (1, 3), a = (2, 4), d = (1, 0.5): τ_eff = ¼·2 + ¾·4 = 3.5, Σ p d = ¼ + ⅜ = 0.625; θ = 1 − 2.1875."""
    new = server_round([
        (1.0, {"w": np.full(2, 1.0, np.float32), "n": np.array(1, np.int64), NORMALISER: np.array(2.0)}),
        (3.0, {"w": np.full(2, 0.5, np.float32), "n": np.array(5, np.int64), NORMALISER: np.array(4.0)}),
    ])
    np.testing.assert_allclose(new["w"], 1 - 3.5 * 0.625)
    assert set(new) == {"w", "n"} and new["n"] == 4 and new["w"].dtype == np.float32


def test_equal_step_counts_reduce_to_fedavg():
    """a_k = 3 for both: θ = θ_g − 3·Σ p (θ_g − θ_k)/3 = Σ p θ_k = ¼·(−2) + ¾·2 = 1."""
    theta = {1.0: -2.0, 3.0: 2.0}
    new = server_round([
        (n, {"w": np.full(2, (1.0 - t) / 3, np.float32), "n": np.array(3, np.int64), NORMALISER: np.array(3.0)})
        for n, t in theta.items()
    ])
    np.testing.assert_allclose(new["w"], 1.0, rtol=1e-6)
