"""Ditto (Li, Hu, Beirami & Smith, ICML 2021; docs/methods.md §2, SimFAFL Table 2): a λ-proximal personal model.

Each sampled client runs two independent updates on the same batches: the global model w by FedAvg's step
(uploaded), and its personal model v (kept, never uploaded) by one plain SGD step per batch on
CE(v) + (λ/2)‖v − w_g‖², pulled towards the *received* w_g, so interleaving them is Ditto's Algorithm 1.
Personalised evaluation uses v; the final round is one more Ditto update (FedCR's ``main_fed_ditto.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Literal

from pydantic import Field
from torch import Tensor

from fltune.methods import register
from fltune.methods._initial import InitialStandIn
from fltune.methods.base import ClientContext, ClientResult, Method, Params
from fltune.methods.objective import Batch, Forward, Tensors, clipped, sgd_step
from fltune.methods.wire import to_numpy


class DittoParams(Params):
    lam: float = Field(0.1, ge=0, description="proximal weight λ of the personal model (FedCR's runs: mu 0.1)")
    first_personal: Literal["global", "initial"] = Field(
        "global", description="personal model at a client's first participation: the round's global model or the "
        "initial model (FedCR's code)")


@register
class Ditto(InitialStandIn, Method):
    """Ditto: global w by FedAvg; personal v_k ← v_k − η·∇[CE(v_k) + (λ/2)‖v_k − w_g‖²] per batch."""

    name = "ditto"
    Params = DittoParams
    stored_models = 2.0  # the personal model v_k beside the local copy of the global model
    passes_per_step = 2.0  # both are trained on every batch
    final_round = "own"
    kept, first = "personal", "first_personal"

    def setup_client(self, ctx: ClientContext) -> None:
        """The loaded personal model v aside, its parameters the input ``personal``; w trains from w_g."""
        personal = copy.deepcopy(ctx.model).train()
        if (initial := self.initial_model(ctx)) is not None:
            personal.load_state_dict(dict(initial))
        personal.requires_grad_(True)
        ctx.scratch["personal"] = Forward(personal)
        ctx.inputs["personal"] = {n: p.detach() for n, p in personal.named_parameters()}
        ctx.model.load_state_dict(ctx.global_state)

    def _stepped(
        self, ce_grads: Tensors, personal: Tensors, anchor: Mapping[str, Tensor], lr: float, max_norm: float | None,
    ) -> Tensors:
        """v after one SGD step on ∇[CE(v) + (λ/2)‖v − w_g‖²] (Ditto Eq. 2), λ(v − w_g) in closed form (autograd's
        bits). ``max_norm`` clips as FedCR's ``distributed_training_utils_ditto.py``: ∇CE − λ·w_g bounded, then λ·v
        added back; its rounding of η·∇ before the subtraction is kept by a step at rate 1 on η·∇."""
        lam = self.params.lam
        direction = ce_grads if lam == 0 else {n: g + lam * (personal[n] - anchor[n]) for n, g in ce_grads.items()}
        if max_norm is not None:
            bounded = clipped({n: d - lam * personal[n] for n, d in direction.items()}, max_norm)
            direction = {n: b + lam * personal[n] for n, b in bounded.items()}
        return sgd_step(personal, {n: lr * d for n, d in direction.items()}, 1.0)[0]

    def step(self, batch: Batch) -> tuple[Tensors, Tensor, Tensor]:
        """FedAvg's gradient for w; v after one plain SGD step on CE, whatever modifier w's objective takes on."""
        step = super().step(batch)
        personal, v = batch.model("personal"), batch.inputs["personal"]
        grads, _, _ = batch.gradient(lambda w: (batch.cross_entropy(personal(w, batch.x)), ()), v)
        batch.keep("personal", self._stepped(grads, v, batch.global_weights, batch.lr, batch.grad_clip))
        return step

    def client_result(self, ctx: ClientContext) -> ClientResult:
        result = super().client_result(ctx)
        result.state["personal"] = to_numpy(ctx.scratch["personal"].model.state_dict())
        return result
