"""FedDyn (Acar et al., 2021; docs/methods.md §2): a dynamic regulariser that makes local optima consistent."""

from torch import Tensor
from pydantic import Field

from fltune.methods import register
from fltune.methods._drift import DriftCorrected
from fltune.methods.base import ClientContext, Forward, Params, squared_distance


class FedDynParams(Params):
    alpha: float = Field(0.01, ge=0, description="regulariser weight α (MAN §7, FedDyn CIFAR: 0.01)")


@register
class FedDyn(DriftCorrected):
    """FedDyn: L = CE − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ_g‖², written as CE + (α/2)‖θ − (θ_g − h_k)‖².

    h_k = Σ_t (θ_k^t − θ_g^t) per client (∇L_k(θ_k^{t−1}) = −α·h_k); server θ = mean_S θ_k + mean_all h_k,
    plain means (see ``_drift.DriftCorrected``). [U] α is not divided by the client's relative size as
    the authors' code does for unequal clients (α/(n_k·N/n)); equal-size partitions (MAN's) are unaffected.
    With α = 0 the penalty is skipped, so the local loss is exactly CE (the server still adds mean h).
    """

    name = "feddyn"
    Params = FedDynParams
    passes_per_step = 1.0
    batchable = True

    def local_loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        loss, logits = super().local_loss(ctx, x, y)
        if self.params.alpha == 0:
            return loss, logits
        return loss + self.drift_penalty(ctx, self.params.alpha), logits

    def functional_loss(
        self, forward: Forward, params: dict[str, Tensor], inputs: dict[str, dict[str, Tensor]],
        x: Tensor, y: Tensor, weight: Tensor,
    ) -> tuple[Tensor, Tensor]:
        loss, logits = super().functional_loss(forward, params, inputs, x, y, weight)
        if self.params.alpha == 0:
            return loss, logits
        return loss + 0.5 * self.params.alpha * squared_distance(params.items(), inputs["drift_target"]), logits
