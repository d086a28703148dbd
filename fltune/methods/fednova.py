"""FedNova (Wang et al., 2020; docs/methods.md §2): normalise each client's update by its local step count."""

from dataclasses import replace

import numpy as np

from fltune.methods import register
from fltune.methods.base import (
    ClientContext, ClientResult, Method, ServerContext, ServerUpdate, effective_steps, server_step,
)
from fltune.methods.wire import to_numpy

NORMALISER = "fednova.a"
"""Upload key of a_k, so the engine's n_k-weighted mean yields Σ p_k a_k beside Σ p_k d_k."""


@register
class FedNova(Method):
    """FedNova: clients upload d_k = (θ_g − θ_k)/a_k; server θ = θ_g − (Σ p_k a_k)·Σ p_k d_k, p_k = n_k/Σ n.
    a_k = :func:`effective_steps` (``Lee-Gihun/FedSOL:algorithms/fednova/Server.py``). [U] Every float entry is
    normalised (BN statistics too, as that server); integer counters are averaged. Equal a_k give FedAvg."""

    name = "fednova"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """max(a_k, 1) for a client stopped before its first step."""
        result = super().client_result(ctx)
        a_k = effective_steps(ctx.steps, ctx.momentum, ctx.nesterov)
        state = ctx.model.state_dict()
        floats = [name for name in result.update if state[name].is_floating_point()]
        d_k = to_numpy({name: (ctx.global_state[name] - state[name]) / max(a_k, 1.0) for name in floats})
        result.update = {**result.update, **d_k, NORMALISER: np.array(a_k)}
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        mean = dict(ctx.aggregate.mean)
        tau_eff = float(mean.pop(NORMALISER))
        stepped = server_step(ctx.global_state, mean, lambda old, d: old - tau_eff * d)
        return replace(super().aggregate(ctx), global_state=stepped)
