"""Client-drift bookkeeping shared by FedDyn, FedDC, FedSpeed (h_k) and SCAFFOLD, FedDC (c, c_k); every hook calls
``super()``, so FedDC inherits both. The server's means run over *all* N clients, never-sampled ones counting as zero
(``server_mean``; ``running`` is SCAFFOLD Alg. 1 line 17's c ← c + (1/N)·Σ_S Δc_k). Updates are equally weighted
(docs/methods.md §0). Only parameters drift: buffers are averaged as in FedAvg, as the authors' code flattens
``model.parameters()`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fltune.methods.base import (
    ClientContext, ClientResult, Method, Params, ServerContext, ServerUpdate, effective_steps, held,
)
from fltune.methods.objective import Tensors
from fltune.methods.wire import State, to_device, to_numpy


Sums = tuple[dict[str, np.ndarray], dict[str, np.dtype]]
"""Float64 sums of a state's arrays by name, and each array's own dtype (the mean's)."""
MANY_CLIENTS = 1000
"""Clients in total from which an ``exact`` run hints at ``running`` (once)."""
LOG = logging.getLogger(__name__)


class DriftParams(Params):
    """A method parameter, as it is the method's server arithmetic: the engine stays blind to which methods keep means."""

    server_mean: Literal["exact", "running"] = Field("exact", description=(
        "how the server keeps its mean over all N clients' states (SCAFFOLD's c, FedDyn's h): 'exact' re-sums "
        "every client's state each round (reads grow with N; the reference numbers), 'running' adds the round's "
        "clients' changes to a float64 running sum (the papers' update; opt-in: last bits of the figures may differ)"))


def sum_over_clients(store: Mapping[int, dict[str, Any]], key: str) -> Sums:
    """Σ_k store[k][key] in float64, in client-id order (whichever worker returned first), streamed."""
    total: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    for _, arrays in held(store, key):
        for name, value in arrays.items():
            if name not in total:
                total[name], dtypes[name] = np.zeros(value.shape, np.float64), value.dtype
            total[name] += value
    return total, dtypes


def divided(sums: Sums, num_clients: int) -> State:
    """The sums over N, each back in its array's dtype; {} while no client holds the key."""
    total, dtypes = sums
    return {name: (value / num_clients).astype(dtypes[name]) for name, value in total.items()}


def keep_state(method: Method, ctx: ClientContext, result: ClientResult, key: str, values: dict[str, Tensor]) -> None:
    """The client's new ``key`` state; under ``running`` its prior value goes up too (``key:name``; none is zero)."""
    result.state[key] = to_numpy(values)
    if method.params.server_mean == "running":
        result.upload.update({f"{key}:{name}": value for name, value in (ctx.state.get(key) or {}).items()})


def running_sum(ctx: ServerContext, key: str) -> Sums:
    """Σ_k s_k in float64: the kept sum plus Σ_S (s_k⁺ − s_k) in client-id order, s_k uploaded (zero when absent)."""
    total = {name: value.copy() for name, value in ctx.server_state.get(f"{key}_sum", {}).items()}
    dtypes: dict[str, np.dtype] = {}
    for cid, state in sorted(ctx.aggregate.client_states.items()):
        upload = ctx.aggregate.uploads.get(cid, {})
        for name, value in state.get(key, {}).items():
            if name not in total:
                total[name] = np.zeros(value.shape, np.float64)
            dtypes[name] = value.dtype
            prior = upload.get(f"{key}:{name}")
            total[name] += value.astype(np.float64) - prior if prior is not None else value
    return total, dtypes


@cache
def _hint(method: str) -> None:
    """One line per method and process: the exact mean's reads grow with the clients in total."""
    LOG.warning("%s at %d+ clients: method.server_mean=running keeps the server's mean at O(clients a round) "
                "(opt-in: last bits may differ)", method, MANY_CLIENTS)


def server_mean(method: Method, ctx: ServerContext, key: str) -> tuple[State, dict[str, Any]]:
    """(1/N)·Σ_k s_k for state ``key``, and the server-state entries to keep (the running sum, if any)."""
    if method.params.server_mean == "running":
        sums = running_sum(ctx, key)
        return divided(sums, ctx.num_clients), {f"{key}_sum": sums[0]}
    if ctx.num_clients >= MANY_CLIENTS:
        _hint(method.name)
    return divided(sum_over_clients(ctx.client_store, key), ctx.num_clients), {}


def parameter_tensors(ctx: ClientContext, stored: Mapping[str, np.ndarray | Tensor] | None) -> dict[str, Tensor]:
    """One tensor per model parameter on the device: the stored value (arrays copied once per dtype), or zeros."""
    values = dict(stored or {})
    arrays = {name: value for name, value in values.items() if not isinstance(value, Tensor)}
    values.update(zip(arrays, to_device(list(arrays.values()), ctx.device)))
    return {
        name: values[name] if name in values else torch.zeros_like(p.detach())
        for name, p in ctx.model.named_parameters()
    }


class Drifting(Method):
    """The plain-mean family, whose server keeps a mean over all N clients (``server_mean``); its running sums stay on
    the server."""

    Params = DriftParams
    weighted_by_samples = False
    stored_models = 3.0  # the local model and two model-sized states (θ_g and h_k; c and c_k)

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in super().server_payload(server_state).items() if not key.endswith("_sum")}


class DriftCorrected(Drifting):
    """FedDyn's h_k (FedDC's local drift): h_k ← h_k + (θ_k − θ_g); server θ = mean_S θ_k + mean_all h_k. The input
    ``drift_target`` θ_g − h_k is what (α/2)·‖θ − (θ_g − h_k)‖² pulls towards (FedDyn/FedDC's loss, FedSpeed's gradient)."""

    def setup_client(self, ctx: ClientContext) -> None:
        """Cache θ_g − h_k, the point the drift penalty pulls towards."""
        super().setup_client(ctx)
        h = parameter_tensors(ctx, ctx.state.get("h"))
        ctx.inputs["drift_target"] = {name: ctx.global_state[name] - h[name] for name in h}

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """h_k + θ_k − θ_g = θ_k − (θ_g − h_k)."""
        result = super().client_result(ctx)
        target = ctx.inputs["drift_target"]
        keep_state(self, ctx, result, "h", {name: p - target[name] for name, p in ctx.model.named_parameters()})
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        new = out.global_state
        drift, kept = server_mean(self, ctx, "h")
        return replace(out, global_state={**new, **{name: new[name] + value for name, value in drift.items()}},
                       server_state={**out.server_state, **kept})


class ControlVariates(Drifting):
    """SCAFFOLD's control variates (Karimi et al., 2020, option II), also FedDC's gradient correction (its ⟨θ, c − c_k⟩
    has the same gradient): g − c_k + c; c_k⁺ = c_k − c + (θ_g − θ_k)/(K_eff·lr), K_eff the effective steps as the FedSOL
    authors divide (``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py``, ``adaptive_divison: true``): K alone
    makes c too large under momentum. Server c = mean over all N of c_k, broadcast."""

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
        keep_state(self, ctx, result, "c", {
            name: (ctx.global_state[name] - p) * inv_k_lr - correction[name]
            for name, p in ctx.model.named_parameters()
        })
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        c, kept = server_mean(self, ctx, "c")
        return replace(out, server_state={**out.server_state, "c": c, **kept})
