"""The curvature probe's work on a worker (``curvature.HessianProbe`` sends it, ``Federation.compute`` runs
it): the seeded probe batches, and the Hessian figures of one model on them (``_hessian``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from fltune.config import HessianConfig
from fltune.data.augment import to_float
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_model_for
from fltune.engine.transfer import load_state
from fltune.engine.rng import derive_seed
from fltune.metrics._hessian import (
    Batch,
    Landscape,
    cross_client_consistency,
    cross_entropy_loss,
    hessian_trace,
    layer_traces,
    top2_landscape,
    top_eigenpairs,
)

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.methods.base import State

T = TypeVar("T")

PROBE_ROUND = -1
"""RNG stream of the probe batches: fixed for the whole run, apart from every training round."""


def probe_batches(data: FederatedData, indices: np.ndarray, hcfg: HessianConfig, seed: int, client: int,
                  device: torch.device) -> list[Batch]:
    """``hcfg.batches`` batches of ``hcfg.batch_size`` drawn once from ``indices`` (no augmentation)."""
    rng = np.random.default_rng(derive_seed(seed, PROBE_ROUND, client))
    take = min(len(indices), hcfg.batches * hcfg.batch_size)
    chosen = torch.tensor(np.sort(rng.choice(indices, size=take, replace=False)), dtype=torch.long)
    return [
        (to_float(data.x[part], data.mean, data.std).to(device), data.y[part].to(device))
        for part in torch.split(chosen, hcfg.batch_size)
    ]


def global_curvature(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> dict[str, float]:
    """λ1 … λk (by magnitude), λ1/λk and the trace of the global model's training-loss Hessian."""
    values, _ = top_eigenpairs(model, cross_entropy_loss, batches, hcfg.top_k, hcfg.max_iter, hcfg.tol, seed)
    out = {f"hessian_lambda_{i + 1}": v for i, v in enumerate(values)}
    out["hessian_lambda_max"] = values[0]
    if len(values) > 1:
        out[f"hessian_lambda_1_over_{len(values)}"] = values[0] / values[-1] if values[-1] else float("inf")
    trace = hessian_trace(model, cross_entropy_loss, batches, hcfg.max_iter, hcfg.trace_tol, seed)
    out["hessian_trace"], out["hessian_trace_se"] = trace.value, trace.se
    return out


def consistency_batches(data: FederatedData, client: int, shared: list[Batch], hcfg: HessianConfig, seed: int,
                        device: torch.device) -> list[Batch]:
    """The batches client ``client``'s model is probed on for H_N/H_D (``metrics.hessian.probe_data``). ``shared``: the
    global model's batches, the same for every client, as the FedAlign authors' ``pyhessian/compute_hessian.py``
    measures every client model on the full training loader (curvature on common data). ``own``: the client's own
    training data, which adds how the clients' data differ."""
    if hcfg.probe_data == "shared":
        return shared
    return probe_batches(data, data.client_train[client], hcfg, seed, client, device)


def client_traces(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> dict[str, float]:
    """A local model's per-layer Hessian traces d_i, the input of H_N and H_D (FedAlign Eq. 3–4)."""
    return layer_traces(model, cross_entropy_loss, batches, hcfg.max_iter, hcfg.trace_tol, seed)


def client_consistency(traces: list[dict[str, float]]) -> dict[str, float]:
    """H_N and H_D (FedAlign Eq. 3–4) from the local models' :func:`client_traces`, in client order."""
    h_n, h_d = cross_client_consistency(traces)
    return {"hessian_hn": h_n, "hessian_hd": h_d}


def global_landscape(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> Landscape:
    """The loss along the global model's top-2 eigenvectors (FedAlign Fig. 1), for the end-of-run PNG."""
    return top2_landscape(model, cross_entropy_loss, batches, seed=seed, max_iter=hcfg.max_iter, tol=hcfg.tol)


@dataclass(frozen=True)
class CurvatureTask(Generic[T]):
    """One piece of a Hessian probe, run on a worker: ``measure`` of the model with weights ``state`` on the
    probe batches (with ``client``, :func:`consistency_batches`'). Batches are drawn there from the run's
    data and seed, so only the weights travel."""

    measure: Callable[[nn.Module, list[Batch], HessianConfig, int], T]
    state: State
    client: int | None = None

    def __call__(self, cfg: ExperimentConfig, data: FederatedData, device: torch.device) -> T:
        hcfg, seed = cfg.metrics.hessian, cfg.federation.seed
        model = build_model_for(cfg, data).to(device)
        load_state(model, self.state)
        batches = probe_batches(data, np.concatenate(data.client_train), hcfg, seed, -1, device)
        if self.client is not None:
            batches = consistency_batches(data, self.client, batches, hcfg, seed, device)
        return self.measure(model, batches, hcfg, seed)
