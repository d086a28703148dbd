"""Stochastic depth (Huang et al., ECCV 2016) as a local regulariser (FedAlign §3.2; docs/methods.md §2).

ζ_ℓ = σ(b_ℓ·F_ℓ(ζ_{ℓ−1}) + I(ζ_{ℓ−1})), b_ℓ ~ Bernoulli(p_ℓ) over ResNet-56's 18 blocks, p_ℓ by ``schedule``
(``code``: ``mmendiet/FedAlign:models/resnet_stochdepth.py``, which FedAlign's tables use); at evaluation
the branch is scaled by p_ℓ. The loss is plain CE; ``adapt_model`` sets
:meth:`~fltune.models.resnet56.ResNet56.set_stochastic_depth` on every copy, so the global model is also
*evaluated* with the p_ℓ scaling.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from fltune.methods import register
from fltune.methods.base import Params
from fltune.methods.fedalign import ResNet56Method


class StochDepthParams(Params):
    rho_L: float = Field(0.9, gt=0, le=1, description="survival probability ρ_L of the last block (FedAlign: 0.9)")
    schedule: Literal["paper", "code"] = Field(
        "paper", description="paper: p_ℓ = 1 − (ℓ/L)(1 − ρ_L), ℓ = 1..L (Huang et al.); code: the first block always "
        "kept, p_ℓ = 1 − ((ℓ−1)/(L−1))(1 − ρ_L) (FedAlign's models/resnet_stochdepth.py)")


@register
class StochDepth(ResNet56Method):
    """StochDepth: CE on a ResNet-56 whose blocks survive with probability falling linearly to ρ_L; ρ_L = 1 is
    FedAvg exactly."""

    name = "stochdepth"
    Params = StochDepthParams
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0  # dropped blocks are counted in FLOPs by the workers

    def adapt_model(self, model: nn.Module) -> nn.Module:
        resnet = super().adapt_model(model)
        resnet.set_stochastic_depth(self.params.rho_L, first_kept=self.params.schedule == "code")
        return resnet
