"""Mixup (Zhang et al., ICLR 2018) as a local regulariser (FedAlign §3.2; docs/methods.md §2).

Per batch: λ ~ Beta(γ, γ), a random pairing π, x̃ = λ·x + (1 − λ)·x_π and L = λ·CE(f(x̃), y) +
(1 − λ)·CE(f(x̃), y_π) (``hongyi-zhang/mixup``, as ``mmendiet/FedAlign:methods/mixup.py``). λ and π come
from torch's seeded global RNG (the authors' code: numpy), so any worker reproduces them. The logits are
the mixed batch's, so the logged train accuracy is against y on mixed inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import Method, Params
from fltune.methods.objective import Batch


class MixupParams(Params):
    gamma: float = Field(0.1, ge=0, description="Beta(γ, γ) concentration (FedAlign §3.2: 0.1); 0 = no mixing")


def mix(x: Tensor, gamma: float) -> tuple[Tensor, Tensor, float]:
    """(x̃, π, λ)."""
    concentration = torch.tensor(float(gamma))
    lam = float(torch.distributions.Beta(concentration, concentration).sample())
    perm = torch.randperm(len(x)).to(x.device)
    return lam * x + (1 - lam) * x[perm], perm, lam


@register
class Mixup(Method):
    """Mixup: L = λ·CE(f(x̃), y) + (1 − λ)·CE(f(x̃), y_π); server as FedAvg. γ = 0 means λ = 1 (the
    authors' convention): no draw, FedAvg exactly."""

    name = "mixup"
    Params = MixupParams
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0  # one pass over the mixed batch

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        x, y = batch.x, batch.y
        if self.params.gamma == 0:
            return super().local_loss(batch)
        model = batch.module()  # its draws from torch's global RNG replay the exact path's client by client only
        mixed, perm, lam = mix(x, self.params.gamma)
        logits = model(mixed)
        return lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[perm]), logits
