"""kNN-Per as the FedSOL authors' code evaluates it (``Lee-Gihun/FedSOL:algorithms/knnper/ClientTrainer.py``,
docs/methods.md §2): scores = weight·p_knn + (1 − weight)·logits, p_knn(c) = Σ_{i∈kNN, y_i=c} s_i / Σ_i s_i,
s_i = exp(−d_i/(D·scale)), d_i squared L2 to the datastore's features. The reference below restates the code's
``_get_knn_logits`` in float64 numpy (exact squared differences, an argsort for the k nearest, class masks), apart
from the method's torch code."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.pool import WorkerPlan, WorkerPool
from fltune.engine.functional import batchable
from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Method
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model

KNNPer = get_method("knnper")
Batches = list[tuple[torch.Tensor, torch.Tensor]]


def knnper(**params: float) -> Method:
    return KNNPer(KNNPer.Params(**params))


def train_data(n_batches: int = 3, size: int = 6, seed: int = 10) -> Batches:
    """An epoch of ``n_batches`` batches of ``size`` tiny images (3 classes)."""
    return [tiny_batch(seed=seed + i, n=size) for i in range(n_batches)]


def epochs(data: Batches) -> tuple[Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]], list[int]]:
    """``train_batches`` as the engine passes it (each call an epoch), and a record of the batches drawn."""
    drawn: list[int] = []

    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, batch in enumerate(data):
            drawn.append(i)
            yield batch

    return epoch, drawn


def reference(model: nn.Module, data: Batches, x: torch.Tensor, capacity: int, k: int, weight: float,
              scale: float) -> np.ndarray:
    """The code's kNN-Per scores for ``x``: datastore = the first ``capacity`` training samples (a uniform random
    subset, the epoch being shuffled), then ``_get_knn_logits`` and ``_evaluate_knn_model``'s mix, in numpy."""
    model.eval()
    with torch.no_grad():
        store = np.concatenate([model.features(xb).double().numpy() for xb, _ in data])[:capacity]
        targets = np.concatenate([yb.numpy() for _, yb in data])[:capacity]
        features = model.features(x).double().numpy()
        logits = model(x).double().numpy()
    num_classes = logits.shape[1]
    distances = ((features[:, None, :] - store[None, :, :]) ** 2).sum(-1)  # IndexFlatL2: squared L2
    indices = np.argsort(distances, axis=1)[:, :k]
    distances = np.take_along_axis(distances, indices, axis=1)
    similarities = np.exp(-distances / (features.shape[-1] * scale))
    neighbors_targets = targets[indices]
    masks = np.zeros((num_classes,) + similarities.shape)
    for class_idx in range(num_classes):
        masks[class_idx] = neighbors_targets == class_idx
    knn_logits = ((similarities * masks).sum(axis=2) / similarities.sum(axis=1)).T
    return weight * knn_logits + (1 - weight) * logits


def scores(model: nn.Module, data: Batches, x: torch.Tensor, **params: float) -> torch.Tensor:
    epoch, _ = epochs(data)
    return knnper(**params).personal_scorer(model, epoch)(x)


SCALE = 1e-2
"""A scale at which exp(−d/(D·scale)) spreads over the tiny model's distances (D = 200, d ≈ 2–11): the code's
default 1 would make every similarity ≈ 1 and the test blind to the distances."""


def test_the_scores_are_the_codes_knn_mixed_with_the_logits() -> None:
    """Capacity below the 18 training samples (the first 10 kept), k = 3, weight 0.3."""
    model, data, (x, _) = tiny_model(), train_data(), tiny_batch(seed=99, n=7)
    expected = reference(model, data, x, capacity=10, k=3, weight=0.3, scale=SCALE)
    got = scores(model, data, x, capacity=10, k=3, weight=0.3, scale=SCALE)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-4, atol=1e-5)
    # the datastore matters: all 18 samples, or another k, give other scores than the first 10 with k = 3
    for capacity, k in ((18, 3), (10, 1)):
        other = reference(model, data, x, capacity=capacity, k=k, weight=0.3, scale=SCALE)
        assert np.abs(other - expected).max() > 1e-2, (capacity, k)


def test_weight_zero_is_the_model_and_weight_one_the_knn_distribution() -> None:
    model, data, (x, _) = tiny_model(), train_data(), tiny_batch(seed=99, n=7)
    assert torch.equal(scores(model, data, x, weight=0.0, k=4, scale=SCALE), model(x).detach())
    knn = scores(model, data, x, weight=1.0, k=4, capacity=12, scale=SCALE)
    np.testing.assert_allclose(knn.double().numpy(), reference(model, data, x, 12, 4, 1.0, SCALE),
                               rtol=1e-4, atol=1e-5)
    assert torch.allclose(knn.sum(1), torch.ones(7)) and (knn >= 0).all()
    assert (knn.max(1).values < 1).any()  # some sample's neighbours disagree: not one-hot everywhere


def test_k_is_capped_by_the_datastore_and_the_code_defaults() -> None:
    """k = 5 (the code's) over a datastore of 4 uses all 4, as the code's faiss search does (it pads with index
    −1 at the largest float distance, whose similarity is 0)."""
    model, data, (x, _) = tiny_model(), train_data(n_batches=1, size=4), tiny_batch(seed=99, n=5)
    got = scores(model, data, x, scale=SCALE)
    np.testing.assert_allclose(got.double().numpy(), reference(model, data, x, 500, 4, 0.5, SCALE),
                               rtol=1e-4, atol=1e-5)
    assert KNNPer.Params().model_dump() == {"capacity": 500, "k": 5, "weight": 0.5, "scale": 1.0}


def test_one_epoch_is_drawn_and_only_up_to_capacity() -> None:
    """The datastore is one call of ``train_batches``, stopped once ``capacity`` samples are in: batches past
    it are never computed (nor, in the engine, augmented)."""
    model, data = tiny_model(), train_data(n_batches=4, size=6)
    epoch, drawn = epochs(data)
    calls: list[int] = []

    def train_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        calls.append(1)
        return epoch()

    knnper(capacity=8).personal_scorer(model, train_batches)
    assert calls == [1] and drawn == [0, 1]


def test_the_scorer_stays_in_eval_mode_and_keeps_no_graph() -> None:
    """The code evaluates under ``model.eval()`` and ``no_grad``; the engine's ``score_sums`` calls ``eval()`` too,
    but a ``train()`` must not switch the model back."""
    model, data, (x, _) = tiny_model(), train_data(), tiny_batch(seed=99, n=7)
    model.train()
    scorer = knnper().personal_scorer(model, epochs(data)[0])
    scorer.train()
    assert not scorer.training and not model.training
    out = scorer(x)
    assert not out.requires_grad and out.dtype == model(x).dtype and out.device == x.device


def test_a_far_datastore_gives_finite_scores_where_the_codes_exp_underflows() -> None:
    """d/(D·scale) ≫ 104: every float32 exp(−·) is 0 and the code's 0/0 is NaN; the softmax over the k gives the
    limit, all weight on the nearest neighbour."""
    model, data, (x, _) = tiny_model(), train_data(), tiny_batch(seed=99, n=7)
    knn = scores(model, data, x, weight=1.0, k=3, scale=1e-9)
    assert torch.isfinite(knn).all()
    store = torch.cat([model.features(xb) for xb, _ in data]).detach()
    nearest = torch.cdist(model.features(x).detach(), store).argmin(1)
    assert torch.equal(knn.argmax(1), torch.cat([yb for _, yb in data])[nearest])
    assert torch.allclose(knn.max(1).values, torch.ones(7))


def test_an_empty_datastore_leaves_the_models_prediction() -> None:
    model, (x, _) = tiny_model(), tiny_batch(seed=99, n=7)
    out = scores(model, [], x, weight=0.25)
    assert torch.equal(out, 0.75 * model(x).detach())


def test_training_is_fedavgs() -> None:
    """Same loss, same cost declarations, same batched-executor eligibility as FedAvg."""
    model, (x, y) = tiny_model(), tiny_batch()
    ctx = make_ctx(model)
    fedavg = get_method("fedavg")()
    assert torch.equal(loss_of(knnper(), ctx, x, y)[0], loss_of(fedavg, ctx, x, y)[0])
    method = knnper()
    assert (method.stored_models, method.passes_per_step) == (fedavg.stored_models, fedavg.passes_per_step)
    assert batchable(KNNPer) == batchable(get_method("fedavg"))


def test_a_model_without_features_is_refused_in_one_line() -> None:
    with pytest.raises(FLTuneError, match=r"^model\.name: knnper needs penultimate features .*got a Sequential"):
        knnper().adapt_model(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)))
    model = tiny_model()
    assert knnper().adapt_model(model) is model


@pytest.mark.parametrize("bad", [{"weight": 1.5}, {"weight": -0.1}, {"scale": 0.0}, {"k": 0}, {"capacity": 0}])
def test_bad_parameters_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        KNNPer.Params(**bad)


TINY = [  # tests/engine/test_executor_exact.py's tiny synthetic run, personalised protocol only
    "data.dataset=synthetic", "data.subsample=0.03", "data.augment=crop_flip_cutout",
    "partition.kind=dirichlet_prior", "partition.alpha=0.5", "partition.eval_fraction=0.2",
    "federation.clients=4", "federation.fraction=0.5", "federation.rounds=2", "training.local_epochs=1",
    "training.batch_size=12", "training.lr=0.05", "tracking.enabled=false", "metrics.protocols=[personalized]",
]


def test_through_the_engine_knnper_trains_as_fedavg_and_scores_otherwise(ray_session) -> None:
    """The personalised protocol on the workers: kNN-Per's training is FedAvg's bit for bit (same global state
    and training loss), its ``acc_personalized``/``loss_personalized`` come from the kNN mix (≠ FedAvg's),
    and with weight 0 they are FedAvg's exactly."""
    pool = WorkerPool(WorkerPlan(workers=1, cpus=1.0, gpus=0.0, in_driver=True))
    runs = {}
    try:
        for name, extra in (("fedavg", []), ("knnper", []), ("knnper0", ["method.weight=0"])):
            cfg = build_config(overrides=[*TINY, f"method.name={name.rstrip('0')}", *extra])
            fed = build_federation(cfg, pool=pool)
            try:
                fed.run()
            finally:
                fed.close()
            runs[name] = fed
    finally:
        pool.shutdown()
    fedavg, knn, knn0 = runs["fedavg"], runs["knnper"], runs["knnper0"]
    for other in (knn, knn0):
        assert all(np.array_equal(fedavg.global_state[k], other.global_state[k]) for k in fedavg.global_state)
        assert [r["train_loss"] for r in other.history] == [r["train_loss"] for r in fedavg.history]
    keys = ("acc_personalized", "loss_personalized")
    assert [[r[k] for k in keys] for r in knn0.history] == [[r[k] for k in keys] for r in fedavg.history]
    for key in keys:  # measured: acc 1/6 and 1/12 against FedAvg's 1/9 and 1/9 (4 tiny clients, near chance)
        assert [r[key] for r in knn.history] != [r[key] for r in fedavg.history], key
    assert all(0 <= r["acc_personalized"] <= 1 for r in knn.history)
