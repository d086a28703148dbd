"""The engine → MLflow bridge for ``cli.py run``: one MLflow run per federation, curves per round."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fltune.config import ExperimentConfig
from fltune.engine.callbacks import Callback
from fltune.tracking.mlflow_log import Tracker, run_tags
from fltune.tracking.plots import curves_png

if TYPE_CHECKING:
    from fltune.engine.federation import Federation


class MLflowCallback(Callback):
    """Params + tags at the start, metrics with ``step=round`` each round, summary + PNG at the end."""

    def __init__(self, cfg: ExperimentConfig, tracker: Tracker | None = None) -> None:
        self.cfg = cfg
        self.tracker = tracker or Tracker(cfg.tracking)
        self.run_id: str | None = None

    def on_start(self, fed: Federation) -> None:
        self.run_id = self.tracker.start(self.cfg.tracking.run_name, run_tags(self.cfg))
        self.tracker.log_config(self.run_id, self.cfg)
        self.tracker.log_metrics(self.run_id, fed.static_costs(), step=0)

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        assert self.run_id is not None
        self.tracker.log_metrics(self.run_id, metrics, step=int(metrics["round"]))

    def on_end(self, fed: Federation, summary: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        summary["mlflow_run_id"] = self.run_id
        final = {f"final_{k}": v for k, v in summary.items() if k not in ("rounds", "status")}
        self.tracker.log_metrics(self.run_id, final, step=summary["rounds"])
        if fed.history:
            with tempfile.TemporaryDirectory() as tmp:
                title = f"{self.cfg.method.name} · {self.cfg.data.dataset} · {self.cfg.partition.kind}"
                self.tracker.log_artifact(self.run_id, curves_png(fed.history, Path(tmp) / "curves.png", title))
        for figure in fed.artifacts:
            self.tracker.log_artifact(self.run_id, figure)
        self.tracker.end(self.run_id, summary["status"])
