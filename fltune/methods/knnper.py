"""kNN-Per (Marfoq et al., ICML 2022; docs/methods.md §2) as the FedSOL authors' code runs it (their Table 9
baseline, ``Lee-Gihun/FedSOL:algorithms/knnper/``): FedAvg training, then each client's model mixed with a
k-nearest-neighbour classifier over its own training features when it is scored.

Its own part is the personalised evaluation (the code's ``evaluate_knn_model_on_loaders``). Its
``loss_personalized`` is not comparable with other methods' (compare on accuracy; docs/methods.md §2).
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
    """The FedSOL authors' config; its ``dimension`` (the faiss width) is read from the features instead."""

    capacity: int = Field(500, ge=1, description=f"datastore size: the first samples of one shuffled training "
                          f"epoch ({CONFIG}: 500)")
    k: int = Field(5, ge=1, description=f"neighbours per test sample, at most the datastore's size ({CONFIG}: 5)")
    weight: float = Field(0.5, ge=0, le=1, description=f"weight of the kNN scores against the logits ({CONFIG}: 0.5)")
    scale: float = Field(1.0, gt=0, description=f"similarity exp(−d/(D·scale)), D the feature width ({CONFIG}: 1)")


@register
class KNNPer(FedAvg):
    """kNN-Per: FedAvg's training (and costs); a client scores x by weight·p_knn(x) + (1 − weight)·f(x)."""

    name = "knnper"
    Params = KNNPerParams

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """The kNN reads penultimate features (the code's ``get_features=True``)."""
        return self.require_model(model, SplitModel, "penultimate features (a SplitModel's body)",
                                  "any fltune model (every one is a SplitModel)")

    def personal_scorer(
        self, model: nn.Module, train_batches: Callable[[], Iterator[tuple[Tensor, Tensor]]],
    ) -> nn.Module:
        split = cast(SplitModel, model)  # adapt_model refused any other model
        features, targets = datastore(split, train_batches(), self.params.capacity)
        return KNNScorer(split, features, targets, self.params)


@torch.no_grad()
def datastore(model: SplitModel, batches: Iterator[tuple[Tensor, Tensor]], capacity: int) -> tuple[Tensor, Tensor]:
    """(features ``[n, D]``, targets ``[n]``) of the first ``capacity`` samples of ``batches``, ``model`` in eval.
    The code keeps a ``random.sample`` of the whole loader (``DataStore.build``); an epoch here is already a seeded
    uniform permutation, so its head is the same distribution with no draw of its own. Features are of the augmented
    images, as the code's train loader gives them."""
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
    ``Lee-Gihun/FedSOL:algorithms/knnper/ClientTrainer.py``); always in eval mode, without gradients. Holds the worker's
    model (no copy): drop it after scoring the client. An empty datastore gives p_knn = 0."""

    def __init__(self, model: SplitModel, features: Tensor, targets: Tensor, params: KNNPerParams) -> None:
        super().__init__()
        self.model = model
        self.stored, self.stored_targets = features, targets
        self.stored_norms = features.pow(2).sum(1)
        self.k, self.weight, self.scale = min(params.k, len(targets)), params.weight, params.scale
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
        """p_knn ``[B, num_classes]``: the k nearest by squared L2 (faiss IndexFlatL2's ‖q‖² + ‖s‖² − 2⟨q, s⟩,
        clamped at 0), weighted by a softmax of −d/(D·scale): the code's exp(·)/Σ exp(·), except that where
        every neighbour is far its float32 exp underflows to 0/0 = NaN and the softmax stays finite. Class
        sums through one-hot masks, as the code's: no atomic scatter, so the same bits on every run."""
        distances = (features.pow(2).sum(1, keepdim=True) + self.stored_norms
                     - 2 * features @ self.stored.T).clamp_min(0)
        nearest, index = distances.topk(self.k, dim=1, largest=False)
        similarity = torch.softmax(-nearest / (features.shape[1] * self.scale), dim=1)
        masks = F.one_hot(self.stored_targets[index], num_classes).to(similarity.dtype)  # [B, k, C]
        return (similarity.unsqueeze(2) * masks).sum(1)
