"""A job whose storage fills up (a 2 MB tmpfs): it stops at once with one line naming the file, the room
left and how to continue, exit 74, its MLflow runs KILLED, every checkpoint whole; ``--resume`` once there is
room finishes it with each trial once in MLflow. For ``tune``, ``reproduce`` and ``compare``: they share the
job scaffold (``jobs.scaffold.TuneJob``), each its own cells; the study is also held to the numbers of a study
never stopped (the cells resume the same way, and a third job each would cost the suite minutes). The extended
tier: the suite checks a write cut by a full disk (tests/test_folders.py) and a job's resume
(tests/tune/test_resume.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray.tune import ExperimentAnalysis

from fltune.cli import main
from fltune.errors import WriteFailed
from tests.compare.test_command import TINY as COMPARE_TINY
from tests.compare.test_command import children, runs
from tests.conftest import needs_fmnist
from tests.reproduce.test_command import TINY as REPRODUCE_TINY
from tests.tune.helpers import rounds_logged, study_runs, tune_command, write_space

ROUNDS = 2


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[tuple[Path, Callable[[str], None]]]:
    """A 2 MB tmpfs (root's ``mount``; skipped where the container allows none) and a way to resize it:
    the room a user makes before resuming."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (needs root)")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)

    try:
        yield disk, resize
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def objectives(job: Path) -> dict[str, tuple[float, float, float]]:
    """Each trial's final round, objective and loss by its parameters (a cell's name, a sampled value)."""
    return {str(trial.config): tuple(trial.last_result[key] for key in ("round", "objective", "loss"))
            for trial in ExperimentAnalysis(str(job)).trials}


def said_once(printed: str, disk: Path, resume: str) -> None:
    """One line of fltune, naming a file on the disk, its room and the resume command (``resume``, after the
    program as it was invoked); no library's."""
    said = [line for line in printed.splitlines() if line.startswith("fltune:")]
    assert len(said) == 1 and said[0].startswith(f"fltune: cannot write {disk}/"), printed
    assert "No space left on device (" in said[0] and f"free on {disk}); make room, then continue it with: " \
        in said[0] and said[0].endswith(f" {resume}"), said
    noise = [n for n in ("Traceback", "Last sync", "failed with exception", "attempt 1") if n in printed]
    assert not noise, (noise, printed)


@pytest.mark.slow
@pytest.mark.extended
def test_a_study_on_a_full_disk_stops_in_one_line_and_resumes_to_the_same_numbers(
        ray_session, tmp_path: Path, mlflow_uri: str, small_disk, capsys) -> None:
    disk, resize = small_disk
    space = write_space(tmp_path)
    args = tune_command(space, disk, "--set", f"federation.rounds={ROUNDS}")[2:]
    assert main(args) == WriteFailed.STATUS
    said_once(capsys.readouterr().err, disk, f"tune --name study --storage {disk} --resume")
    parent, children_ = study_runs(mlflow_uri)
    statuses = [c.info.status for c in children_]  # a trial that ended before the disk filled is FINISHED
    assert parent.info.status == "KILLED" and "KILLED" in statuses and "RUNNING" not in statuses, statuses
    assert not list(disk.rglob("*.part"))

    resize("50m")
    assert main([*args, "--resume"]) == 0
    parent, children_ = study_runs(mlflow_uri)
    trials = ExperimentAnalysis(str(disk / "study")).trials
    assert parent.info.status == "FINISHED" and len(trials) == 2
    assert sorted(c.data.tags["fltune.trial_id"] for c in children_) == sorted(t.trial_id for t in trials)
    for child in children_:
        assert child.info.status == "FINISHED" and rounds_logged(mlflow_uri, child.info.run_id) == [1, 2]

    reference = tune_command(space, tmp_path / "ref", "--set", f"federation.rounds={ROUNDS}", "--set",
                             "tracking.enabled=false")  # the study never stopped
    assert main(reference[2:]) == 0
    assert objectives(disk / "study") == objectives(tmp_path / "ref" / "study")


def each_once(cells: list, job: Path) -> None:
    """Every cell of the job has one MLflow run, FINISHED."""
    trials = ExperimentAnalysis(str(job)).trials
    assert sorted(c.data.params["cell"] for c in cells) == sorted(t.config["cell"] for t in trials)
    assert len(trials) == len({t.config["cell"] for t in trials}) and all(c.info.status == "FINISHED" for c in cells)


def stopped_then_resumed(args: list[str], disk: Path, resize: Callable[[str], None], resume: str,
                         capsys: pytest.CaptureFixture[str], uri: str) -> None:
    """``args`` on the full disk (74, its line, no MLflow run left RUNNING), then again with ``--resume``
    once there is room (0)."""
    assert main(args) == WriteFailed.STATUS
    said_once(capsys.readouterr().err, disk, resume)
    assert not list(disk.rglob("*.part")) and all(r.info.status != "RUNNING" for r in runs(uri))
    resize("50m")
    assert main([*args, "--resume"]) == 0


@needs_fmnist
@pytest.mark.slow
@pytest.mark.extended
def test_a_table_on_a_full_disk_stops_in_one_line_and_resumes_each_cell_once(
        ray_session, tmp_path: Path, mlflow_uri: str, small_disk, capsys) -> None:
    disk, resize = small_disk
    args = ["reproduce", "table2", *REPRODUCE_TINY, "--storage", str(disk), "--name", "t2", "--out",
            str(tmp_path / "out")]
    resume = f"reproduce simfafl:table2 --name t2 --storage {disk} --resume"
    stopped_then_resumed(args, disk, resize, resume, capsys, mlflow_uri)
    [parent] = [r for r in runs(mlflow_uri) if r.data.tags.get("fltune.kind") == "reproduce"]
    cells = children(runs(mlflow_uri), parent)
    each_once(cells, disk / "t2")
    assert parent.info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.extended
def test_a_comparison_on_a_full_disk_stops_in_one_line_and_resumes_each_cell_once(
        ray_session, tmp_path: Path, mlflow_uri: str, small_disk, capsys) -> None:
    disk, resize = small_disk
    args = ["compare", "--methods", "fedavg,fedprox", *COMPARE_TINY, "--storage", str(disk), "--name", "c",
            "--out", str(tmp_path / "out")]
    stopped_then_resumed(args, disk, resize, f"compare --name c --storage {disk} --resume", capsys,
                         mlflow_uri)
    [parent] = [r for r in runs(mlflow_uri) if r.data.tags.get("fltune.kind") == "compare"]
    cells = children(runs(mlflow_uri), parent)
    each_once(cells, disk / "c")
    assert parent.info.status == "FINISHED"
