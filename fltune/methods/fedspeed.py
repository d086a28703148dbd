"""FedSpeed (Sun et al., 2023; docs/methods.md §2): SAM-perturbed local gradients plus a FedDyn-style correction."""

from collections.abc import Mapping

from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods._drift import DriftCorrected, DriftParams
from fltune.methods.fedsam import FedSAM
from fltune.methods.objective import Tensors


class FedSpeedParams(DriftParams):
    lam: float = Field(0.1, ge=0, description="weight λ of the prox-correction term")
    rho: float = Field(0.1, ge=0, description="SAM radius ρ (MAN §7: 0.1 non-IID, 0.01 IID)")


@register
class FedSpeed(DriftCorrected, FedSAM):
    """FedSpeed: gradient ∇CE(w + ε) + λ(θ − θ_g + h_k), ε = ρ·g/‖g‖; h_k += θ_k − θ_g; server θ = mean_S θ_k +
    mean_all h_k (plain means). The authors' λ⟨θ, h_k − θ_g⟩ after the SAM step plus weight decay λ/2‖θ‖²
    (``woodenchild95/FL-Simulator``, ``client/fedspeed.py``) has the drift penalty's gradient, added here at w, outside
    both SAM passes. ESAM's β = γ = 1 (MAN §7) make it plain SAM. λ = ρ = 0: FedAvg's step."""

    name = "fedspeed"
    Params = FedSpeedParams
    stored_models = 4.0  # SAM's w and ε, plus θ_g and the correction h_k

    def gradient_correction(self, weights: Mapping[str, Tensor], inputs: Mapping[str, Tensors]) -> Tensors:
        """The drift penalty's gradient at the restored w."""
        if self.params.lam == 0:
            return {}
        target = inputs["drift_target"]
        return {n: self.params.lam * (p - target[n]) for n, p in weights.items()}
