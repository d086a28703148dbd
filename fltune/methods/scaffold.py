"""SCAFFOLD (Karimireddy et al., 2020; docs/methods.md §2): control variates correct each client's drift."""

from dataclasses import replace

from pydantic import Field

from fltune.methods import register
from fltune.methods._drift import ControlVariates, DriftParams
from fltune.methods.base import ServerContext, ServerUpdate, server_step


class ScaffoldParams(DriftParams):
    server_lr: float = Field(1.0, gt=0, description="global step size η_g (1 = plain mean of local models)")


@register
class Scaffold(ControlVariates):
    """SCAFFOLD (option II): local gradient g − c_k + c; c_k⁺ = c_k − c + (θ_g − θ_k)/(K_eff·lr);
    server c += mean over all N of Δc_k, θ = θ_g + η_g·mean_S(θ_k − θ_g). Round 1 is FedAvg's step exactly.
    """

    name = "scaffold"
    Params = ScaffoldParams
    passes_per_step = 1.0  # the correction is added to the gradient, no extra pass

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """η_g = 1: the mean bit for bit."""
        out = super().aggregate(ctx)
        lr = self.params.server_lr
        return replace(out, global_state=server_step(ctx.global_state, out.global_state,
                                                     lambda old, mean: old + lr * (mean - old)))
