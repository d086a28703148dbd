"""FedPAC: CE + λ·MSE(f(x), c_y) on the body; count-weighted prototypes; per-client head combination
α_i = argmin_{α ∈ simplex} αᵀ(diag(v) + D_i)α."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Aggregate, Phase, ServerContext
from fltune.methods.fedpac import class_features, head_weights, simplex_qp
from fltune.models import SplitModel, build_model
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch, tiny_model

FedPAC = get_method("fedpac")


def identity_model() -> SplitModel:
    """f(x) = x for 2-d inputs, so class statistics can be written down by hand."""
    torch.manual_seed(0)
    return SplitModel(nn.Flatten(), nn.Linear(2, 2), feature_dim=2)


# class 0: features (1, 0) and (3, 0); class 1: (0, 2)
HAND_BATCHES = [
    (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])),
    (torch.tensor([[3.0, 0.0]]), torch.tensor([0])),
]


@pytest.mark.parametrize(
    ("p_matrix", "expected"),
    [
        (np.diag([1.0, 2.0, 4.0]), [4 / 7, 2 / 7, 1 / 7]),  # diag(v): α ∝ 1/v
        (np.array([[2.0, 1.0], [1.0, 3.0]]), [2 / 3, 1 / 3]),  # t* = (b − c)/(a + b − 2c) = 2/3
        (np.array([[1.0, 2.0], [2.0, 5.0]]), [1.0, 0.0]),  # unconstrained t* = 3/2: the vertex
        (np.zeros((2, 2)), [0.5, 0.5]),
    ],
)
def test_simplex_qp_hand_cases(p_matrix, expected):
    assert np.allclose(simplex_qp(p_matrix), expected, atol=1e-6)


def test_class_statistics_by_hand():
    """counts (2, 1), n = 3, p = (2/3, 1/3), means (2, 0) and (0, 2), E‖f‖² = 5 and 4:
    v = (2/3·5 + 1/3·4 − 4/9·4 − 1/9·4)/3 = 22/27; h = (2/3·(2, 0), 1/3·(0, 2))."""
    ctx = make_ctx(identity_model(), batches=HAND_BATCHES)

    stats = class_features(ctx, num_classes=3)

    assert stats.counts.tolist() == [2, 1, 0]
    assert stats.variance_term() == pytest.approx(22 / 27)
    assert np.allclose(stats.weighted_means().numpy(), [[4 / 3, 0], [0, 2 / 3], [0, 0]])


def test_loss_is_ce_plus_lambda_mse_to_global_or_own_prototypes():
    model = identity_model()
    server = {"protos": np.array([[1.0, 1.0], [0.0, 0.0]], np.float32), "has_proto": np.array([True, False])}
    ctx = make_ctx(model, server=server, batches=HAND_BATCHES)
    method = FedPAC(FedPAC.Params(lam=0.5))
    method.setup_client(ctx)
    x, y = HAND_BATCHES[0]

    loss, logits = loss_of(method, ctx, x, y)

    # sample 0 (class 0) → global prototype (1, 1); sample 1 (class 1, no global one) → own mean (0, 2).
    targets = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    expected = F.cross_entropy(model(x), y) + 0.5 * ((x - targets) ** 2).mean()
    assert torch.allclose(loss, expected)
    assert torch.allclose(logits, model(x))


def test_no_prototypes_yet_or_lambda_zero_is_plain_ce():
    model = tiny_model()
    x, y = tiny_batch()
    protos = {"protos": np.ones((3, 200), np.float32), "has_proto": np.ones(3, bool)}
    for method, server in [(FedPAC(), {}), (FedPAC(FedPAC.Params(lam=0.0)), protos)]:
        ctx = make_ctx(model, server=server)
        method.setup_client(ctx)
        assert torch.equal(loss_of(method, ctx, x, y)[0], F.cross_entropy(model(x), y))


def test_one_head_epoch_at_lr_0_1_then_the_body():
    ctx = make_ctx(tiny_model(), epochs=5)

    assert FedPAC().phases(ctx) == [Phase(1, ("head.",), lr=0.1), Phase(5, ("body.",))]


def test_client_uploads_pre_training_statistics_and_post_training_prototypes():
    model = identity_model()
    ctx = make_ctx(model, batches=HAND_BATCHES)
    method = FedPAC()
    method.setup_client(ctx)
    with torch.no_grad():
        model.head.weight.add_(1.0)  # "training" changes nothing the identity body computes

    result = method.client_result(ctx)

    up = result.upload
    assert up["v"] == pytest.approx(22 / 27)
    assert np.allclose(up["protos"], [[2, 0], [0, 2]]) and up["counts"].tolist() == [2, 1]
    assert set(result.update) == {k for k in model.state_dict() if k.startswith("body.")}


def test_server_averages_prototypes_by_counts_and_combines_heads():
    """Clients 0 and 1 with equal v and identical h: D_i = 0, α = (½, ½), so both get the mean head;
    prototypes: class 0 (1·[0, 0] + 3·[4, 4])/4 = [3, 3]; class 1 only client 0's; class 2 none."""
    protos = {0: np.array([[0.0, 0], [1, 1], [0, 0]]), 1: np.array([[4.0, 4], [0, 0], [0, 0]])}
    counts = {0: np.array([1.0, 2, 0]), 1: np.array([3.0, 0, 0])}
    stats = {
        cid: {"v": np.array(1.0), "h": np.ones((3, 2)), "protos": protos[cid], "counts": counts[cid]} for cid in (0, 1)
    }
    heads = {0: {"head.weight": np.zeros((3, 2), np.float32)}, 1: {"head.weight": np.full((3, 2), 2.0, np.float32)}}
    store = {cid: {"personal": heads[cid], "other": cid} for cid in (0, 1)}
    aggregate = Aggregate({"body.w": np.ones(1)}, 2.0, store, {}, stats)
    ctx = ServerContext(1, {"body.w": np.zeros(1)}, aggregate, {}, {**store, 3: {"personal": {}}}, 4)

    new = pure_aggregate(FedPAC(), ctx)

    assert np.allclose(new.server_state["protos"], [[3, 3], [1, 1], [0, 0]])
    assert new.server_state["has_proto"].tolist() == [True, True, False]
    np.testing.assert_array_equal(new.global_state["body.w"], [1.0])
    assert set(new.client_states) == {0, 1}  # the round's clients only
    for cid in (0, 1):
        assert np.allclose(new.client_states[cid]["personal"]["head.weight"], 1.0)
        assert new.client_states[cid]["personal"]["head.weight"].dtype == np.float32
        assert new.client_states[cid]["other"] == cid
    assert FedPAC().server_payload(new.server_state).keys() == {"protos", "has_proto"}


def test_head_weights_prefer_clients_with_similar_statistics_and_drop_tiny_weights():
    """Client 0's h equals client 1's and is far from client 2's: α_0 puts no weight on client 2."""
    h = np.stack([np.zeros((1, 2)), np.zeros((1, 2)), np.full((1, 2), 100.0)])

    alpha = head_weights(np.array([1.0, 1.0, 1.0]), h, 0)

    assert np.allclose(alpha, [0.5, 0.5, 0.0]) and alpha.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["fedpac", "fedpac_fedcr"])
def test_a_head_that_is_not_one_linear_layer_is_refused_in_one_line(name):
    torch.manual_seed(0)
    with pytest.raises(FLTuneError, match=f"model.name: {name} needs a model whose head is one linear layer"):
        get_method(name)().adapt_model(build_model("sl_vit", (3, 8, 8), 5))
    model = tiny_model()
    assert get_method(name)().adapt_model(model) is model
