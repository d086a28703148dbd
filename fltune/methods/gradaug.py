"""GradAug (Yang, Zhu & Chen, NeurIPS 2020) as a local regulariser (FedAlign §3.2 Eq. 1; docs/methods.md §2).

L = CE(F_θ(x), y) + μ·Σ_{i=1..n} KL( softmax(F_θ(x)).detach() ‖ softmax(F_{θ^{ω_i}}(T_i(x))) )

over n weight-sharing ResNet-56 sub-networks of width ω_1 = ω_b, ω_2..ω_n ~ U(ω_b, 1) (widest first), T_i
a bilinear resize (align_corners) to a size from ``resolutions``; KL ``batchmean``, as
``mmendiet/FedAlign:methods/gradaug.py`` (whose per-term backward gives the same gradient as one sum). Draws
come from torch's global RNG. FedAlign Table 5 retunes μ to 1.5 / 2.0 / 2.25 for n = 1 / 3 / 4.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import Tensor

from fltune.methods import register
from fltune.methods.base import Params
from fltune.methods.fedalign import ResNet56Method
from fltune.methods.objective import Batch


class GradAugParams(Params):
    mu: float = Field(1.75, ge=0, description="weight μ of the sub-network KL terms (n = 2: 1.75)")
    n: int = Field(2, ge=1, description="sub-networks per batch")
    omega_b: float = Field(0.8, gt=0, le=1, description="width ω_b of the narrowest sub-network")
    resolutions: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (32, 28, 24, 20), description="input sizes T_i draws from (CIFAR: 32, 28, 24, 20)"
    )

    @field_validator("resolutions")
    @classmethod
    def _some(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        """After the sizes themselves (a length bound would report a bad size as a missing one)."""
        if not value:
            raise ValueError("at least one input size; allowed: e.g. [32, 28, 24, 20]")
        return value


def sub_widths(n: int, omega_b: float) -> list[float]:
    """ω_1..ω_n, widest first (the GradAug training order)."""
    sampled = omega_b + (1 - omega_b) * torch.rand(n - 1)
    return sorted([omega_b, *sampled.tolist()], reverse=True)


@register
class GradAug(ResNet56Method):
    """GradAug: full-net CE + μ·Σ_i KL(full ‖ width-ω_i net on resized x); server as FedAvg. μ = 0 skips the
    sub-networks and their draws: FedAvg exactly."""

    name = "gradaug"
    Params = GradAugParams
    stored_models = 1.0  # one model: the sub-networks share its weights

    @property
    def passes_per_step(self) -> float:  # type: ignore[override]
        """The full network plus n sub-networks per batch (an upper bound: the sub-networks are narrower)."""
        return 1.0 + self.params.n

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        x, y = batch.x, batch.y
        model = self.resnet(batch)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if self.params.mu == 0:
            return loss, logits
        target = F.softmax(logits.detach(), dim=1)
        sizes = self.params.resolutions
        for width in sub_widths(self.params.n, self.params.omega_b):
            size = sizes[int(torch.randint(len(sizes), ()))]
            resized = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=True)
            sub = F.log_softmax(model.forward_at_width(resized, width), dim=1)
            loss = loss + self.params.mu * F.kl_div(sub, target, reduction="batchmean")
        return loss, logits
