"""The scheduled curvature probe (``metrics.hessian``): what a federation measures and when.

λ_max, λ1/λk and tr H of the global model (FedAlign Table 1, MAN Table 2, FedSOL Fig. 8), and H_N/H_D
over k of the round's clients' local models (FedAlign Eq. 3–4), each on a fixed, seeded set of
training batches in eval mode (docs/methods.md §4: the authors use 10 batches; for H_N/H_D by default the
global model's, see :func:`consistency_batches`). At the end, the loss surface along the top-2
eigenvectors and the top-k spectrum as PNGs (FedAlign Fig. 1, MAN Fig. 4a).

Where: the Hessian-vector products run on the client workers (:class:`CurvatureTask`, one per model,
spread over them by ``Federation.compute``), on their device — the GPU a Tune trial's own process lacks —
and the driver only combines the figures (H_N/H_D from the traces) and draws the PNGs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from fltune.config import HessianConfig
from fltune.data.augment import to_float
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_model_for
from fltune.engine.transfer import load_state
from fltune.engine.probes import Probe, RoundView
from fltune.engine.rng import derive_seed
from fltune.metrics.hessian import (
    Batch,
    cross_client_consistency,
    cross_entropy_loss,
    hessian_trace,
    layer_traces,
    top_eigenpairs,
)
from fltune.metrics.landscape import Landscape, plot_spectrum, top2_landscape
from fltune.metrics.probe import register

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.engine.federation import Federation
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
    """The batches client ``client``'s model is probed on for H_N/H_D (``metrics.hessian.probe_data``).

    ``shared``: the global model's batches from the whole training set, the same for every client — the
    FedAlign authors' ``pyhessian/compute_hessian.py`` loads each saved client model and measures it on
    ``get_dataloader(data_dir, …)``'s full training loader, so the figures compare curvature on common
    data. ``own``: batches of the client's own training data, which adds how the clients' data differ.
    """
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
    """One independent piece of a Hessian probe, run on a worker (``Federation.compute``): ``measure`` of
    the model with weights ``state`` on the probe batches — the global model's, or with ``client`` the
    ones :func:`consistency_batches` gives that client's model. The batches are drawn there, from the
    run's data and seed (:func:`probe_batches`), so only the weights travel."""

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


@register
class HessianProbe(Probe):
    """The ``metrics.hessian`` schedule: every ``every`` rounds and/or at the end, on non-diverged rounds."""

    name = "hessian"
    order = 40
    clock = "hessian_s"
    in_wall = False  # a diagnostic: the run's wall_s is what the run costs without it
    metrics = {
        "hessian_lambda_max": "largest Hessian eigenvalue of the global model (FedAlign Table 1, MAN Table 2)",
        "hessian_trace": "Hessian trace of the global model (Hutchinson estimate)",
        "hessian_trace_se": "standard error of that trace estimate (its stop rule: SE/|mean| < trace_tol)",
        "hessian_hn": "H_N over the round's first k clients' local models (FedAlign Eq. 3)",
        "hessian_hd": "H_D over the same models (FedAlign Eq. 4)",
    }

    def __init__(self, fed: Federation) -> None:
        self.keeps_local_models = fed.cfg.metrics.hessian.clients > 0

    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        return bool(cfg.metrics.hessian.every or cfg.metrics.hessian.at_end)

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        hessian = cfg.metrics.hessian
        if not (hessian.every or hessian.at_end):
            return "needs a Hessian probe: metrics.hessian.every > 0 or metrics.hessian.at_end=true"
        if metric in ("hessian_hn", "hessian_hd") and hessian.clients == 0:
            return "needs metrics.hessian.clients ≥ 2 (local models compared)"
        return None

    def due(self, fed: Federation, view: RoundView) -> bool:
        return view.running and fed.cfg.metrics.hessian.due(view.round, fed.cfg.federation.rounds)

    def measure(self, fed: Federation, view: RoundView) -> dict[str, float]:
        return self.curvature(fed, view.round, sorted(view.local_models))

    def summary(self, fed: Federation) -> dict[str, Any]:
        """The last measurement's figures, all from that one round (its ``hessian_s`` too)."""
        rows = [row for row in fed.history if "hessian_lambda_max" in row]
        return {k: v for k, v in rows[-1].items() if k.startswith("hessian_")} if rows else {}

    def curvature(self, fed: Federation, r: int, clients: list[int]) -> dict[str, float]:
        """Hessian metrics of the global model and, over the first k of the round's clients, H_N/H_D:
        computed on the workers, one :class:`CurvatureTask` each, and combined here."""
        hcfg = fed.cfg.metrics.hessian
        compared = clients[: hcfg.clients]
        landscape = r == fed.cfg.federation.rounds and hcfg.landscape
        tasks: list[CurvatureTask] = [
            CurvatureTask(global_curvature, fed.global_state),
            *(CurvatureTask(client_traces, fed.latest[cid], cid) for cid in compared),
            *([CurvatureTask(global_landscape, fed.global_state)] if landscape else []),
        ]
        results = fed.compute(tasks)
        out = results[0]
        if compared:
            out.update(client_consistency(results[1:1 + len(compared)]))
        if landscape:  # the loss along the top-2 eigenvectors and the eigenvalue spectrum, as PNG files
            eigen, title = [out[f"hessian_lambda_{i + 1}"] for i in range(hcfg.top_k)], fed.cfg.method.name
            folder = Path(tempfile.mkdtemp(prefix="fltune-figures-"))
            spectrum = plot_spectrum(eigen, folder / "hessian_spectrum.png", f"top-{len(eigen)} eigenvalues · {title}")
            fed.artifacts += [results[-1].png(folder / "loss_landscape.png", title), spectrum]
        return out
