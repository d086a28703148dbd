"""The three evaluation protocols (docs/methods.md §0) as round probes.

``global``: the global model on the pooled test set. ``all_model``: the average of every client's latest
local model on the test set (FedDyn's "all-clients" model). ``personalized``: each client's own model on
its own held-out split, averaged over clients (SimFAFL Table 2), and after the last round also with the
head fine-tuned first (``acc_personalized_ft``). Each runs every ``metrics.every`` rounds and at the last.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from fltune.metrics.probe import Probe, RoundView, register

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.federation import Federation
    from fltune.methods.base import State

ACCURACY_KEYS = ("acc_global", "acc_all_model", "acc_personalized", "acc_personalized_ft")


class _Protocol(Probe):
    """An evaluation protocol: measured on evaluation rounds, when ``metrics.protocols`` lists it."""

    clock: ClassVar[str | None] = "eval_s"

    @classmethod
    def enabled(cls, cfg: ExperimentConfig, data: FederatedData) -> bool:
        return cls.protocol in cfg.metrics.protocols

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        if cls.protocol not in cfg.metrics.protocols:
            return (f"needs metrics.protocols to include {cls.protocol}; "
                    f"allowed here: {', '.join(cfg.metrics.protocols)}")
        return None

    def due(self, fed: Federation, view: RoundView) -> bool:
        rounds = fed.cfg.federation.rounds
        return view.running and (view.round % fed.cfg.metrics.every == 0 or view.round == rounds)


@register
class GlobalAccuracy(_Protocol):
    """The global model on the test set."""

    name = "global"
    order = 10
    protocol = "global"
    metrics = {"acc_global": "global model's test accuracy", "loss": "global model's mean test loss"}

    def measure(self, fed: Federation, view: RoundView) -> dict[str, float]:
        acc, loss = fed.evaluate_state(fed.global_state)
        return {"acc_global": acc, "loss": loss}


@register
class AllModelAccuracy(_Protocol):
    """The average of every client's latest local model on the test set."""

    name = "all_model"
    order = 20
    protocol = "all_model"
    metrics = {"acc_all_model": "all-clients average model's test accuracy",
               "loss_all_model": "all-clients average model's mean test loss"}
    keeps_local_models = True

    def measure(self, fed: Federation, view: RoundView) -> dict[str, float]:
        acc, loss = fed.evaluate_state(all_model_state(fed))
        return {"acc_all_model": acc, "loss_all_model": loss}


def all_model_state(fed: Federation) -> State:
    """Average of every client's latest local model (initial model if never sampled), FedDyn-style.

    Weighted by n_k when the method weights its updates by n_k, plain mean otherwise (docs/methods.md §0).
    Summed in client order on the driver, so the result is independent of the worker count.
    """
    initial = fed.initial_state
    by_samples = fed.method.weighted_by_samples
    weights = [float(fed.sizes[c]) if by_samples else 1.0 for c in range(fed.cfg.federation.clients)]
    total = math.fsum(weights)
    acc = {k: np.zeros(v.shape, np.float64) for k, v in initial.items()}
    for cid, weight in enumerate(weights):
        for key, value in fed.latest.get(cid, initial).items():
            acc[key] += weight * value
    return {k: (acc[k] / total).astype(initial[k].dtype) for k in acc}


@register
class PersonalizedAccuracy(_Protocol):
    """Each client's own model on its own held-out split, and after the last round with the head tuned."""

    name = "personalized"
    order = 30
    protocol = "personalized"
    metrics = {
        "acc_personalized": "mean over clients of their own model's accuracy on their held-out split",
        "loss_personalized": "the same clients' mean held-out loss",
        "acc_personalized_ft": "acc_personalized after fine-tuning each head (last round only)",
        "loss_personalized_ft": "loss_personalized after fine-tuning each head (last round only)",
    }

    @classmethod
    def enabled(cls, cfg: ExperimentConfig, data: FederatedData) -> bool:
        """Needs per-client held-out splits (partition.eval_fraction > 0)."""
        return super().enabled(cfg, data) and all(len(idx) > 0 for idx in data.client_eval)

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        unmet = super().unmet(metric, cfg)
        if unmet is None and cfg.partition.eval_fraction == 0:
            return "needs partition.eval_fraction > 0 (per-client held-out data)"
        return unmet

    def measure(self, fed: Federation, view: RoundView) -> dict[str, float]:
        out: dict[str, float] = {}
        out["acc_personalized"], out["loss_personalized"] = fed.evaluate_personalized(finetune=False)
        if view.round == fed.cfg.federation.rounds and fed.cfg.training.finetune_epochs:
            out["acc_personalized_ft"], out["loss_personalized_ft"] = fed.evaluate_personalized(finetune=True)
        return out
