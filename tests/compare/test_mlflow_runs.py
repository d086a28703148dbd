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
    log.setup()  # as Tune opens it
    cells = list(comparison.cells)
    statuses = ["finished"] * (len(cells) - 1) + [last]
    rows = [TrialRow(trial_id=f"t{i}", status=status, params={"cell": key}, round=1, objective=0.5,
                     objective_std=math.nan, metrics={"acc_global": 0.5})
            for i, (key, status) in enumerate(zip(cells, statuses))]
    log.finish(rows, interrupted=last == "running")
    assert MlflowClient(mlflow_uri).get_run(log.parent).info.status == parent


def test_the_parent_run_names_the_methods_compared_and_logs_each_ones_final_accuracy(tmp_path, mlflow_uri) -> None:
    """Tagged with what it compares (not the first method's ``method``/``seed``), its headline figures
    sortable in the runs table."""
    comparison = spec(tmp_path)
    log = CompareLog(comparison)
    log.setup()  # as Tune opens it
    accuracy = {"fedavg": 0.5, "fedrep": 0.75}
    rows = [TrialRow(trial_id=f"t{i}", status="finished", params={"cell": key}, round=2, objective=0.5,
                     objective_std=math.nan, metrics={"acc_global": accuracy[key.split("/")[0]]})
            for i, key in enumerate(comparison.cells)]
    log.finish(rows, interrupted=False)
    parent = MlflowClient(mlflow_uri).get_run(log.parent)
    assert parent.data.tags["methods"] == "fedavg,fedrep" and parent.data.tags["dataset"] == "synthetic"
    assert "method" not in parent.data.tags and "seed" not in parent.data.tags
    assert parent.data.metrics == {"final_acc_global.fedavg": 0.5, "final_acc_global.fedrep": 0.75}
    assert parent.data.tags["fltune.best"] == "fedrep"
