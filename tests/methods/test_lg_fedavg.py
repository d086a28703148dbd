"""LG-FedAvg: the body is personal, only the head is uploaded and averaged (the mirror of FedPer)."""

from fltune.methods import get_method
from tests.methods.helpers import make_ctx, tiny_model


def test_body_is_kept_and_head_uploaded():
    model = tiny_model()

    result = get_method("lg_fedavg")().client_result(make_ctx(model))

    assert set(result.update) == {"head.weight", "head.bias"}
    assert set(result.state["personal"]) == {k for k in model.state_dict() if k.startswith("body.")}
    assert result.weight == 6.0  # n_k-weighted, as FedAvg
