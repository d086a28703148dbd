"""A reproduction job's MLflow runs: the parent ends FINISHED when every run of the job ended, even where one
run scores several cells (MAN: accuracy and rounds-to-target; FedAlign: accuracy, Hessian and costs), and
FAILED, as the command exits 1, when a cell failed or diverged."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from fltune.reproduce.mlflow_runs import ReproLog
from fltune.tune.results import TrialRow, unfinished
from tests.conftest import needs_fmnist
from tests.reproduce.test_papers import man_job  # noqa: F401 (fixture)
from tests.reproduce.test_plan import fmnist_only  # noqa: F401 (fixture)


@needs_fmnist
@pytest.mark.parametrize("last, parent", [("finished", "FINISHED"), ("diverged", "FAILED"), ("failed", "FAILED")])
def test_a_job_whose_runs_all_ended_ends_its_parent_as_the_command(man_job, mlflow_uri, last: str,  # noqa: F811
                                                                   parent: str) -> None:
    """It counted cells (12) where the job runs trials (6): every finished job ended KILLED, as if stopped.
    A job with a lost cell exits 1 (``command.conclude``), and its parent had still ended FINISHED."""
    log = ReproLog(man_job)
    log.setup()  # as Tune opens it
    statuses = ["finished"] * (len(man_job.trials) - 1) + [last]
    rows = [TrialRow(trial_id=f"t{i}", status=status, params={"cell": key}, round=1, objective=math.nan,
                     objective_std=math.nan, metrics={})
            for i, (key, status) in enumerate(zip(man_job.trials, statuses))]
    assert log.expected_trials() == len(man_job.trials) == 6
    log.finish(rows, interrupted=unfinished(rows, log.expected_trials()))  # as on_experiment_end ends a job
    assert MlflowClient(mlflow_uri).get_run(log.parent).info.status == parent
