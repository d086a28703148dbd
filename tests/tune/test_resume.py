"""Killing the driver mid-study (SIGTERM, then SIGKILL) and resuming: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from ray.tune import ExperimentAnalysis

from tests.tune.helpers import STALE_CLASS, finished, rounds_logged, start, study_runs, tune_command, write_space

ROUNDS = 3


def reported(study: Path) -> int:
    """Rounds reported so far by all trials (Tune appends one line per result, old checkpoints go)."""
    return sum(len(f.read_text().splitlines()) for f in study.glob("run_trial_*/result.json"))


def rounds_reported(study: Path) -> list[int]:
    """The rounds a one-trial study reported, in order; a resumed trial appends to its ``result.json``."""
    (result,) = study.glob("run_trial_*/result.json")
    return [int(json.loads(line)["round"]) for line in result.read_text().splitlines()]


def wait_for_saved_checkpoint(study: Path, timeout: float = 120) -> None:
    """Wait until the job's saved state names a trial checkpoint. Tune saves its state on its own cadence, so a
    driver killed just after a round's report may resume from the checkpoint before it; one killed before any
    saved state named a checkpoint would start from round 1."""
    deadline = time.monotonic() + timeout
    while not any(trial.checkpoint for trial in ExperimentAnalysis(str(study)).trials):
        assert time.monotonic() < deadline, "no checkpoint in the saved state"
        time.sleep(0.5)


def run_until(proc: subprocess.Popen, study: Path, more: int, timeout: float = 300) -> None:
    """Wait until ``more`` new rounds are reported (the study is mid-way), failing if it ends first."""
    target = reported(study) + more
    deadline = time.monotonic() + timeout
    while reported(study) < target:
        assert proc.poll() is None, "the study ended before it could be interrupted"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.5)


def resumed_to_the_end(cmd: list[str], study: Path, log: Path, mlflow_uri: str, trials: int) -> None:
    """``--resume`` ends the study: each of its ``trials`` at its last round, quietly, the parent run FINISHED and each
    child run FINISHED with every round logged once."""
    resumed = start([*cmd, "--resume"], log)
    assert finished(resumed, log, timeout=400) == 0, log.read_text()
    quiet = log.read_text()  # no library chatter, no tracebacks of stopped workers
    assert not any(m in quiet for m in ("Token authentication", "Restored on", "Checkpoint successfully", "Traceback",
                                        "SystemExit"))
    ended = ExperimentAnalysis(str(study)).trials
    trial_ids = sorted(t.trial_id for t in ended)
    assert len(trial_ids) == trials and all(t.last_result["round"] == ROUNDS for t in ended)
    parent, children = study_runs(mlflow_uri)
    assert parent.info.status == "FINISHED"
    assert sorted(c.data.tags["fltune.trial_id"] for c in children) == trial_ids
    for child in children:
        assert child.info.status == "FINISHED"
        assert rounds_logged(mlflow_uri, child.info.run_id) == list(range(1, ROUNDS + 1))


@pytest.mark.slow
def test_a_study_stopped_by_sigterm_resumes_exactly_once(tmp_path: Path, mlflow_uri: str) -> None:
    space = write_space(tmp_path, num_samples=2, max_concurrent=2)
    study = tmp_path / "study"
    cmd = tune_command(space, tmp_path, "--set", f"federation.rounds={ROUNDS}")

    first = start(cmd, tmp_path / "1.log")
    run_until(first, study, more=1)
    # `timeout`, Slurm and Kubernetes send SIGTERM; it takes the Ctrl-C path (SIGINT → 130), exiting 143.
    # Its Ray dies too: a driver still there 45 s later is stuck, and its threads' stacks say where (a minute
    # after the GCS went, Ray's core worker would end it with status 1, telling nothing)
    os.killpg(first.pid, signal.SIGTERM)
    assert finished(first, tmp_path / "1.log", timeout=45) == 143, (tmp_path / "1.log").read_text()
    lines = (tmp_path / "1.log").read_text().splitlines()  # the whole output: fltune's line is its last
    said = [line for line in lines if "fltune:" in line]
    assert len(said) == 1 and "--resume" in said[0] and lines[-1] == said[0], lines[-10:]
    assert not any(m in line for line in lines for m in ("***", "Traceback", "SystemExit", "raylet", "core_worker"))
    parent, _ = study_runs(mlflow_uri)
    assert parent.info.status == "KILLED"
    resumed_to_the_end(cmd, study, tmp_path / "2.log", mlflow_uri, trials=2)


@pytest.mark.slow
@pytest.mark.extended
def test_a_study_stopped_in_its_confirmation_ends_its_parent_killed_then_resumes(tmp_path: Path,
                                                                                 mlflow_uri: str) -> None:
    """The parent run ends with the search; a stop in the confirmation after it must still leave it KILLED, as the
    command exits (143), not FINISHED; ``--resume`` finishes the confirmation and the parent."""
    space = write_space(tmp_path, num_samples=1, confirm={"top": 1, "seeds": 2})
    cmd = tune_command(space, tmp_path, "--set", "federation.rounds=12")  # a confirmation long enough to stop
    first = start(cmd, tmp_path / "1.log")
    deadline = time.monotonic() + 300
    while "confirming the top" not in (tmp_path / "1.log").read_text():
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "1.log").read_text()
        time.sleep(0.5)
    time.sleep(2)
    os.killpg(first.pid, signal.SIGTERM)
    assert finished(first, tmp_path / "1.log", timeout=45) == 143, (tmp_path / "1.log").read_text()
    parent, _ = study_runs(mlflow_uri)
    assert parent.info.status == "KILLED", (tmp_path / "1.log").read_text()
    assert finished(start([*cmd, "--resume"], tmp_path / "2.log"), tmp_path / "2.log", timeout=400) == 0
    parent, runs = study_runs(mlflow_uri)
    assert parent.info.status == "FINISHED"
    assert sorted((r.data.tags["fltune.kind"], r.info.status) for r in runs) == [
        ("confirmation", "FINISHED"), ("confirmation", "FINISHED"), ("trial", "FINISHED")]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("saved", [b"", STALE_CLASS], ids=["cut", "older_fltune"])
def test_a_killed_driver_whose_tuner_file_was_cut_resumes_exactly_once(tmp_path: Path, mlflow_uri: str,
                                                                      saved: bytes) -> None:
    """SIGKILL to the driver alone (its Ray processes share its fate), then the saved Tuner emptied (what such a
    kill mid-copy left before job folders were written whole, ray-project/ray#58179) or naming a class an older
    fltune had: it is rewritten from the study's spec."""
    space = write_space(tmp_path, num_samples=3, max_concurrent=2)
    study = tmp_path / "study"
    cmd = tune_command(space, tmp_path, "--set", f"federation.rounds={ROUNDS}")
    first = start(cmd, tmp_path / "1.log")
    run_until(first, study, more=1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    (study / "tuner.pkl").write_bytes(saved)
    resumed_to_the_end(cmd, study, tmp_path / "2.log", mlflow_uri, trials=3)  # one never started before the kill


@pytest.mark.slow
@pytest.mark.extended
def test_a_stopped_driver_whose_store_is_locked_still_ends_with_its_line(tmp_path: Path, mlflow_uri: str) -> None:
    """A process-group SIGTERM while another process holds the MLflow store: the last resort's clean-up waits
    on the lock, and used to hold the driver until Ray's core worker ended it a minute later (status 1, no
    line: a CI run). Now it ends within ``CLEAN_UP_S`` with its status and the line that resumes it."""
    space = write_space(tmp_path, num_samples=3, max_concurrent=2)
    study = tmp_path / "study"
    proc = start(tune_command(space, tmp_path, "--set", f"federation.rounds={ROUNDS}"), tmp_path / "1.log")
    run_until(proc, study, more=1)
    store = sqlite3.connect(tmp_path / "mlflow.db", timeout=60, isolation_level=None)
    store.execute("BEGIN EXCLUSIVE")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        assert finished(proc, tmp_path / "1.log", timeout=45) == 143, (tmp_path / "1.log").read_text()
    finally:
        store.execute("ROLLBACK")
    said = [line for line in (tmp_path / "1.log").read_text().splitlines() if "fltune:" in line]
    assert len(said) == 1 and "RUNNING" in said[0] and said[0].endswith("--resume"), said


@pytest.mark.slow
@pytest.mark.extended
def test_sigterm_to_the_driver_alone_stops_the_study_gracefully(tmp_path: Path, mlflow_uri: str) -> None:
    """``kill PID`` / Kubernetes: Ray stays up, so Tune's own graceful stop runs (trials checkpointed,
    the ranking so far printed) and the exit status is still 143."""
    space = write_space(tmp_path, num_samples=2, max_concurrent=2)
    study = tmp_path / "study"
    # rounds enough that no trial can finish between the first report and the signal on a fast machine
    proc = start(tune_command(space, tmp_path, "--set", "federation.rounds=100"), tmp_path / "1.log")
    run_until(proc, study, more=1)
    proc.send_signal(signal.SIGTERM)
    log = (tmp_path / "1.log").read_text
    assert proc.wait(timeout=300) == 143, log()
    text = log()  # the hint may wrap: the terminal's width
    assert text.count("fltune:") == 1 and "--resume" in text.split("fltune: study interrupted")[1], text
    noise = [m for m in ("***", "Traceback", "SystemExit", "Stop signal", "Tuner.restore") if m in log()]
    assert not noise, (noise, log())
    parent, children = study_runs(mlflow_uri)
    assert parent.info.status == "KILLED" and all(c.info.status != "RUNNING" for c in children)


@pytest.mark.slow
@pytest.mark.extended
def test_a_study_stopped_before_tune_saved_its_state_starts_afresh(tmp_path: Path, mlflow_uri: str,
                                                                   ray_session) -> None:
    """A Tuner writes itself before Tune's first experiment state: a stop in between leaves a folder that
    ``Tuner.can_restore`` accepts, but restoring it started trials without their configurations."""
    from ray.tune import Tuner

    from fltune.cli import main
    from fltune.jobs.storage import tune_started
    from fltune.jobs.tuner import cluster_shape, placement
    from fltune.tune.command import Study, StudyRequest
    from fltune.tune.search import new_spec

    request = StudyRequest(space=str(write_space(tmp_path)), storage=str(tmp_path), name="study")
    spec = new_spec(request)
    spec.save()
    Study(request).new_tuner(spec, placement(spec.base, spec.workers, spec.gpus_per_worker, *cluster_shape()))
    assert Tuner.can_restore(spec.path) and not tune_started(spec.path)

    assert main(["tune", "--resume", "--name", "study", "--storage", str(tmp_path)]) == 0
    trials = ExperimentAnalysis(spec.path).trials
    assert len(trials) == 2 and all(t.last_result["round"] == 3 for t in trials)
    parent, children = study_runs(mlflow_uri)
    assert parent.info.status == "FINISHED" and len(children) == 2
