"""FedPAC as FedCR's code runs it (``haozzh/FedCR``: ``main_fed_PAC.py``,
``models/distributed_training_utils_PAC.py``): the code behind SimFAFL Table 2's FedPAC row; docs/methods.md §2.

It is not FedPAC's own algorithm (``fedpac``, from ``JianXu95/FedPAC``), and the table's numbers come from
this one. Shared body, personal head (as FedPer); per round, client i:

1. ``max(E − body_epochs, 1)`` epochs on the head alone (body frozen), then ``body_epochs`` on the body alone
   (head frozen), all at the round's lr: FedRep's schedule (the code's ``local_ep − local_rep_ep`` and
   ``local_rep_ep``);
2. the body epochs add λ·R to the cross-entropy, with R = ‖F − C_y‖_F / B, where F holds the batch's
   features f(x) (B × d) and C_y the server's centroid of each sample's class. R is a Frobenius norm
   over the batch size, neither squared nor averaged over d (``torch.norm(...) / len(labels)``);
3. after training, one pass over its data updates its class summaries s_k, sample by sample in batch
   order: an empty (all-zero) s_k becomes f, otherwise s_k ← (f + s_k)/2 (``local_feature``). The
   summaries are the client's own and are never reset, so they carry over between its rounds.

Server (``global_feature_centroids``): the bodies are averaged n_k-weighted. For each class, the new centroid
is the mean of *all entries* of the non-empty summaries s_k of this round's clients: ``torch.mean`` of
their concatenation, one number that fills the whole d-vector. A class that no client of the round has
keeps its centroid, and the centroids start at zero, so round 1's body epochs pull the features towards
0. FedPAC's classifier combination is not run (``Get_classifier`` is commented out in ``main_fed_PAC.py``).
The final round tunes the personal head (the engine's default final round; the code's ``last`` round
trains the head alone on cross-entropy).

Batched (``resources.executor: batched``): the same loss as a pure function of the parameters, the centroids
a per-client input; a padded short batch takes R over its real samples only, ‖(F − C_y)·w‖_F / Σw.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import (
    ClientContext, ClientResult, Forward, ServerContext, ServerUpdate, Tensors, masked_cross_entropy,
)
from fltune.methods.fedrep import FedRep, FedRepParams


class FedPACFedCRParams(FedRepParams):
    lam: float = Field(1.0, ge=0, description="weight λ of the alignment norm R (FedCR's README: beta_PAC 1)")


def update_summaries(summaries: Tensor, features: Tensor, labels: Tensor, steps: int | None = None) -> None:
    """FedCR's ``local_feature`` for one batch, in place: per sample in order, an all-zero summary of its
    class takes the feature, any other is averaged with it, (f + s)/2.

    The same operations in the same order per class, but all classes at once: step j folds in each
    class's j-th sample of the batch (classes without one keep their summary). A sample-by-sample loop
    read ``s.any()`` back from the device for every sample, a host sync each (~6,000 a round at paper
    scale); here every test stays on the device and the loop's length is the batch's largest class count:
    ``steps`` when the caller read it already (``largest_classes``), else one read here."""
    if not len(labels):
        return
    order = torch.sort(labels, stable=True).indices  # by class, batch order within a class
    by_class = labels[order]
    counts = torch.bincount(by_class, minlength=summaries.shape[0])
    rank = torch.arange(len(labels), device=labels.device) - (torch.cumsum(counts, 0) - counts)[by_class]
    steps = int(counts.max()) if steps is None else steps
    padded = summaries.new_zeros(summaries.shape[0], steps, summaries.shape[1])
    present = torch.zeros(summaries.shape[0], steps, 1, dtype=torch.bool, device=summaries.device)
    padded[by_class, rank] = features[order].to(summaries.dtype)
    present[by_class, rank] = True
    for j in range(steps):
        feature = padded[:, j]
        folded = torch.where(summaries.any(dim=1, keepdim=True), (feature + summaries) / 2, feature)
        summaries.copy_(torch.where(present[:, j], folded, summaries))


def alignment(residual: Tensor, weight: Tensor | None) -> Tensor:
    """R = ‖F − C_y‖_F / B (``torch.norm(...) / len(labels)``) from the residual rows F − C_y; over the real
    rows of a padded batch (``weight`` 1) when given."""
    if weight is None:
        return torch.linalg.norm(residual) / len(residual)
    return torch.linalg.norm(residual * weight[:, None]) / weight.sum().clamp(min=1.0)


def per_class(ctx: ClientContext, values: np.ndarray | None) -> Tensor:
    """``values`` (classes × d) on the client's device, zeros when None: the code's empty summaries and its
    starting centroids."""
    if values is None:
        return torch.zeros(ctx.model.head.out_features, ctx.model.feature_dim, device=ctx.device)
    return torch.tensor(values, device=ctx.device)  # a copy: arrays from Ray are read-only


def largest_classes(labels: list[Tensor], classes: int) -> list[int]:
    """Each batch's largest class count (``update_summaries``' loop length), all read at once."""
    if not labels:
        return []
    return torch.stack([torch.bincount(y, minlength=classes).max() for y in labels]).tolist()


def class_summaries(ctx: ClientContext, start: np.ndarray | None) -> np.ndarray:
    """The client's summaries (classes × d) after one pass over its data with the trained model, from
    ``start`` (its summaries of earlier rounds) or, at its first round, zeros. The pass's features are
    computed first, so its loop lengths are read in one host sync, not one per batch (a sync waits for the
    GPU's turn where Tune trials share one)."""
    summaries = per_class(ctx, start)
    with torch.no_grad():
        passes = [(ctx.model.features(x), y) for x, y in ctx.batches()]
        lengths = largest_classes([y for _, y in passes], summaries.shape[0])
        for (features, y), steps in zip(passes, lengths):
            update_summaries(summaries, features, y, steps)
    return summaries.cpu().numpy()


def centroids(previous: np.ndarray, summaries: list[np.ndarray]) -> np.ndarray:
    """FedCR's ``global_feature_centroids``: per class, the mean over every entry of the clients' non-empty
    summaries, broadcast over the feature dimension; the previous centroid where none is non-empty."""
    stacked = np.stack(summaries)  # clients × classes × d
    present = stacked.any(axis=2)  # clients × classes
    out = previous.copy()
    for k in np.nonzero(present.any(axis=0))[0]:
        out[k] = stacked[present[:, k], k].astype(np.float64).mean()
    return out.astype(np.float32)


@register
class FedPACFedCR(FedRep):
    """FedPAC as in FedCR's code: FedRep's head-then-body epochs, the body's CE plus λ·‖F − C_y‖_F / B."""

    name = "fedpac_fedcr"
    Params = FedPACFedCRParams
    stored_models = 1.0  # the local model (summaries and centroids are classes × d)
    passes_per_step = 1.0
    batchable = True

    def setup_client(self, ctx: ClientContext) -> None:
        """The round's centroids C (zeros before the server has any), one row per class."""
        ctx.scratch["centroids"] = per_class(ctx, ctx.server.get("centroids"))

    def local_loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """CE + λ·‖F − C_y‖_F / B. The head epochs freeze the body, so the norm moves nothing there (the code
        leaves it out of their loss; here it is in their reported loss only)."""
        features = ctx.model.features(x)
        logits = ctx.model.head(features)
        return self._objective(features, logits, y, ctx.scratch["centroids"], None), logits

    def loss_inputs(self, ctx: ClientContext) -> dict[str, Tensors]:
        return {**super().loss_inputs(ctx), "centroids": {"c": ctx.scratch["centroids"]}}

    def functional_loss(
        self, forward: Forward, params: Tensors, inputs: dict[str, Tensors], x: Tensor, y: Tensor, weight: Tensor,
    ) -> tuple[Tensor, Tensor]:
        features = forward.part("body", params, x)
        logits = forward.part("head", params, features)
        return self._objective(features, logits, y, inputs["centroids"]["c"], weight), logits

    def _objective(self, features: Tensor, logits: Tensor, y: Tensor, centroids: Tensor,
                   weight: Tensor | None) -> Tensor:
        """CE + λ·R for both paths; ``weight`` None (the exact path's unpadded batch) keeps its bits."""
        loss = masked_cross_entropy(logits, y, weight)
        if not self.params.lam:
            return loss
        return loss + self.params.lam * alignment(features - centroids[y], weight)

    def client_result(self, ctx: ClientContext) -> ClientResult:
        result = super().client_result(ctx)
        summaries = class_summaries(ctx, ctx.state.get("summaries"))
        result.state["summaries"] = summaries
        result.upload = {"summaries": summaries}
        return result

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        return dict(server_state)

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """Bodies: n_k-weighted mean (default); centroids from this round's clients' summaries."""
        out = super().aggregate(ctx)
        summaries = [u["summaries"] for u in ctx.aggregate.uploads.values()]
        previous = ctx.server_state.get("centroids", np.zeros_like(summaries[0]))
        return ServerUpdate(out.global_state, {**out.server_state, "centroids": centroids(previous, summaries)},
                            out.client_states)
