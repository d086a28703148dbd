"""The drift bases' server mean over all N clients (``_drift.py``): ``server_mean=exact`` re-sums the store,
``running`` keeps the float64 sum in ``server_state`` and adds the round's changes (SCAFFOLD Alg. 1 line 17)."""

import numpy as np
import pytest
import torch

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods._drift import _hint
from fltune.methods.base import Aggregate, ServerContext
from tests.engine.test_executor_exact import _one_thread, run_in_process, tiny_config, tiny_data  # noqa: F401
from tests.methods.helpers import make_ctx, pure_aggregate, tiny_model


def running(name: str):
    cls = get_method(name)
    return cls(cls.Params(server_mean="running"))


def test_running_c_adds_the_rounds_changes_to_the_kept_sum():
    """N = 4, Σ c_k = 8 kept; client 0 goes 2 → 5, client 3 (never sampled) 0 → 1: Σ = 12, c = 3."""
    state = {"w": np.zeros(2, np.float32)}
    news = {0: {"c": {"w": np.full(2, 5.0, np.float32)}}, 3: {"c": {"w": np.full(2, 1.0, np.float32)}}}
    uploads = {0: {"c:w": np.full(2, 2.0, np.float32)}, 3: {}}
    kept = {"c_sum": {"w": np.full(2, 8.0)}}
    ctx = ServerContext(2, state, Aggregate(state, 2.0, news, {}, uploads), kept, news, num_clients=4)
    out = pure_aggregate(running("scaffold"), ctx)
    np.testing.assert_array_equal(out.server_state["c"]["w"], [3.0, 3.0])
    assert out.server_state["c"]["w"].dtype == np.float32
    np.testing.assert_array_equal(out.server_state["c_sum"]["w"], [12.0, 12.0])


def test_only_running_uploads_the_state_before_the_round():
    """The client ships its old h_k for the running sum only; the default path's upload is unchanged."""
    model = tiny_model()
    old = {n: np.full(p.shape, 0.5, np.float32) for n, p in model.named_parameters()}
    cls = get_method("feddyn")
    for method, expected in ((cls(), set()), (running("feddyn"), {f"h:{n}" for n in old})):
        ctx = make_ctx(model, state={"h": old})
        method.setup_client(ctx)
        upload = method.client_result(ctx).upload
        assert set(upload) == expected
        assert all(np.array_equal(upload[f"h:{n}"], old[n]) for n in old if f"h:{n}" in upload)


def test_running_mean_tracks_the_exact_one():
    """FedDC (both sums: SCAFFOLD's c, FedDyn's h), MLP, three rounds, 4 clients, 2 a round (clients return,
    one is never sampled; c and h feed the next rounds):
    the running path's weights and client states match the exact path's to float32 rounding. A sum that
    forgot a returning client's old state would be off by that state."""
    exact, fast = (run_in_process(tiny_config("feddc", "model.name=mlp", "federation.rounds=3", *extra),
                                  tiny_data(), "exact", torch.device("cpu"))
                   for extra in ([], ["method.server_mean=running"]))
    assert len({cid for r in fast[2] for cid in r}) == 3 and sum(len(r) for r in fast[2]) == 6  # one returns
    for param, value in exact[0].items():
        np.testing.assert_allclose(fast[0][param], value, rtol=1e-5, atol=1e-7)
    for cid, state in exact[1].items():
        for key, arrays in state.items():
            for param, value in arrays.items():
                np.testing.assert_allclose(fast[1][cid][key][param], value, rtol=1e-5, atol=1e-6)


def test_server_mean_is_validated():
    with pytest.raises(FLTuneError, match="server_mean"):
        build_config(overrides=["method.name=scaffold", "method.server_mean=approx"])


def test_an_exact_mean_over_many_clients_hints_at_running_once(caplog):
    _hint.cache_clear()
    state = {"w": np.zeros(2, np.float32)}
    for clients in (999, 1000, 1000):
        ctx = ServerContext(1, state, Aggregate(state, 1.0, {}, {}), {}, {}, num_clients=clients)
        get_method("scaffold")().aggregate(ctx)
    assert [r.message for r in caplog.records] == [
        "scaffold at 1000+ clients: method.server_mean=running keeps the server's mean at O(clients a round) "
        "(opt-in: last bits may differ)"]
