"""A proximal loss as FedSOL's §2 weighs its two uses (Lee et al., 2024, Table 1; docs/methods.md §2).

The proximal loss L_p measures how far the local model has moved from the round's global one:

    l2:  L_p = ½‖w − w_g‖²                                    (FedProx's term, μ = β)
    kl:  L_p = KL(softmax(z_g/T) ‖ softmax(z_l/T))            (FedSOL's, z_g from a frozen global copy)

and it is used either

    base        L = CE + β·L_p                                 (Eq. 2: an auxiliary loss)
    projection  g = g_l − min(0, ⟨g_l, g_p⟩)/‖g_p‖² · g_p      (Eq. 3: the local gradient g_l = ∇CE with its
                                                                component against g_p = ∇L_p removed)

Projection does not depend on β or the scale of L_p. ⟨·,·⟩ and ‖·‖ run over every trainable parameter as one
vector [U: Eq. 3 writes whole gradients]. Neither the projection nor the KL "Base" is in the authors' code
(``Lee-Gihun/FedSOL``); only the paper's text gives them.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import ClientContext, Method, Params
from fltune.methods.fedntd import soft_kl
from fltune.methods.moon import frozen_copy
from fltune.methods.objective import Batch, squared_distance


class ProximalParams(Params):
    loss: Literal["l2", "kl"] = Field("kl", description="L_p: ½‖w − w_g‖² or the KL of the outputs (FedSOL's)")
    usage: Literal["base", "projection"] = Field(
        "projection", description="CE + β·L_p (Eq. 2) or ∇CE projected off ∇L_p where they conflict (Eq. 3)"
    )
    beta: float = Field(1.0, ge=0, description="weight β of L_p with usage base [U: Table 1 gives none]")
    temperature: float = Field(3.0, gt=0, description="softmax temperature T of the KL (FedSOL's App. B.5: 3)")


def project_off(grads: list[Tensor], against: list[Tensor]) -> list[Tensor]:
    """Eq. 3: ``grads`` less their component along ``against`` where their inner product (all tensors) is < 0."""
    dot = sum((g * a).sum() for g, a in zip(grads, against, strict=True))
    norm = sum((a * a).sum() for a in against)
    if dot >= 0 or norm == 0:
        return grads
    return [g - (dot / norm) * a for g, a in zip(grads, against, strict=True)]


@register
class Proximal(Method):
    """Proximal: L_p added to CE (``base``) or ∇CE projected off ∇L_p (``projection``); server as FedAvg."""

    name = "proximal"
    Params = ProximalParams
    stored_models = 2.0  # the local model and the global one (w_g, or the KL's frozen copy)

    @property
    def passes_per_step(self) -> float:  # type: ignore[override]
        """KL: + the global copy's forward (⅓ of a pass), and with projection the second backward (⅔)."""
        if self.params.loss == "l2":
            return 1.0
        return 2.0 if self.params.usage == "projection" else 4.0 / 3.0

    def setup_client(self, ctx: ClientContext) -> None:
        super().setup_client(ctx)
        if self.params.loss == "kl":
            ctx.scratch["global_model"] = frozen_copy(ctx.model, ctx.global_state)

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        loss, logits = super().local_loss(batch)
        if self.params.usage == "base" and self.params.beta:  # β = 0: exactly FedAvg
            return loss + self.params.beta * self.proximal_loss(batch, logits), logits
        return loss, logits

    def proximal_loss(self, batch: Batch, logits: Tensor) -> Tensor:
        """L_p at the current weights: ½‖w − w_g‖² or KL(softmax(z_g/T) ‖ softmax(z_l/T))."""
        if self.params.loss == "l2":
            return 0.5 * squared_distance(batch.weights.items(), batch.global_weights)
        with torch.no_grad():
            global_logits = batch.module("global_model")(batch.x)
        return soft_kl(logits, global_logits, self.params.temperature, batch)

    def backward(self, ctx: ClientContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``projection``: the CE gradient in ``.grad`` projected off ∇L_p (Eq. 3), ∇L_p from the same forward."""
        if self.params.usage != "projection":
            return super().backward(ctx, x, y)
        batch = self.batch(ctx, x, y)
        loss, logits = self.local_loss(batch)
        weights = [p for p in ctx.model.parameters() if p.requires_grad]
        pulls = torch.autograd.grad(self.proximal_loss(batch, logits), weights, retain_graph=True, allow_unused=True)
        against = [torch.zeros_like(p) if g is None else g for p, g in zip(weights, pulls)]
        loss.backward()
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in weights]
        for p, g in zip(weights, project_off(grads, against), strict=True):
            p.grad = g
        return loss.detach(), logits.detach()

