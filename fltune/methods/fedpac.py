"""FedPAC (Xu, Tong & Huang, ICLR 2023; docs/methods.md §2): feature alignment + classifier collaboration.

A client takes its statistics with the received model (``statistics_extraction``), trains its head one
epoch at ``head_lr``, then its body on CE + λ·MSE(f(x), c_y) against the global prototypes; the server
averages bodies and prototypes and gives each client the head combination Σ_j α_ij·head_j of the QP (by
accelerated projected gradient instead of cvxpy). Departures from ``JianXu95/FedPAC``: docs/methods.md §2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fltune.errors import FLTuneError
from fltune.methods import register
from fltune.methods.base import ClientContext, ClientResult, Params, Phase, ServerContext, ServerUpdate, Upload
from fltune.methods.fedper import FedPer
from fltune.methods.objective import Batch
from fltune.models.convnets import evaluating
QP_STEPS = 500
MIN_WEIGHT = 1e-3
"""Head-combination weights below this are zeroed (``get_head_agg_weight``'s eps)."""


class FedPACParams(Params):
    lam: float = Field(1.0, ge=0, description="weight λ of the feature-alignment MSE (FedPAC: 1.0)")
    head_lr: float = Field(0.1, gt=0, description="lr of the one head-only epoch (FedPAC code: 0.1)")


@dataclass(frozen=True)
class ClassFeatures:
    """Per-class count, feature sum and summed squared norm over one pass of a client's data."""

    counts: Tensor
    sums: Tensor
    squares: Tensor

    @property
    def means(self) -> Tensor:
        return self.sums / self.counts.clamp_min(1)[:, None]

    def variance_term(self) -> float:
        """v_i = (Σ_k p_k·E[‖f‖²|k] − Σ_k p_k²‖μ_k‖²) / n_i (FedPAC ``statistics_extraction``)."""
        n = self.counts.sum()
        p = self.counts / n
        second_moment = self.squares / self.counts.clamp_min(1)
        return float(((p * second_moment).sum() - (p**2 * (self.means**2).sum(1)).sum()) / n)

    def weighted_means(self) -> Tensor:
        """h_i = [p_k·μ_k]_k (zero rows for absent classes)."""
        return self.counts[:, None] / self.counts.sum() * self.means


def class_features(ctx: ClientContext, num_classes: int) -> ClassFeatures:
    """:class:`ClassFeatures` of f(x) over one pass of the client's training batches."""
    dim = ctx.model.feature_dim
    counts = torch.zeros(num_classes, dtype=torch.float64, device=ctx.device)
    sums = torch.zeros(num_classes, dim, dtype=torch.float64, device=ctx.device)
    squares = torch.zeros_like(counts)
    with evaluating(ctx.model):
        for x, y in ctx.batches():
            f = ctx.model.features(x).double()
            counts.index_add_(0, y, torch.ones_like(y, dtype=torch.float64))
            sums.index_add_(0, y, f)
            squares.index_add_(0, y, (f**2).sum(1))
    return ClassFeatures(counts, sums, squares)


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {α ≥ 0, Σα = 1} (sort-based, Duchi et al. 2008)."""
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    ranks = np.arange(1, len(v) + 1)
    rho = np.nonzero(u - cumulative / ranks > 0)[0][-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def simplex_qp(p_matrix: np.ndarray, steps: int = QP_STEPS) -> np.ndarray:
    """argmin_α αᵀPα s.t. α ≥ 0, Σα = 1 for symmetric PSD P, by projected FISTA (uniform if P = 0)."""
    n = len(p_matrix)
    alpha = np.full(n, 1.0 / n)
    lipschitz = 2.0 * float(np.linalg.eigvalsh(p_matrix).max())
    if lipschitz <= 0:
        return alpha
    momentum_point, t = alpha, 1.0
    for _ in range(steps):
        nxt = project_simplex(momentum_point - 2.0 * p_matrix @ momentum_point / lipschitz)
        t_next = (1.0 + math.sqrt(1.0 + 4.0 * t * t)) / 2.0
        momentum_point = nxt + (t - 1.0) / t_next * (nxt - alpha)
        alpha, t = nxt, t_next
    return alpha


def head_weights(variances: np.ndarray, h: np.ndarray, i: int) -> np.ndarray:
    """α_i for client i from all sampled clients' v_j and h_j ([clients, classes, dim]), small ones zeroed."""
    diff = (h[i] - h).reshape(len(h), -1)
    alpha = simplex_qp(np.diag(variances) + diff @ diff.T)
    alpha = np.where(alpha < MIN_WEIGHT, 0.0, alpha)
    return alpha / alpha.sum()


class FeatureAligned(FedPer):
    """A personal linear head over features aligned to the server's class targets (FedPAC's prototypes,
    centroids); any other head fails at model construction."""

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model = super().adapt_model(model)
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise FLTuneError(f"model.name: {self.name} needs a model whose head is one linear layer; this "
                              f"model's head is a {type(head).__name__}")
        return model


@register
class FedPAC(FeatureAligned):
    """FedPAC: head epoch, then body epochs with CE + λ·MSE(f(x), c_y); server combines heads per client."""

    name = "fedpac"
    Params = FedPACParams
    stored_models = 1.0  # the local model (prototypes are small)
    passes_per_step = 1.0

    def phases(self, ctx: ClientContext) -> list[Phase]:
        return [Phase(1, ("head.",), lr=self.params.head_lr), Phase(ctx.epochs, ("body.",))]

    def setup_client(self, ctx: ClientContext) -> None:
        """Pre-training statistics (step 1) and each class's alignment target (the local mean where none)."""
        before = class_features(ctx, ctx.model.head.out_features)
        ctx.scratch["before"] = before
        if "protos" in ctx.server_tensors:
            protos, has = ctx.server_tensors["protos"], ctx.server_tensors["has_proto"]
            ctx.inputs["targets"] = {"c": torch.where(has[:, None], protos, before.means.float())}

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """In the head phase the body is frozen, so the MSE adds no gradient."""
        model, x, y = batch.module(), batch.x, batch.y
        features = model.features(x)
        logits = model.head(features)
        loss = F.cross_entropy(logits, y)
        if self.params.lam and "targets" in batch.inputs:
            loss = loss + self.params.lam * F.mse_loss(features, batch.inputs["targets"]["c"][y])
        return loss, logits

    def client_result(self, ctx: ClientContext) -> ClientResult:
        result = super().client_result(ctx)
        before, after = ctx.scratch["before"], class_features(ctx, ctx.model.head.out_features)
        result.upload = {
            "v": np.array(before.variance_term()),
            "h": before.weighted_means().cpu().numpy(),
            "protos": after.means.cpu().numpy(),
            "counts": after.counts.cpu().numpy(),
        }
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """Prototypes: count-weighted; heads: per-client QP weights."""
        out = super().aggregate(ctx)
        stats = list(ctx.aggregate.uploads.values())
        counts = np.stack([s["counts"] for s in stats])
        total = counts.sum(0)
        protos = np.einsum("ik,ikd->kd", counts, np.stack([s["protos"] for s in stats]))
        server_state = {
            **out.server_state, "protos": (protos / np.maximum(total, 1)[:, None]).astype(np.float32),
            "has_proto": total > 0,
        }
        heads = self._combine_heads(out.client_states, ctx.aggregate.uploads)
        return replace(out, server_state=server_state, client_states=heads)

    @staticmethod
    def _combine_heads(states: dict[int, dict[str, Any]], uploads: dict[int, Upload]) -> dict[int, dict[str, Any]]:
        """Each sampled client's head replaced by its α-weighted combination of all their heads."""
        clients, stats = list(uploads), list(uploads.values())
        variances = np.array([s["v"] for s in stats])
        h = np.stack([s["h"] for s in stats])
        heads = [states[c]["personal"] for c in clients]
        combined = {}
        for i, cid in enumerate(clients):
            alpha = head_weights(variances, h, i)
            mixed = {
                k: sum(a * head[k].astype(np.float64) for a, head in zip(alpha, heads)).astype(heads[i][k].dtype)
                for k in heads[i]
            }
            combined[cid] = {**states[cid], "personal": mixed}
        return combined
