"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020; docs/methods.md §2), first-order MAML, as the FedSOL
authors' code runs it (``Lee-Gihun/FedSOL:algorithms/perfedavg/ClientTrainer.py``,
``configs/personalized/perfedavg.json``).

Each local iteration is two optimiser steps on two consecutive batches b1, b2 of the client's stream:

    θ' = θ − α·∇CE(θ; b1)                   step 1 at the round's lr α
    θ  ← θ − β·∇CE(θ'; b2)                  step 2: the gradient taken at θ', applied to θ (restored)

One engine step is one of those optimiser steps, the round one :class:`Phase` of 2·E·⌈n_b/E⌉ steps. docs/methods.md §2
gives where the code departs from the paper (one optimiser for both steps, BN statistics not rolled back).
"""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
from pydantic import Field

from fltune.methods import register
from fltune.methods.base import ClientContext, Method, Params, Phase
from fltune.methods.finetune import FineTune

SAVED = "perfedavg_theta"
"""``ClientContext.scratch`` key of θ, the parameters before an iteration's step 1."""


class PerFedAvgParams(Params):
    """β from the FedSOL authors' config (``configs/personalized/perfedavg.json``)."""

    beta: float = Field(0.01, gt=0, description="meta step size β of step 2; default the FedSOL authors' 0.01 "
                                                "(configs/personalized/perfedavg.json)")


def meta_phase(ctx: ClientContext, loops: int, lr: float | None) -> Phase:
    """``loops`` outer loops of ⌈n_b/E⌉ two-step iterations, as the code counts them (``num_iter =
    ceil(len(loader) / local_epochs)``, E the training's local epochs even when fine-tuning): one phase of
    2·loops·⌈n_b/E⌉ steps. A client with no batch takes no step."""
    n_batches = math.ceil(ctx.num_samples / ctx.batch_size)
    steps = 2 * loops * math.ceil(n_batches / ctx.epochs)
    return Phase(epochs=math.ceil(steps / n_batches) if n_batches else 0, lr=lr, steps=steps)


class FirstOrderMAML(Method):
    """Per-FedAvg's iteration as engine steps: even ``ctx.steps`` (step 1) save θ and step at the phase's lr;
    odd ones (step 2) take the gradient at θ', put θ back and step at β (``ClientContext.step_lr``)."""

    def backward(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1: θ kept, CE's gradient at θ. Step 2: CE's gradient at θ', then θ restored with ``.grad`` left
        in place, as the code's ``old_p.data = new_p.data.clone()`` before ``optimizer.step()``."""
        params = list(ctx.model.parameters())
        if ctx.steps % 2 == 0:
            ctx.scratch[SAVED] = [p.detach().clone() for p in params]
            return super().backward(ctx, x, y)
        loss, logits = super().backward(ctx, x, y)
        with torch.no_grad():
            for p, keep in zip(params, ctx.scratch[SAVED], strict=True):
                p.copy_(keep)
        ctx.step_lr = cast(PerFedAvgParams, self.params).beta
        return loss, logits


class PerFedAvgTune(FirstOrderMAML, FineTune):
    """Per-FedAvg's ``tune`` round, the code's ``finetune``: the two-step iteration for τ =
    ``training.finetune_epochs`` outer loops (2·τ·⌈n_b/E⌉ steps) on plain CE. Every parameter trains, whatever
    ``training.finetune_params``: the code's fine-tuning is its meta step on the whole model."""

    def phases(self, ctx: ClientContext) -> list[Phase]:
        return [meta_phase(ctx, self.epochs, self.lr)]


@register
class PerFedAvg(FirstOrderMAML):
    """Per-FedAvg (first-order MAML): θ ← θ − β·∇CE(θ − α·∇CE(θ; b1); b2) per two-batch iteration; server as FedAvg."""

    name = "perfedavg"
    Params = PerFedAvgParams
    stored_models = 2.0  # the local model and θ, saved at each step 1 for step 2's restore
    passes_per_step = 1.0  # one forward+backward per engine step (an iteration is two steps on two batches)
    tuner: ClassVar[type[FineTune] | None] = PerFedAvgTune

    @classmethod
    def epochs_trained(cls, epochs: int, local_epochs: int) -> float:
        """2·epochs·⌈n_b/E⌉ batches (:func:`meta_phase`): about 2·epochs/E passes."""
        return 2 * epochs / local_epochs

    def phases(self, ctx: ClientContext) -> list[Phase]:
        return [meta_phase(ctx, ctx.epochs, None)]
