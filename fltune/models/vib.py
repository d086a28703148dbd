"""FedCR / SimFAFL's variational-information-bottleneck nets and their plain twins (docs/methods.md §1).

The trunks are ``haozzh/FedCR:code_FedCR/models/Nets_VIB.py``: CIFAR conv5×5 3→64, pool, conv5×5 64→64, pool, fc
1600→1024→1024; FMNIST conv 1→4 k5, pool, conv 4→12 k5, pool, fc 192→1024→1024; EMNIST an MLP 784→1024→1024. A VIB body
ends in ``Linear(1024, 2·dimZ)`` giving μ and σ = softplus(σ_raw) of q(z|x) = N(μ, diag σ²); the head maps z to logits.
The plain twins (``fedcr_cnn``/``fedcr_mlp``, the non-VIB baselines) end the trunk in a linear head instead.

Evaluation is exact: the head is affine, so E_ε[head(μ + σ⊙ε)] = head(μ), which FedCR's S-sample test average only
estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fltune.models.base import InShape, SplitModel
from fltune.models.convnets import ConvBlock, plain_net
from fltune.models.registry import register_model

DIM_Z = 512
"""Default width of z (FedCR's ``--dimZ 512``); **[U]** for FMNIST/EMNIST, which no paper states."""
SAMPLES = 18
"""Default Monte-Carlo samples of z per input in training (FedCR's ``--num_avg_train 18``); only the head runs S times."""
HIDDEN = (1024, 1024)
"""The trunk's hidden dense layers, in every FedCR net."""
SIGMA_FLOOR = 1e-8
"""Smallest σ used inside a KL (FedCR clamps σ to 1e-8 before taking logs)."""


@dataclass(frozen=True)
class VIBOutput:
    """One stochastic pass: q(z|x) = N(mu, sigma²) ``[B, dimZ]``, z ``[S, B, dimZ]``, logits ``[S, B, C]``."""

    mu: Tensor
    sigma: Tensor
    z: Tensor
    logits: Tensor


class VIBNet(SplitModel):
    """``head(z)``, z ~ q(z|x) = N(μ(x), diag σ(x)²) with (μ, σ_raw) = ``body(x)``, σ = softplus(σ_raw)."""

    def __init__(self, body: nn.Module, head: nn.Module, dim_z: int, samples: int) -> None:
        super().__init__(body, head, feature_dim=dim_z)
        self.samples = samples

    def sample(self, mu: Tensor, sigma: Tensor, samples: int | None = None) -> Tensor:
        """``samples`` (default S) draws z = μ + σ⊙ε ``[samples, B, dimZ]``, ε ~ N(0, I) from torch's global RNG."""
        shape = (self.samples if samples is None else samples, len(mu), self.feature_dim)
        return mu + sigma * torch.randn(shape, dtype=mu.dtype, device=mu.device)

    def vib(self, x: Tensor, samples: int | None = None) -> VIBOutput:
        """μ, σ, sampled z and their logits: everything a VIB loss needs from one pass."""
        mu, sigma = posterior(self.body(x))
        z = self.sample(mu, sigma, samples)
        return VIBOutput(mu, sigma, z, self.head(z))

    def features_of(self, body_out: Tensor) -> Tensor:
        """Eval: μ, the exact mean of z. Training: the mean of S sampled z."""
        mu, sigma = posterior(body_out)
        return self.sample(mu, sigma).mean(0) if self.training else mu


def posterior(body_out: Tensor) -> tuple[Tensor, Tensor]:
    """(μ, σ = softplus(σ_raw)) from the body's ``[B, 2·dimZ]`` output."""
    mu, sigma_raw = body_out.chunk(2, dim=1)
    return mu, F.softplus(sigma_raw)


def gaussian_kl(mu_q: Tensor, sigma_q: Tensor, mu_p: Tensor, sigma_p: Tensor) -> Tensor:
    """KL(N(μ_q, σ_q²) ‖ N(μ_p, σ_p²)) of diagonal Gaussians summed over the last dimension, in the closed
    form of FedCR's ``KL_between_normals`` (also FedSR's CMI, SimFAFL's L_ca); σ floored at 1e-8."""
    sigma_q, sigma_p = sigma_q.clamp_min(SIGMA_FLOOR), sigma_p.clamp_min(SIGMA_FLOOR)
    terms = torch.log(sigma_p) - torch.log(sigma_q) + (sigma_q**2 + (mu_q - mu_p) ** 2) / (2 * sigma_p**2) - 0.5
    return terms.sum(-1)


def _cnn_convs(in_shape: InShape) -> tuple[ConvBlock, ConvBlock]:
    """FedCR's FMNIST convs (1→4→12) for one-channel inputs, its CIFAR convs (C→64→64) otherwise."""
    c = in_shape[0]
    if c == 1:
        return ConvBlock(1, 4, 5), ConvBlock(4, 12, 5)
    return ConvBlock(c, 64, 5), ConvBlock(64, 64, 5)


def _vib_net(in_shape: InShape, num_classes: int, convs: tuple[ConvBlock, ...], dim_z: int, samples: int) -> VIBNet:
    """The trunk of :func:`plain_net` (its throw-away head dropped, its draws kept) + ``Linear(1024, 2·dimZ)``."""
    body = plain_net(in_shape, 1, convs, HIDDEN).body
    body.add_module("encoder", nn.Linear(HIDDEN[-1], 2 * dim_z))
    return VIBNet(body, nn.Linear(dim_z, num_classes), dim_z, samples)


@register_model("vib_cnn")
def vib_cnn(in_shape: InShape, num_classes: int, dim_z: int = DIM_Z, samples: int = SAMPLES) -> VIBNet:
    """FedCR/SimFAFL's VIB CNN (FMNIST trunk for one channel, CIFAR trunk otherwise)."""
    return _vib_net(in_shape, num_classes, _cnn_convs(in_shape), dim_z, samples)


@register_model("vib_mlp")
def vib_mlp(in_shape: InShape, num_classes: int, dim_z: int = DIM_Z, samples: int = SAMPLES) -> VIBNet:
    """FedCR/SimFAFL's EMNIST VIB MLP: flatten → 1024 → 1024 → 2·dimZ."""
    return _vib_net(in_shape, num_classes, (), dim_z, samples)


@register_model("fedcr_cnn")
def fedcr_cnn(in_shape: InShape, num_classes: int) -> SplitModel:
    """The plain twin of ``vib_cnn`` for the non-VIB baselines of SimFAFL Table 2 (FedCR's ``Nets.py``)."""
    return plain_net(in_shape, num_classes, _cnn_convs(in_shape), HIDDEN)


@register_model("fedcr_mlp")
def fedcr_mlp(in_shape: InShape, num_classes: int) -> SplitModel:
    """The plain twin of ``vib_mlp``: flatten → 1024 → 1024 → classes (FedCR's ``emnist_NN``)."""
    return plain_net(in_shape, num_classes, (), HIDDEN)
