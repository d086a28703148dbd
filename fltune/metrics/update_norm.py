"""The global update's norm ‖w_{t+1} − w_t‖₂ of each round. Why: it shows a method's effective server step (FedNova's
normalisation, FedDyn's and SCAFFOLD's corrections, server momentum) and its settling, apart from accuracy. Trainable
parameters only: BN statistics are no step."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from fltune.engine.probes import Probe, RoundView, RunView
from fltune.metrics.probe import register


def update_norm(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], names: Iterable[str]) -> float:
    """‖after − before‖₂ over the entries ``names``, summed in float64."""
    return math.sqrt(math.fsum(float(np.sum((after[k].astype(np.float64) - before[k]) ** 2)) for k in names))


@register
class UpdateNorm(Probe):
    """Every round that did not diverge."""

    name = "update_norm"
    order = 50
    metrics = {"global_update_norm": "‖w_{t+1} − w_t‖₂ of the global model's trainable parameters"}

    def __init__(self, run: RunView) -> None:
        self.names = [name for name, _ in run.model.named_parameters()]

    def measure(self, view: RoundView) -> dict[str, float]:
        return {"global_update_norm": update_norm(view.inputs.global_state, view.global_state, self.names)}
