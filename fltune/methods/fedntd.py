"""FedNTD (Lee et al., 2022; docs/methods.md §2): distil the global model's not-true-class knowledge locally."""

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import ClientContext, Method, Params
from fltune.methods.moon import frozen_copy
from fltune.methods.objective import Batch


class FedNTDParams(Params):
    tau: float = Field(1.0, gt=0, description="softmax temperature τ (FedSOL Table 8: 1.0)")
    beta: float = Field(1.0, ge=0, description="weight β of the not-true distillation term (FedSOL Table 8: 1.0)")


def soft_kl(student_logits: Tensor, teacher_logits: Tensor, tau: float, batch: Batch) -> Tensor:
    """KL(softmax(teacher/τ) ‖ softmax(student/τ)), 'batchmean' (``F.kl_div``'s sum / B) over the batch's real samples."""
    log_student, teacher = F.log_softmax(student_logits / tau, dim=1), F.softmax(teacher_logits / tau, dim=1)
    return batch.real(F.kl_div(log_student, teacher, reduction="none")).sum() / batch.size


def not_true(logits: Tensor, y: Tensor) -> Tensor:
    """z̃ ``[B, C−1]``."""
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)
    return logits[keep].view(len(y), -1)


@register
class FedNTD(Method):
    """FedNTD: L = CE + β·τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃_l/τ)); server as FedAvg. z̃_g from a frozen
    global copy in eval mode, as the FedSOL authors' code. β = 0: exactly CE."""

    name = "fedntd"
    Params = FedNTDParams
    stored_models = 2.0  # the local model and the global teacher
    passes_per_step = 4.0 / 3.0  # + one forward-only pass of the teacher

    def setup_client(self, ctx: ClientContext) -> None:
        super().setup_client(ctx)
        ctx.scratch["global_model"] = frozen_copy(ctx.model, ctx.global_state)

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        x, y = batch.x, batch.y
        loss, logits = super().local_loss(batch)
        if self.params.beta == 0:
            return loss, logits
        with torch.no_grad():
            global_logits = batch.module("global_model")(x)
        tau = self.params.tau
        ntd = tau**2 * soft_kl(not_true(logits, y), not_true(global_logits, y), tau, batch)
        return loss + self.params.beta * ntd, logits
