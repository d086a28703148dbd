"""The Tune job scaffold: the GPU share of its trials, and its trials after a stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from fltune import process
from fltune.jobs.scaffold import unfinished_if_stopped, with_gpu_share
from fltune.tune.command import StudyRequest
from fltune.tune.results import TrialRow
from fltune.tune.spec import StudySpec
from fltune.tune.search import new_spec
from tests.tune.helpers import write_space


def study(tmp_path: Path, name: str, **changes) -> StudySpec:
    space = write_space(tmp_path, **changes)
    return new_spec(StudyRequest(space=str(space), storage=str(tmp_path / "studies"), name=name,
                                 overrides=("resources.workers=2",)))


@pytest.mark.parametrize("max_concurrent, cpus, gpus, share", [
    (2, 8.0, 2.0, 0.5),    # 2 trials at once (the CPUs fit 4): 2 GPUs over their 4 workers
    (10, 8.0, 2.0, 0.25),  # the CPUs fit only 4 trials of 2 workers: the GPUs are shared by 8 workers
    (None, 8.0, 2.0, 0.25),
    (1, 8.0, 4.0, 1.0),    # never more than one GPU per worker
    (2, 8.0, 0.0, 0.0),
])
def test_gpu_share_divides_by_the_workers_that_run_at_once(tmp_path, max_concurrent, cpus, gpus, share):
    spec = study(tmp_path, "s")
    spec = spec.model_copy(update={"space": spec.space.model_copy(update={"max_concurrent": max_concurrent})})
    assert with_gpu_share(spec, {"CPU": cpus, "GPU": gpus}, 1.0).gpus_per_worker == share


def test_gpu_share_is_kept_once_pinned(tmp_path):
    spec = study(tmp_path, "s").model_copy(update={"gpus_per_worker": 0.3})
    assert with_gpu_share(spec, {"CPU": 8.0, "GPU": 2.0}, 1.0).gpus_per_worker == 0.3


def test_after_a_stop_signal_failed_trials_are_unfinished(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM to the process group can kill a trial before Tune pauses it: the stopped job must
    conclude interrupted (and resume that trial), not report it failed."""
    rows = [TrialRow(trial_id=t, status=s, params={}, round=1, objective=0.5, objective_std=0.0)
            for t, s in (("a", "failed"), ("b", "finished"), ("c", "running"), ("d", "diverged"))]
    assert [r.status for r in unfinished_if_stopped(rows)] == ["failed", "finished", "running", "diverged"]
    monkeypatch.setattr(process, "_stopped_by", [15])
    assert [r.status for r in unfinished_if_stopped(rows)] == ["pending", "finished", "running", "diverged"]
