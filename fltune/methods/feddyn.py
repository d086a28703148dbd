"""FedDyn (Acar et al., 2021; docs/methods.md §2): a dynamic regulariser that makes local optima consistent."""

from torch import Tensor
from pydantic import Field

from fltune.methods import register
from fltune.methods._drift import DriftCorrected, DriftParams
from fltune.methods.objective import Batch, squared_distance


class FedDynParams(DriftParams):
    alpha: float = Field(0.01, ge=0, description="regulariser weight α (MAN §7, FedDyn CIFAR: 0.01)")


@register
class FedDyn(DriftCorrected):
    """FedDyn: L = CE − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ_g‖², written as CE + (α/2)‖θ − (θ_g − h_k)‖².
    h_k = Σ_t (θ_k^t − θ_g^t) (``_drift.DriftCorrected``). [U] α is not divided by the client's relative size
    (α/(n_k·N/n)) as the authors' code does for unequal clients. α = 0: exactly CE (the server still adds h)."""

    name = "feddyn"
    Params = FedDynParams
    passes_per_step = 1.0

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """CE + (α/2)·‖θ − (θ_g − h_k)‖² (FedDC's form): the gradient of FedDyn's Alg. 1 objective with
        ∇L_k(θ_k^{t−1}) = −α·h_k (``acarturk/FedDyn``); the values differ by a constant."""
        loss, logits = super().local_loss(batch)
        if self.params.alpha == 0:
            return loss, logits
        alpha = self.params.alpha
        return loss + 0.5 * alpha * squared_distance(batch.weights.items(), batch.inputs["drift_target"]), logits
