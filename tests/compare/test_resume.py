"""Stopping a comparison while it tunes (SIGTERM to the process group, as `timeout` and Slurm do; Ctrl-C) and
resuming it: the study continues where it stopped, the cells follow, every MLflow run appears once and ends
FINISHED, and the comparison is as fair and as reported as one never stopped. The extended tier: the suite
stops and resumes a job through signals with ``tune`` (tests/tune/test_resume.py) and resumes a table
(tests/reproduce/test_command.py); a comparison runs its studies and cells as such jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.compare.spec import CompareSpec
from fltune.tune.spec import StudySpec
from tests.compare.test_command import TINY, check_fair_and_reported, runs
from tests.tune.helpers import REPO, finished, rounds_logged, start
from tests.tune.test_resume import run_until


def first_study_concluded(proc: subprocess.Popen, study: Path, timeout: float = 300) -> None:
    """Wait until the first study has written its best configuration: the driver is between two Tune jobs."""
    deadline = time.monotonic() + timeout
    while not (study / "best_config.yaml").is_file():
        assert proc.poll() is None, "the comparison ended before it could be interrupted"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)


def stop(proc: subprocess.Popen, log: Path, group: bool) -> None:
    """SIGTERM to the process group (as `timeout` and Slurm send it: exit 143), or Ctrl-C to the driver (a
    terminal sends it to the group, but Ray's processes block it: exit 130); either way a line to resume with."""
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGINT)
    # Ray gives up on its GCS at 60 s; a driver still running at 45 s writes its threads' stacks to the log
    assert finished(proc, log, timeout=45) == (143 if group else 130), log.read_text()
    said = [line for line in log.read_text().splitlines() if line.startswith("fltune:")]
    assert said and all("cli.py compare --name c" in line and "--resume" in line for line in said), said


@pytest.mark.slow
@pytest.mark.extended
def test_a_comparison_stopped_mid_study_then_between_studies_resumes_finishes_once_and_is_fair(
        ray_session, tmp_path: Path, mlflow_uri: str) -> None:
    """Stopped mid-study, resumed, stopped again between the two studies, resumed to the end: one sequence
    for both moments, and the finished comparison is then held to everything a tuned comparison promises
    (``check_fair_and_reported``): each comparison's start-up costs more than its rounds. Between studies
    the first study's finished ``fit`` had left Tune's SIGINT handler installed: the stop went to it and
    was lost, and the comparison ran on into the next study (after a process-group SIGTERM, into the dying
    GCS: CI saw Ray's core worker end it with status 1 and no resume line)."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "cli.py"), "compare", "--methods", "fedavg,fedprox", *TINY,
           "--rounds", "6", "--tune-budget", "1", "--seeds", "2", "--storage", str(tmp_path), "--name", "c",
           "--out", str(out)]
    first = start(cmd, tmp_path / "1.log")
    run_until(first, tmp_path / "c-tune-fedavg", more=1)
    stop(first, tmp_path / "1.log", group=True)

    second = start([*cmd, "--resume"], tmp_path / "2.log")
    first_study_concluded(second, tmp_path / "c-tune-fedavg")
    stop(second, tmp_path / "2.log", group=False)

    third = start([*cmd, "--resume"], tmp_path / "3.log")
    assert finished(third, tmp_path / "3.log", timeout=400) == 0, (tmp_path / "3.log").read_text()
    check_fair_and_reported(tmp_path, out, " ".join((tmp_path / "3.log").read_text().split()), mlflow_uri, rounds=6)

    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = {r.info.run_name: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert sorted(parents) == ["c", "c-tune-fedavg", "c-tune-fedprox"]
    for name, parent in parents.items():
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(kids) == (4 if name == "c" else 1)  # one trial per study, a cell per method and seed
        for kid in kids:
            assert rounds_logged(mlflow_uri, kid.info.run_id) == list(range(1, 7))  # each round logged once

    # resuming a finished comparison (the newest, without --name) redoes nothing: same table, same runs
    assert main(["compare", "--storage", str(tmp_path), "--resume", "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "compare.csv").read_text() == (out / "compare.csv").read_text()
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == len(runs)


@pytest.mark.slow
@pytest.mark.extended
def test_a_study_whose_trials_all_ended_before_a_stop_concludes_when_the_comparison_resumes(
        ray_session, tmp_path: Path, mlflow_uri: str) -> None:
    """A stop that lands after a study's last trial ended but before the study concluded leaves every trial
    finished, no best configuration and no tuned trees in the comparison's spec (CI's race: the stop meant
    for mid-study came that late). The resumed comparison concludes that study (its ranking, its
    ``best_config.yaml``) from the trials it has, trains nothing again, and goes on; it used to skip the
    study as finished and tune from it without either. A study spec that an older fltune left cut (a stop as
    it wrote it) is written again from the comparison's, as it was."""
    cmd = ["compare", "--methods", "fedavg,fedprox", *TINY, "--tune-budget", "1", "--seeds", "1",
           "--storage", str(tmp_path), "--name", "c", "--out", str(tmp_path / "out")]
    assert main(cmd) == 0
    before = {r.info.run_id: r.info.status for r in runs(mlflow_uri)}
    for study in ("c-tune-fedavg", "c-tune-fedprox"):  # the folders as that stop left them
        (tmp_path / study / "best_config.yaml").unlink()
    spec = CompareSpec.load(str(tmp_path / "c"))
    spec.model_copy(update={"trees": {}}).save()
    cut = tmp_path / "c-tune-fedprox" / "fltune_study.json"  # and a stop as an older fltune saved it: cut
    saved = cut.read_text()
    cut.write_text(saved[:40])

    assert main([*cmd, "--resume"]) == 0
    # written again, the same but for the GPU share, which the study resolves again on the cluster as it starts
    again = StudySpec.load(str(cut.parent))
    assert again == StudySpec.model_validate_json(saved).model_copy(update={"gpus_per_worker": None})
    assert all((tmp_path / study / "best_config.yaml").is_file() for study in ("c-tune-fedavg", "c-tune-fedprox"))
    assert CompareSpec.load(str(tmp_path / "c")).trees == spec.trees
    assert {r.info.run_id: r.info.status for r in runs(mlflow_uri)} == before  # nothing trained or logged again
