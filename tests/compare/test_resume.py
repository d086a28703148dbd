"""Stopping a comparison mid-tuning (SIGTERM to the process group, as `timeout` and Slurm do) and resuming it:
the study continues where it stopped, the cells follow, every MLflow run appears once and ends FINISHED."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.compare.test_command import TINY
from tests.tune.helpers import REPO, rounds_logged, start
from tests.tune.test_resume import run_until


@pytest.mark.slow
def test_a_comparison_stopped_while_tuning_resumes_and_finishes_once(tmp_path: Path, mlflow_uri: str) -> None:
    cmd = [sys.executable, str(REPO / "cli.py"), "compare", "--methods", "fedavg,fedprox", *TINY,
           "--rounds", "4", "--tune-budget", "1", "--seeds", "1", "--storage", str(tmp_path), "--name", "c",
           "--out", str(tmp_path / "out")]
    first = start(cmd, tmp_path / "1.log")
    run_until(first, tmp_path / "c-tune-fedavg", more=1)  # mid-way through the first study
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(timeout=120) == 143, (tmp_path / "1.log").read_text()
    said = [line for line in (tmp_path / "1.log").read_text().splitlines() if line.startswith("fltune:")]
    assert said and all("python cli.py compare --name c" in line and "--resume" in line for line in said), said

    second = start([*cmd, "--resume"], tmp_path / "2.log")
    assert second.wait(timeout=600) == 0, (tmp_path / "2.log").read_text()
    assert (tmp_path / "out" / "compare.csv").is_file()

    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert all(r.info.status == "FINISHED" for r in runs)
    parents = {r.info.run_name: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert sorted(parents) == ["c", "c-tune-fedavg", "c-tune-fedprox"]
    for name, parent in parents.items():
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(kids) == (2 if name == "c" else 1)  # one trial per study, one cell per method
        for kid in kids:
            assert rounds_logged(mlflow_uri, kid.info.run_id) == [1, 2, 3, 4]  # each round logged once
