"""FedASAM (Caldarola et al., 2022; docs/methods.md §2): adaptive SAM (Kwon et al., 2021) as the local optimiser."""

from collections.abc import Mapping

from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods._sam import Epsilon, SharpnessAware, asam_epsilon
from fltune.methods.base import Params


class FedASAMParams(Params):
    rho: float = Field(0.5, ge=0, description="ASAM radius ρ (MAN §7: 0.5 non-IID, 0.1 IID; FedSOL: 1.0)")
    eta: float = Field(0.2, ge=0, description="ASAM offset η in T = |w| + η (MAN §7: 0.2)")


@register
class FedASAM(SharpnessAware):
    """FedASAM: step with ∇L(w + ε), ε = ρ·T²g/‖Tg‖, T = |w| + η on weight tensors (1 on biases);
    server as FedAvg. ρ = 0 gives FedAvg's gradient.
    """

    name = "fedasam"
    Params = FedASAMParams

    def epsilon(self, global_weights: Mapping[str, Tensor]) -> Epsilon:
        return asam_epsilon(self.params.rho, self.params.eta)
