"""FedAvg's server step (the default ``Method.aggregate``): w ← Σ_k n_k w_k / Σ_k n_k for every uploaded key."""

import numpy as np

from fltune.engine.aggregate import WeightedSum
from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from tests.methods.helpers import pure_aggregate


def test_server_is_the_sample_weighted_mean_and_keeps_what_was_not_uploaded():
    """n = (1, 3), w = (2, 6): (1·2 + 3·6)/4 = 5; the counter (1·3 + 3·4)/4 = 3.75 rounds to 4; the head
    nobody uploaded keeps its old value; server and client states come back as they were."""
    total = WeightedSum()
    total.add(1.0, {"body.w": np.full(2, 2.0, np.float32), "body.n": np.array(3, np.int64)})
    total.add(3.0, {"body.w": np.full(2, 6.0, np.float32), "body.n": np.array(4, np.int64)})
    global_state = {"body.w": np.zeros(2, np.float32), "body.n": np.array(0, np.int64), "head.w": np.ones(1)}
    states = {4: {"personal": {"head.w": np.zeros(1)}}, 7: {}}
    server_state = {"unused": np.ones(1)}
    aggregate = Aggregate(total.mean(), total.total_weight, states, {})
    ctx = ServerContext(2, global_state, aggregate, server_state, states, num_clients=10)

    new = pure_aggregate(get_method("fedavg")(), ctx)

    np.testing.assert_array_equal(new.global_state["body.w"], [5.0, 5.0])
    assert new.global_state["body.w"].dtype == np.float32
    assert new.global_state["body.n"] == 4 and new.global_state["body.n"].dtype == np.int64
    np.testing.assert_array_equal(new.global_state["head.w"], [1.0])
    assert new.server_state is server_state and new.client_states is states
