"""LG-FedAvg: the loss is CE; the last ``global_layers`` layers are uploaded and averaged, the lower ones stay on
each client (the authors' ``num_layers_keep``; FedCR's ``w_glob_keys``)."""

import pytest
import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.models.registry import build_model
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model


def lg(**params):
    method = get_method("lg_fedavg")
    return method(method.Params(**params))


def test_loss_is_cross_entropy():
    model = tiny_model()
    x, y = tiny_batch()
    loss, _ = loss_of(lg(), make_ctx(model), x, y)
    assert torch.equal(loss, F.cross_entropy(model(x), y))


@pytest.mark.parametrize("global_layers, shared", [
    (2, {"body.fc2.linear.weight", "body.fc2.linear.bias", "head.weight", "head.bias"}),  # the default
    (1, {"head.weight", "head.bias"}),  # the classifier alone
])
def test_the_last_layers_are_uploaded_and_the_rest_kept(global_layers: int, shared: set[str]):
    model = tiny_model()  # fc1 → fc2 → head
    result = lg(global_layers=global_layers).client_result(make_ctx(model))
    assert set(result.update) == shared
    assert set(result.state["personal"]) == set(model.state_dict()) - shared
    assert result.weight == 6.0  # n_k-weighted, as FedAvg


@pytest.mark.parametrize("model, in_shape, code_keys", [
    # FedCR's main_fed.py, method 'lg': w_glob_keys = weight_keys [3, 4] of FMNIST_CNN and the CIFAR LeNets
    # (conv1, conv2, fc1, fc2, fc3), [1, 2] of emnist_NN (fc1, fc2, fc3)
    ("fedcr_cnn", (1, 28, 28), ["body.fc2.linear", "head"]),
    ("fedcr_cnn", (3, 32, 32), ["body.fc2.linear", "head"]),
    ("fedcr_mlp", (1, 28, 28), ["body.fc2.linear", "head"]),
])
def test_by_default_the_layers_fedcrs_code_shares_are_shared(model: str, in_shape, code_keys: list[str]):
    net = build_model(model, in_shape, 10)
    personal = lg().personal_keys(lg().adapt_model(net))
    assert set(net.state_dict()) - personal == {f"{k}.{p}" for k in code_keys for p in ("weight", "bias")}


def test_sharing_every_layer_is_refused_in_one_line():
    with pytest.raises(FLTuneError, match=r"^method.global_layers: 3; allowed: 1 to 2 \(the model has 3 layers"):
        lg(global_layers=3).adapt_model(tiny_model())
