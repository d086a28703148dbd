"""FedASAM (Caldarola et al., 2022; docs/methods.md §2): adaptive SAM (Kwon et al., 2021) as the local optimiser."""

from collections.abc import Mapping

import torch
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.fedsam import NORM_EPS, FedSAM, Named
from fltune.methods.base import Params
from fltune.methods.objective import global_norm


class FedASAMParams(Params):
    rho: float = Field(0.5, ge=0, description="ASAM radius ρ (MAN §7: 0.5 non-IID, 0.1 IID; FedSOL: 1.0)")
    eta: float = Field(0.2, ge=0, description="ASAM offset η in T = |w| + η (MAN §7: 0.2)")


@register
class FedASAM(FedSAM):
    """FedASAM: step with ∇L(w + ε), ε = ρ·T²g/‖Tg‖, T = |w| + η on weight tensors (1 on biases);
    server as FedAvg. ρ = 0 gives FedAvg's gradient.
    """

    name = "fedasam"
    Params = FedASAMParams

    def epsilon(self, named: Named, grads: list[Tensor], global_weights: Mapping[str, Tensor]) -> list[Tensor]:
        """T on parameters named ``*weight`` (norm scales too, as ``SamsungLabs/ASAM``'s ``'weight' in n``)."""
        scales = [p.detach().abs() + self.params.eta if n.endswith("weight") else torch.ones_like(p) for n, p in named]
        scaled = [t * g for t, g in zip(scales, grads, strict=True)]
        factor = self.params.rho / (global_norm(scaled) + NORM_EPS)
        return [t * tg * factor for t, tg in zip(scales, scaled, strict=True)]
