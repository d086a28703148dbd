"""FedSOL (Lee et al., 2024; docs/methods.md §2): local gradients taken where a proximal perturbation hurts least."""

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.fedsam import FedSAM, Named
from fltune.methods.base import ClientContext, Params
from fltune.methods.fedntd import soft_kl
from fltune.methods.moon import frozen_copy
from fltune.methods.objective import Batch, Tensors, scalar_loss


SCOPES: dict[str, tuple[str, ...] | None] = {"head": ("head.",), "body": ("body.",), "all": None}


class FedSOLParams(Params):
    rho: float = Field(1.0, ge=0, description="base perturbation strength ρ (paper: 1.0, best 0.5-2.0)")
    scope: Literal["head", "body", "all"] = Field(
        "head", description="parameters perturbed (§3.4; paper default head, authors' configs all)"
    )
    adaptive: bool = Field(True, description="scale ε per parameter by |w − w_g| (Eq. 7-8); False: Eq. 5")
    temperature: float = Field(3.0, gt=0, description="softmax temperature of the proximal KL (App. B.5: 3)")


@register
class FedSOL(FedSAM):
    """FedSOL (Alg. 1): per batch, L_p = KL(softmax(z_g/T) ‖ softmax(z_l/T)) against a frozen copy of the round's global
    model; g = ∇L_p over the perturbed scope; ε = ρ·s⊙g/‖g‖ (Eq. 8, global norm over the scope); the local loss's
    gradient is taken at w + ε (BN momentum 0) and stepped from w; server as FedAvg. [U] Scope defaults to the head, the
    paper's setting (§3.4, Table 5); ``scope: all`` is the authors' configs'. The global copy runs in eval mode, as the
    authors' code. ρ = 0 gives FedAvg's gradient."""

    name = "fedsol"
    Params = FedSOLParams
    stored_models = 3.0  # SAM's w and ε, plus the global model of the proximal (KL) loss

    def setup_client(self, ctx: ClientContext) -> None:
        super().setup_client(ctx)
        ctx.scratch["global_model"] = frozen_copy(ctx.model, ctx.global_state)

    def ascent(self, batch: Batch) -> tuple[Named, list[Tensor], Tensor, Tensor]:
        """g = ∇L_p (Eq. 5) over the scope's weights at w; the local loss and logits at w from the same forward pass."""
        scope = SCOPES[self.params.scope]
        named = [(n, p) for n, p in batch.trained.items() if scope is None or n.startswith(scope)]
        with torch.no_grad():
            global_logits = batch.model("global_model")(batch.global_weights, batch.x)

        def proximal(scoped: Tensors) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            seen = batch.at(scoped)
            loss, logits = self.local_loss(seen)
            kl = soft_kl(logits, global_logits, self.params.temperature, seen)
            return kl, (scalar_loss(seen, loss).detach(), logits.detach())

        grads, _, (loss, logits) = batch.gradient(proximal, dict(named))
        return named, [grads[n] for n, _ in named], loss, logits

    def epsilon(self, named: Named, grads: list[Tensor], global_weights: Mapping[str, Tensor]) -> list[Tensor]:
        """Eq. 8: s ⊙ ρ·g/‖g‖, s = |w − w_g| L2-normalised along dim 0 (Eq. 7; ``F.normalize`` as the authors' code);
        with ``adaptive: false`` s = 1 (Eq. 5)."""
        plain = super().epsilon(named, grads, global_weights)
        if not self.params.adaptive:
            return plain
        strengths = [F.normalize((p.detach() - global_weights[n]).abs(), p=2, dim=0) for n, p in named]
        return [s * e for s, e in zip(strengths, plain, strict=True)]
