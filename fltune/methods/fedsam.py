"""FedSAM (Qu et al., 2022; Caldarola et al., 2022; docs/methods.md §2): SAM as the local optimiser."""

from pydantic import Field

from fltune.methods import register
from fltune.methods._sam import SharpnessAware
from fltune.methods.base import Params


class FedSAMParams(Params):
    rho: float = Field(0.05, ge=0, description="SAM radius ρ (MAN §7: 0.05; FedSOL Table 8: 0.1)")


@register
class FedSAM(SharpnessAware):
    """FedSAM: step with ∇L(w + ε), ε = ρ·∇L(w)/‖∇L(w)‖, L the local loss; server as FedAvg. ρ = 0 gives
    FedAvg's gradient."""

    name = "fedsam"
    Params = FedSAMParams
