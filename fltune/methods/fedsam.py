"""FedSAM (Qu et al., 2022; Caldarola et al., 2022; docs/methods.md §2): SAM as the local optimiser.

SAM (Foret et al., 2021) and its FL variants: an ascent gradient g at w picks ε, and the optimiser steps from w with
∇L(w + ε). They differ only in which loss gives g, which parameters move and how ε is scaled, so :class:`FedSAM` writes
the step once (its ``step``) and FedASAM, FedSpeed and FedSOL subclass it (FedASAM and FedSOL change ``epsilon``, FedSOL
also ``ascent``). Both passes run ``self.local_loss``, so a composed modifier (``fedsam+man``) is in both. [U] BatchNorm
running statistics are updated by the first pass only (momentum 0 at w + ε), as in the FedSOL authors' SAM code
(``Lee-Gihun/FedSOL:algorithms/optim_utils.py``, ``disable_running_stats``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pydantic import Field
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fltune.methods import register
from fltune.methods.base import Method, Params
from fltune.methods.objective import Batch, Tensors, global_norm

Named = list[tuple[str, Tensor]]

NORM_EPS = 1e-12
"""Added to ‖·‖ in ε's denominator, so a zero ascent gradient gives ε = 0 (SAM's reference code)."""


class FedSAMParams(Params):
    rho: float = Field(0.05, ge=0, description="SAM radius ρ (MAN §7: 0.05; FedSOL Table 8: 0.1)")


@contextmanager
def bn_statistics_frozen(model: nn.Module) -> Iterator[None]:
    """BatchNorm layers leave their running statistics unchanged."""
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    saved = [m.momentum for m in layers]
    for m in layers:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in zip(layers, saved, strict=True):
            m.momentum = momentum


@register
class FedSAM(Method):
    """FedSAM: step with ∇L(w + ε), ε = ρ·∇L(w)/‖∇L(w)‖, L the local loss; server as FedAvg. ρ = 0 gives
    FedAvg's gradient."""

    name = "fedsam"
    Params = FedSAMParams
    stored_models = 2.0  # the weights w and the perturbation ε (or the saved first gradients)
    passes_per_step = 2.0  # the ascent pass at w and the descent pass at w + ε

    def epsilon(self, named: Named, grads: list[Tensor], global_weights: Mapping[str, Tensor]) -> list[Tensor]:
        """ε of the weights ``named`` from their ascent gradients g: SAM's ρ·g/‖g‖."""
        scale = self.params.rho / (global_norm(grads) + NORM_EPS)
        return [g * scale for g in grads]

    def ascent(self, batch: Batch) -> tuple[Named, list[Tensor], Tensor, Tensor]:
        """(weights to perturb, ascent gradients g, loss and logits at w); SAM: the objective's, every trained weight."""
        grads, loss, logits = batch.loss_gradient(self.local_loss, batch.trained)
        return list(batch.trained.items()), list(grads.values()), loss, logits

    def step(self, batch: Batch) -> tuple[Tensors, Tensor, Tensor]:
        """The gradient at w + ε with BN statistics frozen; the loss and logits are the ascent pass's (at w)."""
        named, grads, loss, logits = self.ascent(batch)
        eps = self.epsilon(named, grads, batch.global_weights) if named else []
        shifted = {**batch.trained, **{n: p + e for (n, p), e in zip(named, eps, strict=True)}}
        with bn_statistics_frozen(batch.forward.model):
            return batch.loss_gradient(self.local_loss, shifted)[0], loss, logits
