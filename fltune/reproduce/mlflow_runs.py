"""A reproduction job in MLflow: a parent run (settings, then ``table.csv`` / ``table.md``) and a child per cell
(config, paper value, per-round curves), reopened by tags on resume."""

from __future__ import annotations

from typing import Any

from fltune.config import ExperimentConfig, build_config
from fltune.reproduce.job import ReproSpec
from fltune.reproduce.report import results, tau_metrics, write_outputs
from fltune.tune.results import TrialRow
from fltune.tune.mlflow_runs import RunTree


class ReproLog(RunTree):
    kind = "reproduce"
    spec: ReproSpec

    def expected_trials(self) -> int:
        return len(self.spec.trials)  # one run may score several cells (job.py: ``trials``)

    def describe_parent(self) -> None:
        spec, table, parent = self.spec, self.spec.paper_table, self.parent
        self.tracker.log_params(parent, {
            "table": spec.table, "scale": spec.scale, "seeds": spec.seeds, "source": table.source,
            "cells_run": len(spec.cells), "cells_no_data": len(spec.missing),
            "scale_note": table.scales[spec.scale].note, "workers_per_trial": spec.workers,
        })
        self.tracker.set_tags(parent, {"fltune.table": spec.table})

    def child(self, trial_id: str, params: dict[str, Any]) -> tuple[str, ExperimentConfig, dict[str, Any]]:
        key = params["cell"]
        cell, run = self.spec.paper_table.cell(key), self.spec.cells[key]
        extra = {"cell": key, "paper_row": cell.row, "paper_column": cell.column, "paper_value": cell.paper,
                 "compared_metric": cell.metric, "substituted": run.substituted or ""}
        shared = self.spec.trials.get(key, [key])
        if len(shared) > 1:  # one run scores several cells (e.g. accuracy and rounds-to-target)
            extra["cells_scored"] = "; ".join(shared)
        return f"{self.spec.name}/{key}", build_config(run.tree), extra

    def finish(self, rows: list[TrialRow], interrupted: bool) -> None:
        res = results(self.spec, rows)
        self.tracker.log_metrics(self.parent, tau_metrics(res))  # the ordering check, per column
        self.end_cells([r.status for r in res], lambda folder: write_outputs(self.spec, res, folder), interrupted)
