"""FedSR (Nguyen, Torr & Lim, NeurIPS 2022; SimFAFL Table 2 "FedSR-FT"): a simple, regularised representation.

A VIB body gives q(z|x) = N(μ, σ²); one sample z = μ + σ⊙ε is classified. Client objective
(``atuannguyen/FedSR:src/methods/FedSR.py``):

    L = CE(head(z), y) + α_L2R·mean_x ‖z‖₂ + α_CMI·mean_x KL(N(C·μ, (C·σ)²) ‖ r(·|y))

r(·|y) = N(r_μ[y], softplus(r_σ[y])²) are learned class Gaussians and C a learned scale: the CMI term
bounds I(Z; X | Y). They stay on each client (the code's ``communicate`` averages only body and
classifier). **[U]** L2R is ‖z‖₂ as the code (``z.norm(dim=1).mean()``), not the paper's squared norm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fltune.methods import register
from fltune.methods.base import Params
from fltune.methods.fedcr import VIBMethod, functional_vib
from fltune.methods.objective import Batch
from fltune.models.vib import VIBNet, VIBOutput, gaussian_kl

REFERENCE_KEYS = ("head.scale", "head.r_mu", "head.r_sigma")


class FedSRParams(Params):
    """Defaults: SimFAFL Table 2's FedSR-FT row as FedCR's README runs it (L2R 0.001, CMI 0.001)."""

    alpha_l2r: float = Field(0.001, ge=0, description="weight of the L2 representation penalty "
                             "(default FedCR's FedSR-FT run, 0.001; FedSR's code 0.01)")
    alpha_cmi: float = Field(0.001, ge=0, description="weight of the CMI regulariser (FedCR's FedSR-FT run, 0.001)")


class ReferenceHead(nn.Module):
    """The VIB net's linear head plus FedSR's class Gaussians r(z|y) and scale C (unused by ``forward``)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self.r_mu = nn.Parameter(torch.zeros(linear.out_features, linear.in_features))
        self.r_sigma = nn.Parameter(torch.ones(linear.out_features, linear.in_features))
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, z: Tensor) -> Tensor:
        return self.linear(z)


def class_kl(out: VIBOutput, y: Tensor, weights: Mapping[str, Tensor]) -> Tensor:
    """Per sample KL(N(C·μ, (C·σ)²) ‖ N(r_μ[y], softplus(r_σ[y])²)): FedSR's ``regCMI`` before its mean."""
    scale, r_mu, r_sigma = (weights[key] for key in REFERENCE_KEYS)
    return gaussian_kl(scale * out.mu, scale * out.sigma, r_mu[y], F.softplus(r_sigma[y]))


@register
class FedSR(VIBMethod):
    """FedSR: L = CE(head(z), y) + α_L2R·‖z‖₂ + α_CMI·KL(N(Cμ, (Cσ)²) ‖ r(·|y)); server unweighted mean."""

    name = "fedsr"
    Params = FedSRParams
    stored_models = 1.0  # the VIB net only (class Gaussians are small)
    passes_per_step = 1.0
    vib_samples = 1  # the code's num_samples=1

    def adapt_model(self, model: nn.Module) -> nn.Module:
        net = cast(VIBNet, super().adapt_model(model))
        net.head = ReferenceHead(net.head)
        return net

    def personal_keys(self, model: nn.Module) -> set[str]:
        return set(REFERENCE_KEYS)

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        out, y = functional_vib(batch), batch.y
        loss = batch.cross_entropy(out.logits[0])
        if self.params.alpha_l2r:
            loss = loss + self.params.alpha_l2r * batch.mean(out.z[0].norm(dim=1))
        if self.params.alpha_cmi:
            loss = loss + self.params.alpha_cmi * batch.mean(class_kl(out, y, batch.weights))
        return loss, out.logits[0]
