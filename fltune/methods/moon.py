"""MOON (Li, He & Song, CVPR 2021; docs/methods.md §2): model-contrastive local learning.

L = CE(f(x), y) + μ·ℓ_con,  ℓ_con = CE([cos(z, z_g), cos(z, z_prev)]/τ, label 0)   (MOON §3)

z is the projection of the penultimate features (MOON's projector, aggregated like any weight); z_g comes
from a frozen copy of the global model, z_prev from the client's previous local model, kept in its state.
``anchors``: eval as ``QinbinLi/MOON``, train as ``mmendiet/FedAlign``; ``first_prev`` is **[U]**.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fltune.errors import FLTuneError
from fltune.methods import register
from fltune.methods._initial import InitialStandIn
from fltune.methods.base import ClientContext, ClientResult, Params
from fltune.methods.objective import Batch
from fltune.methods.wire import to_numpy
from fltune.models.base import SplitModel

PROJECTION_DIM = 256
"""Output width of MOON's projection head (``out_dim`` in the MOON code, 256 in FedAlign's runs)."""


class MoonParams(Params):
    mu: float = Field(1.0, ge=0, description="weight μ of the model-contrastive loss (FedAlign §3.2: 1.0)")
    tau: float = Field(0.5, gt=0, description="temperature τ (MOON default 0.5)")
    first_prev: Literal["global", "initial"] = Field(
        "global", description="previous model at a client's first participation: the round's global model "
        "(ℓ_con = log 2, no gradient) or the initial model (FedAlign's code)")
    anchors: Literal["eval", "train"] = Field(
        "eval", description="mode of the frozen global and previous copies: eval (MOON's code: batch-norm running "
        "statistics) or train (FedAlign's code: each batch's own statistics)")


def add_projector(model: nn.Module) -> SplitModel:
    """The model's body → MOON's projector → a fresh linear head. Only plain SplitModels qualify: one with
    its own ``features`` (VIB) or a non-linear head would silently change meaning if re-wired."""
    plain = isinstance(model, SplitModel) and type(model).features is SplitModel.features
    if not plain or not isinstance(model.head, nn.Linear):
        raise FLTuneError(
            f"model.name: method 'moon' needs a body/linear-head model; got a {type(model).__name__}"
        )
    dim = model.feature_dim
    projector = nn.Sequential(
        OrderedDict(fc1=nn.Linear(dim, dim), relu=nn.ReLU(), fc2=nn.Linear(dim, PROJECTION_DIM))
    )
    body = nn.Sequential(OrderedDict(encoder=model.body, projector=projector))
    return SplitModel(body, nn.Linear(PROJECTION_DIM, model.head.out_features), PROJECTION_DIM)


def contrastive_loss(z: Tensor, z_global: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """MOON's ℓ_con: CE over [cos(z, z_g), cos(z, z_prev)]/τ with the global model as the positive."""
    logits = torch.stack([F.cosine_similarity(z, z_global, dim=1), F.cosine_similarity(z, z_prev, dim=1)], 1)
    return F.cross_entropy(logits / tau, torch.zeros(len(z), dtype=torch.long, device=z.device))


def frozen_copy(model: nn.Module, state: dict[str, Tensor], train: bool = False) -> nn.Module:
    """A gradient-free copy of ``model`` holding ``state``, in eval (or ``train``) mode. It owns its buffers,
    so a train-mode BN update never reaches ``state``, which other clients share."""
    clone = copy.deepcopy(model).train(train)
    clone.load_state_dict(state)
    clone.requires_grad_(False)
    return clone


@register
class Moon(InitialStandIn):
    """MOON: L = CE + μ·CE([cos(z, z_g), cos(z, z_prev)]/τ, 0); server as FedAvg. μ = 0: CE exactly."""

    name = "moon"
    Params = MoonParams
    stored_models = 3.0  # local, global and previous local model (MOON's contrastive anchors)
    kept, first = "prev", "first_prev"
    passes_per_step = 5.0 / 3.0  # + two forward-only passes (global, previous), a forward ≈ 1/3 of a step

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return add_projector(model)

    def setup_client(self, ctx: ClientContext) -> None:
        train = self.params.anchors == "train"
        global_model = frozen_copy(ctx.model, ctx.global_state, train)
        prev = ctx.state.get("prev")  # numpy from the client store, read-only if it came through Ray: copied
        ctx.scratch["global"] = global_model
        if prev is not None:
            ctx.scratch["prev"] = frozen_copy(ctx.model, {k: torch.tensor(v) for k, v in prev.items()}, train)
        elif (initial := self.initial_model(ctx)) is not None:
            ctx.scratch["prev"] = frozen_copy(ctx.model, dict(initial), train)
        else:
            ctx.scratch["prev"] = global_model

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        model, x, y = batch.module(), batch.x, batch.y
        z = model.features(x)
        logits = model.head(z)
        loss = F.cross_entropy(logits, y)
        if self.params.mu == 0:
            return loss, logits
        with torch.no_grad():
            z_global, z_prev = batch.module("global").features(x), batch.module("prev").features(x)
        return loss + self.params.mu * contrastive_loss(z, z_global, z_prev, self.params.tau), logits

    def client_result(self, ctx: ClientContext) -> ClientResult:
        result = super().client_result(ctx)
        result.state["prev"] = to_numpy(ctx.model.state_dict())
        return result

