"""The shared bases of the partially personalised methods: how a model's layers are counted."""

import pytest

from fltune.methods.lg_fedavg import weight_layers
from fltune.models.registry import build_model


@pytest.mark.parametrize("model, in_shape, layers", [
    ("fedcr_cnn", (1, 28, 28), ["body.conv1.conv", "body.conv2.conv", "body.fc1.linear", "body.fc2.linear", "head"]),
    ("fedcr_mlp", (1, 28, 28), ["body.fc1.linear", "body.fc2.linear", "head"]),  # FedCR's emnist_NN
])
def test_layers_are_the_authors_weight_keys_in_forward_order(model: str, in_shape, layers: list[str]):
    assert weight_layers(build_model(model, in_shape, 10)) == [{f"{k}.weight", f"{k}.bias"} for k in layers]


def test_a_norm_layer_counts_with_the_layer_before_it():
    net = build_model("resnet18", (3, 32, 32), 10)
    layers = weight_layers(net)
    assert len(layers) == 21  # the stem, 16 block convolutions, 3 shortcut convolutions, the classifier
    assert layers[-2] == {f"body.layer4.1.conv2.{k}" for k in (
        "conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked")}
    assert set().union(*layers) == set(net.state_dict())
