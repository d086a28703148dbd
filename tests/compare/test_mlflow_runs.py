"""A comparison's MLflow runs: the parent ends as the command does (FAILED where a cell diverged or failed
and the command exits 1)."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from fltune.compare.mlflow_runs import CompareLog
from fltune.tune.results import TrialRow
from tests.compare.test_report import spec


@pytest.mark.parametrize("last, parent", [("finished", "FINISHED"), ("diverged", "FAILED"), ("failed", "FAILED"),
                                          ("running", "KILLED")])
def test_the_parent_run_ends_as_the_command(tmp_path, mlflow_uri, last: str, parent: str) -> None:
    comparison = spec(tmp_path)
    log = CompareLog(comparison)
    cells = list(comparison.cells)
    statuses = ["finished"] * (len(cells) - 1) + [last]
    rows = [TrialRow(trial_id=f"t{i}", status=status, params={"cell": key}, round=1, objective=0.5,
                     objective_std=math.nan, metrics={"acc_global": 0.5})
            for i, (key, status) in enumerate(zip(cells, statuses))]
    log.finish(rows, interrupted=last == "running")
    assert MlflowClient(mlflow_uri).get_run(log.parent).info.status == parent
