"""FedProx (Li et al., 2020; docs/methods.md §2): a proximal term keeps local weights near the round's global ones."""

import torch
from pydantic import Field

from fltune.methods import register
from fltune.methods.base import ClientContext, Forward, Method, Params, squared_distance


class FedProxParams(Params):
    """μ defaults to FedSOL's 1.0 (App. B.5; ``Lee-Gihun/FedSOL:configs/baselines/fedprox.json``), the paper
    whose protocol fltune's default training section follows (100 clients × 0.1, E = 5, B = 50, SGD lr 0.01,
    momentum 0.9). FedAlign's tables set their 1e-4 explicitly."""

    mu: float = Field(1.0, ge=0, description="proximal weight μ; default FedSOL's 1.0 (FedAlign uses 1e-4)")


@register
class FedProx(Method):
    """FedProx: L = CE + (μ/2)·‖w − w_g‖² over the trainable parameters; server as FedAvg.

    With μ = 0 the term is skipped entirely, so FedProx reproduces FedAvg bit for bit.
    """

    name = "fedprox"
    Params = FedProxParams
    passes_per_step = 1.0  # the proximal term needs no extra pass
    stored_models = 2.0  # the local model and the global copy w_g of the proximal term
    batchable = True

    def local_loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = super().local_loss(ctx, x, y)
        if self.params.mu == 0:
            return loss, logits
        return loss + 0.5 * self.params.mu * squared_distance(ctx.model.named_parameters(), ctx.global_state), logits

    def loss_inputs(self, ctx: ClientContext) -> dict[str, dict[str, torch.Tensor]]:
        names = [n for n, _ in ctx.model.named_parameters()]
        return {**super().loss_inputs(ctx), "global": {n: ctx.global_param(n) for n in names}}

    def functional_loss(
        self, forward: Forward, params: dict[str, torch.Tensor], inputs: dict[str, dict[str, torch.Tensor]],
        x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = super().functional_loss(forward, params, inputs, x, y, weight)
        if self.params.mu == 0:
            return loss, logits
        return loss + 0.5 * self.params.mu * squared_distance(params.items(), inputs["global"]), logits
