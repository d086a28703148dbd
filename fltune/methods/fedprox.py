"""FedProx (Li et al., 2020; docs/methods.md §2): a proximal term keeps local weights near the round's global ones."""

import torch
from pydantic import Field

from fltune.methods import register
from fltune.methods.base import Method, Params
from fltune.methods.objective import Batch, squared_distance


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

    def local_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = super().local_loss(batch)
        if self.params.mu == 0:
            return loss, logits
        return loss + 0.5 * self.params.mu * squared_distance(batch.weights.items(), batch.global_weights), logits
