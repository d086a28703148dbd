"""Client-drift bookkeeping shared by FedDyn, FedDC, FedSpeed (h_k) and SCAFFOLD, FedDC (c, c_k).

Nothing is registered here. Both bases keep their per-client variables in the client's state (numpy, via
``ctx.state``/``ClientResult.state``) and their server variables in ``server_state``. Every hook they
override calls ``super()``, so FedDC = FedDyn's drift + SCAFFOLD's control variates by inheriting both.

Both servers need means over *all* N clients (never-sampled ones count as zero), read from the engine's
client store; :func:`mean_over_clients` sums in client-id order, streaming the states from the store, so the result does not depend on which
worker returned which client first. Server and upload use the plain mean over the round's clients
(``weighted_by_samples = False``, docs/methods.md §0). Only parameters drift: buffers (BN statistics) are
averaged as in FedAvg, as in the authors' code, which flattens ``model.parameters()`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fltune.methods.base import (
    ClientContext, ClientResult, Method, ServerContext, ServerUpdate, effective_steps, held,
)
from fltune.methods.objective import Tensors
from fltune.methods.wire import State, to_device, to_numpy


def mean_over_clients(store: Mapping[int, dict[str, Any]], key: str, num_clients: int) -> State:
    """(1/N)·Σ_k store[k][key] over all N clients, summed in float64 in client-id order one client at a time
    (``held``: the store streams them); {} while no client holds ``key`` yet."""
    total: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    for index, (_, arrays) in enumerate(held(store, key)):
        if index == 0:
            total = {name: np.zeros(value.shape, np.float64) for name, value in arrays.items()}
            dtypes = {name: value.dtype for name, value in arrays.items()}
        for name, value in arrays.items():
            total[name] += value
    return {name: (value / num_clients).astype(dtypes[name]) for name, value in total.items()}


def parameter_tensors(ctx: ClientContext, stored: Mapping[str, np.ndarray | Tensor] | None) -> dict[str, Tensor]:
    """One tensor per model parameter on the training device: the stored value, or zeros before any. Stored
    arrays (the client's own h_k or c_k) go over together, one copy per dtype (``to_device``), not one a
    parameter; tensors (the round's shared ``ctx.server_tensors``) are taken as they are."""
    values = dict(stored or {})
    arrays = {name: value for name, value in values.items() if not isinstance(value, Tensor)}
    values.update(zip(arrays, to_device(list(arrays.values()), ctx.device)))
    return {
        name: values[name] if name in values else torch.zeros_like(p.detach())
        for name, p in ctx.model.named_parameters()
    }


class DriftCorrected(Method):
    """FedDyn's h_k (FedDC's local drift): h_k ← h_k + (θ_k − θ_g); server θ = mean_S θ_k + mean_all h_k.

    Clients keep h_k in ``state["h"]``; θ_g − h_k is the client's input ``drift_target``, the point the local
    penalty (α/2)·‖θ − (θ_g − h_k)‖² pulls towards: FedDyn/FedDC add it to the loss, FedSpeed adds its gradient
    after the SAM step.
    """

    weighted_by_samples = False
    stored_models = 3.0  # the local model, the global model θ_g and h_k

    def setup_client(self, ctx: ClientContext) -> None:
        """Cache θ_g − h_k, the point the drift penalty pulls towards."""
        super().setup_client(ctx)
        h = parameter_tensors(ctx, ctx.state.get("h"))
        ctx.inputs["drift_target"] = {name: ctx.global_param(name) - h[name] for name in h}

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """h_k + θ_k − θ_g = θ_k − (θ_g − h_k)."""
        result = super().client_result(ctx)
        target = ctx.inputs["drift_target"]
        result.state["h"] = to_numpy({name: p - target[name] for name, p in ctx.model.named_parameters()})
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        new = out.global_state
        drift = mean_over_clients(ctx.client_store, "h", ctx.num_clients)
        return replace(out, global_state={**new, **{name: new[name] + value for name, value in drift.items()}})


class ControlVariates(Method):
    """SCAFFOLD's control variates (Karimi et al., 2020, option II), also FedDC's gradient correction.

    Local gradient g − c_k + c (:meth:`gradient_correction`; FedDC writes it as the loss term ⟨θ, c − c_k⟩:
    same gradient);
    c_k⁺ = c_k − c + (θ_g − θ_k)/(K_eff·lr) with lr = this round's ``ctx.lr`` (``correction_lr``) and K_eff the
    :func:`~fltune.methods.base.effective_steps` of the ``ctx.steps`` local steps: K for plain SGD,
    [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ) under momentum ρ, as the FedSOL authors' Scaffold divides
    (``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py``, ``adaptive_divison: true`` in
    ``configs/baselines/scaffold.json``). Dividing by K alone makes c ~8× too large at K = 50, ρ = 0.9,
    and the corrected local steps over-shoot. Server c = mean over all N of c_k, i.e. c += (1/N)·Σ_S Δc_k.
    Clients keep c_k in ``state["c"]``; c is kept in ``server_state["c"]`` and broadcast.
    """

    weighted_by_samples = False
    stored_models = 3.0  # the local model, c and c_k

    def setup_client(self, ctx: ClientContext) -> None:
        """Cache c − c_k, the correction added to every gradient."""
        super().setup_client(ctx)
        c = parameter_tensors(ctx, ctx.server_tensors.get("c"))
        c_k = parameter_tensors(ctx, ctx.state.get("c"))
        ctx.inputs["correction"] = {name: c[name] - c_k[name] for name in c}

    def gradient_correction(self, weights: Mapping[str, Tensor], inputs: Mapping[str, Tensors]) -> Tensors:
        return inputs["correction"]

    def correction_lr(self, ctx: ClientContext) -> float:
        """The lr in c_k⁺'s divisor: the round's, the lr its local steps took (SCAFFOLD)."""
        return ctx.lr

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """c_k⁺ = (θ_g − θ_k)/(K_eff·lr) − (c − c_k); K_eff ≥ 1 guards a client stopped before its first step."""
        result = super().client_result(ctx)
        correction = ctx.inputs["correction"]
        k_eff = max(effective_steps(ctx.steps, ctx.momentum, ctx.nesterov), 1.0)
        inv_k_lr = 1.0 / (k_eff * self.correction_lr(ctx))
        result.state["c"] = to_numpy({
            name: (ctx.global_param(name) - p) * inv_k_lr - correction[name]
            for name, p in ctx.model.named_parameters()
        })
        return result

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        payload = super().server_payload(server_state)
        if "c" in server_state:
            payload["c"] = server_state["c"]
        return payload

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        c = mean_over_clients(ctx.client_store, "c", ctx.num_clients)
        return replace(out, server_state={**out.server_state, "c": c})
