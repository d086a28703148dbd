"""FedPAC as FedCR's code runs it (``haozzh/FedCR``: ``models/distributed_training_utils_PAC.py``
``train_cnn``, ``local_feature``, ``global_feature_centroids``; ``main_fed_PAC.py``): CE + λ·‖F − C_y‖_F / B
in the body epochs, per-sample halving class summaries, and one scalar centroid per class."""

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ClientContext, Method, Phase, ServerContext
from fltune.methods.fedpac_fedcr import centroids, class_summaries, update_summaries
from fltune.models import SplitModel, build_model
from tests.engine.helpers import OpCount
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch, tiny_model

FedPACFedCR = get_method("fedpac_fedcr")

# class 0: features (1, 0), then (3, 0) in the next batch; class 1: (0, 2)
HAND_BATCHES = [
    (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])),
    (torch.tensor([[3.0, 0.0]]), torch.tensor([0])),
]


def identity_model() -> SplitModel:
    """f(x) = x for 2-d inputs, so features can be written down by hand."""
    torch.manual_seed(0)
    return SplitModel(nn.Flatten(), nn.Linear(2, 2), feature_dim=2)


def with_centroids() -> tuple[SplitModel, ClientContext, Method]:
    """The identity model's client set up with λ = 0.5 and centroids (1, 1) and (0.5, 0.5)."""
    model = identity_model()
    server = {"centroids": np.array([[1.0, 1.0], [0.5, 0.5]], np.float32)}
    ctx = make_ctx(model, server=server, batches=HAND_BATCHES)
    method = FedPACFedCR(FedPACFedCR.Params(lam=0.5))
    method.setup_client(ctx)
    return model, ctx, method


def test_loss_is_ce_plus_lambda_frobenius_norm_over_the_batch_size():
    """``loss = loss_f_i + beta_PAC · torch.norm(fecture_output − C[labels]) / len(labels)``."""
    model, ctx, method = with_centroids()
    x, y = HAND_BATCHES[0]

    loss, logits = loss_of(method, ctx, x, y)

    residual = x - torch.tensor([[1.0, 1.0], [0.5, 0.5]])  # rows (0, −1) and (−0.5, 1.5): ‖·‖_F² = 3.5
    expected = F.cross_entropy(model(x), y) + 0.5 * residual.pow(2).sum().sqrt() / 2
    assert torch.allclose(loss, expected)
    assert torch.allclose(residual.pow(2).sum(), torch.tensor(3.5))
    assert torch.allclose(logits, model(x))


def test_the_loss_of_a_padded_batch_is_the_loss_of_its_real_samples():
    """A batch padded (clients trained together): the same CE + λ·‖F − C_y‖_F / B, the batch padded with a
    zero row of weight 0 that neither the cross-entropy nor R may see (R over the real rows: B = 2, not 3)."""
    model, ctx, method = with_centroids()
    x, y = HAND_BATCHES[0]
    padded_x, padded_y = torch.cat([x, torch.zeros(1, 2)]), torch.cat([y, torch.zeros(1, dtype=torch.long)])

    loss, logits = method.local_loss(replace(method.batch(ctx, padded_x, padded_y), mask=torch.tensor([1.0, 1.0, 0.0])))

    assert torch.allclose(loss, loss_of(method, ctx, x, y)[0])
    assert torch.allclose(logits[:2], model(x))


def test_the_loss_on_a_vib_net_reads_its_features_at_any_parameters():
    """On a VIB net the features are z (in training the mean of S sampled z), not the body's (μ, σ) output:
    the loss takes them through ``features_of`` (it once fed the head the body's 2·dimZ outputs, and a
    batched round crashed), on the module itself and at parameters passed in (``functional_call``, as a
    batched step runs it) alike. With torch's RNG at the same state both draw the same ε."""
    torch.manual_seed(0)
    model = build_model("vib_mlp", (1, 4, 4), 3, dim_z=2, samples=3)
    model.train()
    server = {"centroids": np.array([[1.0, 1.0], [0.5, 0.5], [0.0, 1.0]], np.float32)}
    x, y = tiny_batch()
    ctx = make_ctx(model, server=server, batches=[(x, y)])
    method = FedPACFedCR(FedPACFedCR.Params(lam=0.5))
    method.setup_client(ctx)

    torch.manual_seed(1)
    exact, exact_logits = loss_of(method, ctx, x, y)
    torch.manual_seed(1)
    batch = method.batch(ctx, x, y)
    loss, logits = method.local_loss(replace(batch, weights=dict(batch.weights)))  # not the module's own dict

    assert torch.allclose(loss, exact) and torch.allclose(logits, exact_logits)


def test_centroids_start_at_zero():
    """Round 1: the server has no centroids yet and the code's are zeros, so R = ‖F‖_F / B."""
    model = identity_model()
    ctx = make_ctx(model, batches=HAND_BATCHES)
    method = FedPACFedCR()
    method.setup_client(ctx)
    x, y = HAND_BATCHES[0]
    expected = F.cross_entropy(model(x), y) + x.pow(2).sum().sqrt() / 2
    assert torch.allclose(loss_of(method, ctx, x, y)[0], expected)


def test_head_epochs_then_body_epochs_at_the_rounds_lr():
    """``head_eps = local_eps − local_rep_ep`` head epochs, then ``local_rep_ep`` body epochs, one lr."""
    ctx = make_ctx(tiny_model(), epochs=10)
    assert FedPACFedCR().phases(ctx) == [Phase(9, ("head.",)), Phase(1, ("body.",))]


def test_summaries_halve_towards_each_new_sample_and_persist():
    """``local_feature``: an all-zero summary takes the sample; otherwise (f + s)/2, in sample order."""
    summaries = np.zeros((2, 2), np.float32)
    for x, y in HAND_BATCHES:
        update_summaries(summaries, x.numpy(), y.tolist())
    # class 0: (1, 0), then ((3, 0) + (1, 0))/2 = (2, 0); class 1: (0, 2)
    assert np.array_equal(summaries, [[2.0, 0.0], [0.0, 2.0]])
    update_summaries(summaries, np.array([[0.0, 4.0]], np.float32), [0])  # a later round goes on
    assert np.array_equal(summaries[0], [1.0, 2.0])


def test_client_keeps_and_uploads_its_summaries_after_training():
    model = identity_model()
    start = np.array([[4.0, 0.0], [0.0, 0.0]], np.float32)  # class 0 summarised in an earlier round
    ctx = make_ctx(model, state={"summaries": start}, batches=HAND_BATCHES)
    method = FedPACFedCR()
    method.setup_client(ctx)
    result = method.client_result(ctx)
    # class 0: ((1, 0) + (4, 0))/2 = (2.5, 0), then ((3, 0) + (2.5, 0))/2 = (2.75, 0); class 1: (0, 2)
    expected = np.array([[2.75, 0.0], [0.0, 2.0]], np.float32)
    assert np.array_equal(result.state["summaries"], expected)
    assert np.array_equal(result.upload["summaries"], expected)
    assert set(result.update) == {k for k in model.state_dict() if k.startswith("body.")}


def test_server_centroid_is_one_number_per_class_the_mean_of_all_entries():
    """``torch.mean`` of the concatenated non-empty summaries fills the class's d-vector; a class no
    client of the round has keeps its previous centroid."""
    previous = np.array([[9.0, 9.0], [7.0, 7.0], [5.0, 5.0]], np.float32)
    a = np.array([[1.0, 3.0], [0.0, 0.0], [0.0, 0.0]], np.float32)
    b = np.array([[2.0, 6.0], [0.0, 4.0], [0.0, 0.0]], np.float32)
    out = centroids(previous, [a, b])
    assert np.allclose(out, [[3.0, 3.0], [2.0, 2.0], [5.0, 5.0]])  # (1+3+2+6)/4; (0+4)/2 from b alone


def test_aggregate_averages_bodies_and_sends_new_centroids():
    method = FedPACFedCR()
    body = {"body.w": np.zeros(2, np.float32)}
    summaries = {0: np.array([[1.0, 3.0]], np.float32), 1: np.array([[0.0, 0.0]], np.float32)}
    aggregate = Aggregate(
        mean={"body.w": np.ones(2, np.float32)}, total_weight=2.0, client_states={0: {}, 1: {}},
        client_metrics={0: {}, 1: {}}, uploads={c: {"summaries": s} for c, s in summaries.items()},
    )
    ctx = ServerContext(round=1, global_state=body, aggregate=aggregate, server_state={}, client_store={},
                        num_clients=2)
    update = pure_aggregate(method, ctx)
    assert np.array_equal(update.global_state["body.w"], np.ones(2, np.float32))
    assert np.allclose(update.server_state["centroids"], [[2.0, 2.0]])
    assert method.server_payload(update.server_state)["centroids"] is update.server_state["centroids"]


def fedcr_local_feature(summaries: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """FedCR's ``local_feature`` literally, in torch on the features' device: the reference the host fold
    must equal bit for bit."""
    summaries = summaries.clone()
    for features, labels in batches:
        for feature, label in zip(features, labels.tolist()):
            current = summaries[label]
            summaries[label] = (feature + current) / 2 if current.any() else feature
    return summaries


def test_class_summaries_fold_on_the_host_to_fedcrs_bits_with_device_work_independent_of_the_samples():
    """``class_summaries`` folds the pass on the host: the bits of FedCR's per-sample loop in torch (random
    batches, repeated labels, a class absent from a batch, an all-zero feature whose summary stays empty,
    a summary carried over from an earlier round), and past the model's forward passes the same few ops
    (the features' and labels' concatenation) whether the pass has 4 samples or 40; folding with tensors
    cost a few ops per sample (~1,800 per client at paper scale, each a kernel launch on a GPU)."""
    generator = torch.Generator().manual_seed(0)
    start = np.zeros((4, 6), np.float32)
    start[3] = torch.rand(6, generator=generator).numpy()  # summarised in an earlier round
    kept = start.copy()
    beyond_forward = []
    for sizes in ((3, 1), (12, 12, 7, 9)):
        batches = []
        for n in sizes:
            features = torch.relu(torch.randn(n, 6, generator=generator))
            features[0] = 0.0
            batches.append((features, torch.randint(0, 3, (n,), generator=generator)))
        model = SplitModel(nn.Flatten(), nn.Linear(6, 4), feature_dim=6)
        ctx = make_ctx(model, batches=batches)
        with OpCount() as forward:
            _ = [model.features(x) for x, _ in batches]
        with OpCount() as ops:
            summaries = class_summaries(ctx, start)
        beyond_forward.append(ops.count - forward.count)
        assert np.array_equal(summaries, fedcr_local_feature(torch.from_numpy(start), batches).numpy())
        assert summaries.dtype == np.float32 and np.array_equal(start, kept)  # the start is not folded into
    assert beyond_forward[0] == beyond_forward[1] <= 4
