"""FedAlign (Mendieta et al., CVPR 2022; Eq. 5-7, Alg. 1; docs/methods.md §2): Lipschitz-aligned last block.

One full-width pass gives x2 = f_{θ_{L-1}}, x3 = f_{θ_L} and the logits; the student re-runs block L (stage 3)
at width ω_S on the first slim(C2, ω_S) channels of x2.detach(), giving x3_S. Transmitting matrices (Eq. 6-7,
Appendix E, after Shang et al. 2021):

    TM(f1, f2) = f1' · f2ᵀ / HW,  f1' = f1 average-pooled to f2's H×W, both flattened to C×HW   (B×C1×C2)
    X_F = TM(x2, x3) (teacher, detached),  X_S = TM(x2[:, :slim(C2, ω_S)], x3_S)

K = ‖X‖_SN per sample by 10 power iterations on X·Xᵀ from v = 1 (λ = sqrt(‖X Xᵀ v‖)), and

    L_FA = CE(F_θ(x), y) + μ·L_Lip,  L_Lip = MSE(K_S, K_F)                                      (Eq. 5)

**[U] rescale** (default on): Appendix E and ``mmendiet/FedAlign:methods/fedalign.py`` multiply L_Lip by
the constant CE/L_Lip (no gradient through it): value μ·CE, gradient μ·(CE/L_Lip)·∇L_Lip. Off = Eq. 5.

The paper's gradient clip at norm 10 is ``training.grad_clip``, not this method's. Needs ResNet-56, as do StochDepth
and GradAug (FedAlign §3.2, §4), built on its width-ω and stochastic-depth API: :class:`ResNet56Method`, whose
``model.name: auto`` resolves to ``resnet56``, any other failing once.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fltune.methods import register
from fltune.methods.base import Method, Params
from fltune.methods.objective import Batch
from fltune.models.resnet56 import ResNet56

POWER_ITERATIONS = 10
"""Power-iteration steps per Lipschitz estimate (``top_eigenvalue`` in the authors' code)."""


class FedAlignParams(Params):
    mu: float = Field(0.45, ge=0, description="weight μ of the Lipschitz alignment term (paper: 0.45)")
    omega_s: float = Field(0.25, gt=0, le=1, description="width ω_S of the student block L (paper: 0.25)")
    rescale: bool = Field(True, description="[U] scale L_Lip by CE/L_Lip as the authors' code (value μ·CE)")


def transmitting_matrix(f1: Tensor, f2: Tensor) -> Tensor:
    """TM(f1, f2), ``[B, C1, C2]`` (Eq. 6-7)."""
    f1 = F.adaptive_avg_pool2d(f1, f2.shape[-2:])
    height, width = f2.shape[-2:]
    return torch.bmm(f1.flatten(2), f2.flatten(2).transpose(1, 2)) / (height * width)


def spectral_norm(tm: Tensor, steps: int = POWER_ITERATIONS) -> Tensor:
    """K = ‖TM‖_SN per sample; v = 1 overlaps the Perron vector well, as post-ReLU maps make TM non-negative."""
    k = torch.bmm(tm, tm.transpose(1, 2))
    v = torch.ones(k.shape[0], k.shape[1], 1, dtype=k.dtype, device=k.device)
    for _ in range(steps):
        kv = torch.bmm(k, v)
        norm = kv.norm(dim=1, keepdim=True)
        v = kv / norm
    return norm.sqrt().flatten()


def lipschitz_loss(model: ResNet56, x2: Tensor, x3: Tensor, omega_s: float) -> Tensor:
    """L_Lip: its gradient reaches stage 3 only, through the width-ω_S student (Alg. 1)."""
    x2, x3 = x2.detach(), x3.detach()
    x2_s, x3_s = model.stage3_at_width(x2, omega_s)
    with torch.no_grad():
        teacher = spectral_norm(transmitting_matrix(x2, x3))
    return F.mse_loss(spectral_norm(transmitting_matrix(x2_s, x3_s)), teacher)


class ResNet56Method(Method):
    """A method whose local objective needs :class:`~fltune.models.resnet56.ResNet56`."""

    default_model = "resnet56"

    def adapt_model(self, model: nn.Module) -> ResNet56:
        return self.require_model(model, ResNet56, "ResNet-56's slimmable stages", "auto, resnet56")

    @staticmethod
    def resnet(batch: Batch) -> ResNet56:
        """The client's model, checked by ``adapt_model``."""
        return cast(ResNet56, batch.module())


@register
class FedAlign(ResNet56Method):
    """FedAlign: L = CE + μ·[CE/L_Lip]·MSE(K_S, K_F) ([·] with ``rescale``); server as FedAvg; μ = 0: FedAvg."""

    name = "fedalign"
    Params = FedAlignParams
    stored_models = 1.0  # one model: the reduced-width pass runs on the same weights
    passes_per_step = 1.0  # the full-width pass; the width-reduced one is counted in FLOPs by the workers

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        x, y = batch.x, batch.y
        model = self.resnet(batch)
        x2, x3, logits = model.feature_maps(x)
        ce = F.cross_entropy(logits, y)
        if self.params.mu == 0:
            return ce, logits
        lip = lipschitz_loss(model, x2, x3, self.params.omega_s)
        return ce + self.lipschitz_weight(ce, lip) * lip, logits

    def lipschitz_weight(self, ce: Tensor, lip: Tensor) -> float:
        """μ, times the constant CE/L_Lip when rescaling (0 if L_Lip = 0)."""
        if not self.params.rescale:
            return self.params.mu
        lip_value = lip.item()
        return self.params.mu * ce.item() / lip_value if lip_value > 0 else 0.0
