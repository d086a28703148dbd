"""SimFAFL (SimFAFL paper Eq. 8-10; docs/methods.md §2): FedCR's VIB framework with two fixed constraints.

Local objective of client i (Eq. 10), with z_s = μ(x) + σ(x)⊙ε_s, s = 1..S, from the VIB body:

    L = mean_s CE(head_i(z_s), y) + β1·L_ca + β2·L_sa
    L_ca = mean_x KL(q(z|x) ‖ N(0, I))                  (Eq. 8: centroid alignment to a fixed reference)
    L_sa = mean_s CE(head_f(z_s), y)                    (Eq. 9: shape alignment to the global task branch)

head_f is the round's global head (the average of last round's head_i), frozen, so L_sa trains the body
only; each client keeps head_i and uploads it for that average (§3, §4.2). ``kl_order`` is **[U]**.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import ClientContext, ClientResult, Params
from fltune.methods.fedcr import VIBMethod, functional_vib
from fltune.methods.fedper import FedPer
from fltune.methods.objective import Batch
from fltune.models.vib import VIBOutput, gaussian_kl


class SimFAFLParams(Params):
    beta1: float = Field(
        0.0025, ge=0, description="weight β1 of L_ca (Table 2: 0.0025; CIFAR-100 0.003; best FMNIST 0.002)"
    )
    beta2: float = Field(
        0.1, ge=0, description="weight β2 of L_sa (Table 2: 0.1; CIFAR-100 0.2, best 0.3; best EMNIST 0.2)"
    )
    kl_order: Literal["posterior_first", "prior_first"] = Field(
        "posterior_first", description="L_ca as KL(q‖N(0,I)) or KL(N(0,I)‖q) [U]"
    )


def standard_normal_kl(out: VIBOutput, kl_order: str) -> Tensor:
    """L_ca (Eq. 8) per sample: the KL between q(z|x) and N(0, I)."""
    zero, one = torch.zeros_like(out.mu), torch.ones_like(out.sigma)
    if kl_order == "posterior_first":
        return gaussian_kl(out.mu, out.sigma, zero, one)
    return gaussian_kl(zero, one, out.mu, out.sigma)


@register
class SimFAFL(VIBMethod, FedPer):
    """SimFAFL: L = CE(head_i(z), y) + β1·KL(q(z|x) ‖ N(0,I)) + β2·CE(head_f(z), y) (Eq. 10)."""

    name = "simfafl"
    Params = SimFAFLParams
    stored_models = 1.0  # the VIB net only (class centres are small)
    passes_per_step = 1.0

    def setup_client(self, ctx: ClientContext) -> None:
        """head_f: the round's global head."""
        super().setup_client(ctx)
        ctx.inputs["global_head"] = {k: v for k, v in ctx.global_state.items() if k.startswith("head.")}

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        out = functional_vib(batch)
        loss = batch.cross_entropy(out.logits)
        if self.params.beta1:
            loss = loss + self.params.beta1 * batch.mean(standard_normal_kl(out, self.params.kl_order))
        if self.params.beta2:
            head_f = batch.forward.part("head", batch.inputs["global_head"], out.z)
            loss = loss + self.params.beta2 * batch.cross_entropy(head_f)
        return loss, out.logits.mean(0)

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """Body and personal head both go up: the heads' average is next round's head_f (§4.2)."""
        result = super().client_result(ctx)
        result.update.update(result.state["personal"])
        return result
