"""Local-only (FedSOL Table 9's floor): CE on the client's own data; the whole model stays with the client."""

import numpy as np
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext, client_model
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch, tiny_model

LocalOnly = get_method("local_only")


def test_loss_is_cross_entropy():
    model = tiny_model()
    x, y = tiny_batch()

    loss, _ = loss_of(LocalOnly(), make_ctx(model), x, y)

    assert torch.equal(loss, F.cross_entropy(model(x), y))


def test_the_whole_model_is_kept_nothing_is_uploaded_and_the_server_model_never_moves():
    model = tiny_model()
    method = LocalOnly()
    result = method.client_result(make_ctx(model))

    assert set(result.state["personal"]) == set(model.state_dict()) and result.update == {}
    mine = {k: v + np.float32(1) for k, v in result.state["personal"].items()}
    initial = {k: np.zeros_like(v) for k, v in mine.items()}
    assert all(np.array_equal(client_model(initial, {"personal": mine})[k], mine[k]) for k in mine)
    assert client_model(initial, {}) == initial  # never trained: the initial model
    aggregate = Aggregate(mean={}, total_weight=1.0, client_states={0: result.state}, client_metrics={0: {}})
    update = pure_aggregate(method, ServerContext(round=1, global_state=initial, aggregate=aggregate, server_state={},
                                                  client_store={0: result.state}, num_clients=1))
    assert update.global_state == initial
