"""kNN-Per (Marfoq et al., ICML 2022; docs/methods.md §2) as the FedSOL authors' code runs it (their Table 9
baseline, ``Lee-Gihun/FedSOL:algorithms/knnper/``): FedAvg training, then each client's model mixed with a
k-nearest-neighbour classifier over its own training features when it is scored.

Training is FedAvg's; what is kNN-Per's own is the personalised evaluation (:meth:`KNNPer.personal_scorer`,
the code's ``evaluate_knn_model_on_loaders``): scores = weight·p_knn + (1 − weight)·f(x), p_knn the softmax
of −d/(D·scale) over the k nearest of up to ``capacity`` eval-mode training features (``knn_scores``).
docs/methods.md §2 (kNN-Per) writes it out, with why its ``loss_personalized`` is not comparable with other
methods' (compare on accuracy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fltune.methods import register
from fltune.methods.base import Params
from fltune.methods.fedavg import FedAvg
from fltune.models.base import SplitModel

CONFIG = "FedSOL's knnper.json"
"""Where the defaults come from: ``Lee-Gihun/FedSOL:configs/personalized/knnper.json``."""


class KNNPerParams(Params):
    """Defaults are the FedSOL authors' kNN-Per config (``configs/personalized/knnper.json``: capacity 500,
    dimension 512, weight 0.5, scale 1, k 5). Its ``dimension`` (the faiss index width) is not a parameter
    here: it is the model's feature width, read from the features themselves."""

    capacity: int = Field(500, ge=1, description=f"datastore size: the first samples of one shuffled training "
                          f"epoch ({CONFIG}: 500)")
    k: int = Field(5, ge=1, description=f"neighbours per test sample, at most the datastore's size ({CONFIG}: 5)")
    weight: float = Field(0.5, ge=0, le=1, description=f"weight of the kNN scores against the logits ({CONFIG}: 0.5)")
    scale: float = Field(1.0, gt=0, description=f"similarity exp(−d/(D·scale)), D the feature width ({CONFIG}: 1)")


@register
class KNNPer(FedAvg):
    """kNN-Per: FedAvg's training; a client scores x by weight·p_knn(x) + (1 − weight)·f(x).

    Training, its cost declarations included, is FedAvg's (inherited); the datastore exists only while a
    client is scored (``capacity`` × D floats).
    """

    name = "knnper"
    Params = KNNPerParams

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """The kNN reads penultimate features (the code's ``get_features=True``): a SplitModel's ``features``."""
        return self.require_model(model, SplitModel, "penultimate features (a SplitModel's body)",
                                  "any fltune model (every one is a SplitModel)")

    def personal_scorer(
        self, model: nn.Module, train_batches: Callable[[], Iterator[tuple[Tensor, Tensor]]],
    ) -> nn.Module:
        """``model`` mixed with the kNN over one epoch of the client's training batches (:class:`KNNScorer`)."""
        split = cast(SplitModel, model)  # adapt_model refused any other model
        params = self.params
        features, targets = datastore(split, train_batches(), params.capacity)
        return KNNScorer(split, features, targets, params.k, params.weight, params.scale)


@torch.no_grad()
def datastore(model: SplitModel, batches: Iterator[tuple[Tensor, Tensor]], capacity: int) -> tuple[Tensor, Tensor]:
    """(features ``[n, D]``, targets ``[n]``) of the first ``capacity`` samples of ``batches``, ``model`` in eval.

    The code passes over the whole train loader and, when it holds more than ``capacity`` samples, keeps a
    ``random.sample`` of them (``DataStore.build``). An epoch's order here is already a uniform random
    permutation (one ``randperm`` per epoch, seeded by (seed, round, client id)), so its first ``capacity``
    samples are a uniform random subset of that size: the same distribution with no draw of its own, and
    the batches past it need not be computed. The features are those of the augmented images, as the code's
    train loader applies its training transform."""
    model.eval()
    features: list[Tensor] = []
    targets: list[Tensor] = []
    held = 0
    for x, y in batches:
        features.append(model.features(x))
        targets.append(y)
        held += len(y)
        if held >= capacity:
            break
    if not features:
        return torch.empty(0, 0), torch.empty(0, dtype=torch.long)
    return torch.cat(features)[:capacity], torch.cat(targets)[:capacity]


class KNNScorer(nn.Module):
    """weight·p_knn(x) + (1 − weight)·f(x) for one client (``_get_knn_logits`` and ``_evaluate_knn_model`` of
    ``Lee-Gihun/FedSOL:algorithms/knnper/ClientTrainer.py``); always in eval mode, without gradients.

    It holds the worker's model (no copy) and the client's datastore; the caller drops it after scoring the
    client, so nothing outlives that client. An empty datastore (a client with no training sample) gives
    p_knn = 0, so the scores are (1 − weight)·f(x) and the prediction is the model's.
    """

    def __init__(self, model: SplitModel, features: Tensor, targets: Tensor, k: int, weight: float,
                 scale: float) -> None:
        super().__init__()
        self.model = model
        self.stored, self.stored_targets = features, targets
        self.stored_norms = features.pow(2).sum(1)
        self.k, self.weight, self.scale = min(k, len(targets)), weight, scale
        # SplitModel.forward is head(features(x)): one body pass gives both, as the code's get_features=True
        self.one_pass = type(model).forward is SplitModel.forward
        self.train(False)

    def train(self, mode: bool = True) -> KNNScorer:
        """Eval mode whatever is asked: the code scores in ``model.eval()``, and a scorer never trains."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        features = self.model.features(x)
        logits = self.model.head(features) if self.one_pass else self.model(x)
        if self.k == 0:
            return (1 - self.weight) * logits
        knn = self.knn_scores(features, logits.shape[1])
        return self.weight * knn.to(logits.dtype) + (1 - self.weight) * logits

    def knn_scores(self, features: Tensor, num_classes: int) -> Tensor:
        """p_knn ``[B, num_classes]``: the k nearest entries by squared L2 distance, weighted by
        exp(−d/(D·scale)) and normalised over the k.

        Distances as faiss's IndexFlatL2 computes them for a batch of queries, ‖q‖² + ‖s‖² − 2⟨q, s⟩
        (clamped at 0). The normalised weights are a softmax of −d/(D·scale) over the k neighbours: equal to the
        code's exp(·)/Σ exp(·), but where every neighbour is far (d/(D·scale) above ~104) the code's float32
        exp underflows to 0 and its 0/0 makes the scores NaN; the softmax stays finite (≠ code only there).
        Class sums through one-hot masks, as the code's: no atomic scatter, so the same bits on every run."""
        distances = (features.pow(2).sum(1, keepdim=True) + self.stored_norms
                     - 2 * features @ self.stored.T).clamp_min(0)
        nearest, index = distances.topk(self.k, dim=1, largest=False)
        similarity = torch.softmax(-nearest / (features.shape[1] * self.scale), dim=1)
        masks = F.one_hot(self.stored_targets[index], num_classes).to(similarity.dtype)  # [B, k, C]
        return (similarity.unsqueeze(2) * masks).sum(1)
