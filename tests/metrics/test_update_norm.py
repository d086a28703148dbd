"""The global update norm ‖w_{t+1} − w_t‖₂: the formula, and the figure a real federation reports."""

from __future__ import annotations

import numpy as np
import pytest

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.callbacks import Callback
from fltune.metrics.update_norm import update_norm


def test_norm_over_the_named_entries_only() -> None:
    before = {"w": np.zeros((2, 2), np.float32), "b": np.array([1.0], np.float32), "bn.running_mean": np.zeros(3)}
    after = {"w": np.array([[3.0, 0.0], [0.0, 0.0]], np.float32), "b": np.array([5.0], np.float32),
             "bn.running_mean": np.full(3, 100.0)}
    assert update_norm(before, after, ["w", "b"]) == 5.0  # √(3² + 4²); the buffer is no step


class GlobalModels(Callback):
    """Keeps the global model after every round."""

    def __init__(self) -> None:
        self.states: list[dict[str, np.ndarray]] = []

    def on_round(self, fed, metrics):
        self.states.append(dict(fed.global_state))


def test_federation_reports_each_rounds_global_step(ray_session) -> None:
    cfg = build_config(overrides=[
        "data.dataset=synthetic", "model.name=mlp", "partition.kind=dirichlet_prior", "federation.clients=4",
        "federation.fraction=0.5", "federation.rounds=3", "training.local_epochs=1", "training.batch_size=32",
        "metrics.protocols=[global]", "resources.workers=1", "tracking.enabled=false",
    ])
    fed = build_federation(cfg)
    kept = GlobalModels()
    try:
        fed.run([kept])
    finally:
        fed.close()
    names = [name for name, _ in fed.eval_model.named_parameters()]
    for before, after, row in zip([fed.initial_state, *kept.states], kept.states, fed.history):
        step = np.concatenate([(after[k].astype(np.float64) - before[k]).ravel() for k in names])
        assert row["global_update_norm"] == pytest.approx(np.linalg.norm(step), rel=1e-12)
        assert row["global_update_norm"] > 0
