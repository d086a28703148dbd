"""FedPer: CE locally; the head is personal, only the body is uploaded and averaged."""

import numpy as np
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.base import client_model
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model


def test_loss_is_cross_entropy():
    model = tiny_model()
    x, y = tiny_batch()

    loss, _ = loss_of(get_method("fedper")(), make_ctx(model), x, y)

    assert torch.equal(loss, F.cross_entropy(model(x), y))


def test_head_is_kept_and_body_uploaded_and_a_clients_head_overrides_the_global_one():
    model = tiny_model()
    method = get_method("fedper")()

    result = method.client_result(make_ctx(model))

    assert set(result.state["personal"]) == {"head.weight", "head.bias"}
    assert set(result.update) == {k for k in model.state_dict() if k.startswith("body.")}
    global_state = {k: np.zeros_like(v) for k, v in result.update.items()} | {
        k: np.zeros_like(v) for k, v in result.state["personal"].items()
    }
    mine = client_model(global_state, result.state)
    assert np.array_equal(mine["head.weight"], result.state["personal"]["head.weight"])
    assert not mine["body.fc1.linear.weight"].any()
    assert client_model(global_state, {}) == global_state  # never sampled: the global head
