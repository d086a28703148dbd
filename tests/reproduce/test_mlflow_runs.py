"""A reproduction job's MLflow runs: the parent ends FINISHED when every run of the job ended, even where one
run scores several cells (MAN: accuracy and rounds-to-target; FedAlign: accuracy, Hessian and costs)."""

from __future__ import annotations

import math

from mlflow.tracking import MlflowClient

from fltune.reproduce.mlflow_runs import ReproLog
from fltune.tune.results import TrialRow, unfinished
from tests.conftest import needs_fmnist
from tests.reproduce.test_papers import man_job  # noqa: F401 (fixture)
from tests.reproduce.test_plan import fmnist_only  # noqa: F401 (fixture)


@needs_fmnist
def test_a_job_whose_runs_all_ended_finishes_its_parent(man_job, mlflow_uri) -> None:  # noqa: F811
    """It counted cells (12) where the job runs trials (6): every finished job ended KILLED, as if stopped."""
    log = ReproLog(man_job)
    rows = [TrialRow(trial_id=f"t{i}", status="finished", params={"cell": key}, round=1, objective=math.nan,
                     objective_std=math.nan, metrics={}) for i, key in enumerate(man_job.trials)]
    assert log.expected_trials() == len(man_job.trials) == 6
    log.finish(rows, interrupted=unfinished(rows, log.expected_trials()))  # as MLflowStudyCallback ends a job
    assert MlflowClient(mlflow_uri).get_run(log.parent).info.status == "FINISHED"
