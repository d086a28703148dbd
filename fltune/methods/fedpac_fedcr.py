"""FedPAC as FedCR's code runs it (``haozzh/FedCR``: ``main_fed_PAC.py``,
``models/distributed_training_utils_PAC.py``): the code behind SimFAFL Table 2's FedPAC row; docs/methods.md §2.

Not FedPAC's own algorithm (``fedpac``): shared body, personal head, FedRep's schedule; the body epochs add λ·R,
R = ‖F − C_y‖_F / B against the server's class centroids; after training the client folds its features into class
summaries, and a class's centroid is the mean of all entries of the round's non-empty summaries
(``global_feature_centroids``).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import ClientContext, ClientResult, ServerContext, ServerUpdate
from fltune.methods.fedpac import FeatureAligned
from fltune.methods.fedrep import FedRep, FedRepParams
from fltune.methods.objective import Batch


class FedPACFedCRParams(FedRepParams):
    lam: float = Field(1.0, ge=0, description="weight λ of the alignment norm R (FedCR's README: beta_PAC 1)")


def update_summaries(summaries: np.ndarray, features: np.ndarray, labels: list[int]) -> None:
    """FedCR's ``local_feature``, in place and literally: per sample in order, an all-zero summary of its
    class takes the feature f, any other is averaged with it, (f + s)/2."""
    for feature, label in zip(features, labels):
        current = summaries[label]
        summaries[label] = (feature + current) / 2 if current.any() else feature


def class_summaries(ctx: ClientContext, start: np.ndarray | None) -> np.ndarray:
    """The client's summaries (classes × d) after one pass with the trained model, from ``start`` or zeros.
    The fold runs on the host (on a GPU it is launches per sample); correctly rounded sums and exact halvings
    give the same bits on either device."""
    shape = (ctx.model.head.out_features, ctx.model.feature_dim)
    summaries = np.zeros(shape, np.float32) if start is None else start.copy()  # Ray's arrays are read-only
    with torch.no_grad():
        passes = [(ctx.model.features(x), y) for x, y in ctx.batches()]
    if passes:
        features = torch.cat([f for f, _ in passes]).cpu().numpy().astype(summaries.dtype, copy=False)
        update_summaries(summaries, features, torch.cat([y for _, y in passes]).tolist())
    return summaries


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
class FedPACFedCR(FeatureAligned, FedRep):
    """FedPAC as in FedCR's code: FedRep's head-then-body epochs, the body's CE plus λ·‖F − C_y‖_F / B."""

    name = "fedpac_fedcr"
    Params = FedPACFedCRParams
    stored_models = 1.0  # the local model (summaries and centroids are classes × d)
    passes_per_step = 1.0

    def setup_client(self, ctx: ClientContext) -> None:
        """The round's centroids C (shared: read only), zeros before any, as the code."""
        shape = (ctx.model.head.out_features, ctx.model.feature_dim)
        c = ctx.server_tensors.get("centroids")
        ctx.inputs["centroids"] = {"c": torch.zeros(shape, device=ctx.device) if c is None else c}

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """CE + λ·R, R = ‖F − C_y‖_F / B (``torch.norm(...) / len(labels)``) over the real samples; in head epochs R
        moves nothing (the code leaves it out there), so it differs from the code's in the reported loss only."""
        features = batch.forward.model.features_of(batch.forward.part("body", batch.weights, batch.x))
        logits = batch.forward.part("head", batch.weights, features)
        loss = batch.cross_entropy(logits)
        if not self.params.lam:
            return loss, logits
        residual = features - batch.inputs["centroids"]["c"][batch.y]
        return loss + self.params.lam * (torch.linalg.norm(batch.real(residual)) / batch.size), logits

    def client_result(self, ctx: ClientContext) -> ClientResult:
        result = super().client_result(ctx)
        summaries = class_summaries(ctx, ctx.state.get("summaries"))
        result.state["summaries"] = summaries
        result.upload = {"summaries": summaries}
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        summaries = [u["summaries"] for u in ctx.aggregate.uploads.values()]
        previous = ctx.server_state.get("centroids", np.zeros_like(summaries[0]))
        return ServerUpdate(out.global_state, {**out.server_state, "centroids": centroids(previous, summaries)},
                            out.client_states)
