"""The shared driver: GPU share of a Tune job, what ``--resume`` picks, quiet library output."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fltune import driver
from fltune.driver import newest, quiet_libraries, quiet_worker, unfinished_if_stopped, with_gpu_share
from fltune.errors import FLTuneError
from fltune.tune.spec import StudySpec
from fltune.tune.results import TrialRow
from fltune.tune.study import StudyRequest, new_spec
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
    assert with_gpu_share(spec, {"CPU": cpus, "GPU": gpus}, 1.0, max_concurrent).gpus_per_worker == share


def test_gpu_share_is_kept_once_pinned(tmp_path):
    spec = study(tmp_path, "s").model_copy(update={"gpus_per_worker": 0.3})
    assert with_gpu_share(spec, {"CPU": 8.0, "GPU": 2.0}, 1.0, 2).gpus_per_worker == 0.3


def test_resume_without_name_takes_the_newest_job_of_its_kind(tmp_path):
    storage = str(tmp_path / "studies")
    old, new = study(tmp_path, "zz-old"), study(tmp_path, "aa-new")  # names do not sort by time
    for age, spec in ((100, old), (0, new)):
        spec.save()
        saved = Path(spec.path) / "fltune_study.json"
        os.utime(saved, (saved.stat().st_atime - age, saved.stat().st_mtime - age))
    other = tmp_path / "studies" / "other-kind"
    other.mkdir()
    (other / "fltune_study.json").write_text('{"name": "other-kind", "storage": "x", "table": "t"}')
    assert newest(StudySpec, storage, "study").name == "aa-new"
    assert newest(StudySpec, storage, "study", lambda s: s.name.startswith("zz")).name == "zz-old"
    with pytest.raises(FLTuneError, match="--resume: no study of x.yaml under .*; pass --name"):
        newest(StudySpec, storage, "study of x.yaml", lambda s: False)


@contextmanager
def shown_by(name: str) -> Iterator[tuple[logging.Logger, list[str]]]:
    """The logger ``name`` after ``quiet_libraries``, and the messages that pass its filters."""
    quiet_libraries()
    logger = logging.getLogger(name)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        yield logger, seen
    finally:
        logger.removeHandler(handler)


def test_ray_token_banner_is_dropped_and_other_warnings_kept():
    with shown_by("ray._private.authentication.authentication_token_setup") as (logger, seen):
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled …")
        logger.warning("Token authentication is disabled for this Ray cluster.")
    assert seen == ["Token authentication is disabled for this Ray cluster."]


def _delete_fs_path(error: Exception) -> None:
    """Named as the frame of Ray Tune's checkpoint pruning (``ray.train._internal.storage``)."""
    raise error


@pytest.mark.parametrize(("error", "shown"), [(FileNotFoundError("Path not found"), False),
                                              (PermissionError("denied"), True)])
def test_only_a_prune_of_an_already_deleted_checkpoint_is_dropped(error, shown):
    """After a killed driver, a resumed study's Tune logs "Error handling checkpoint" with a traceback
    when it prunes a checkpoint the dead driver already deleted; any other checkpoint error still shows."""
    with shown_by("ray.tune.execution.tune_controller") as (logger, seen):
        for raiser in (lambda: _delete_fs_path(error), lambda: (_ for _ in ()).throw(FileNotFoundError("x"))):
            try:
                raiser()
            except OSError:
                logger.exception("Trial %s: Error handling checkpoint %s", "t1", "ckpt")
    # the second error is a FileNotFoundError outside a prune: it always shows
    assert seen == ["Trial t1: Error handling checkpoint ckpt"] * (2 if shown else 1)


def _upload_to_fs_path(error: Exception) -> None:
    """Named as the frame of Ray Tune's copy of its driver folder to storage (``ray.train._internal.storage``)."""
    raise error


def _save(error: Exception) -> None:
    raise error


@pytest.mark.parametrize(("error", "shown"), [
    (FileNotFoundError("Failed to open local file '/tmp/ray/x/driver_artifacts/.b95a-tmp-searcher-state.pkl'"), False),
    (FileNotFoundError("Failed to open local file '/tmp/ray/x/driver_artifacts/experiment_state.json'"), True),
    (PermissionError("denied: .b95a-tmp-searcher-state.pkl"), True),
])
def test_only_a_copy_that_lost_a_temporary_file_is_dropped(error, shown):
    """A SIGTERM'd study's Tune logged "Saving experiment state to storage … failed" with a traceback: the
    copy it had started before saving again listed a temporary file that the save then renamed. Any other
    failure of that copy, or a vanished temporary file outside it, still shows."""
    with shown_by("ray.tune.execution.experiment_state") as (logger, seen):
        for raiser in (_upload_to_fs_path, _save):
            try:
                raiser(type(error)(*error.args))
            except OSError:
                logger.error("Saving experiment state to storage at '/s/study' failed with exception: ", exc_info=True)
    # the second raise is outside the copy: it always shows
    assert seen == ["Saving experiment state to storage at '/s/study' failed with exception: "] * (2 if shown else 1)


def test_worker_drops_only_unraisable_system_exit(monkeypatch, capsys):
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    quiet_worker()

    class Raises:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    Raises(SystemExit(1))  # what Ray's SIGTERM handler raises inside a weakref callback
    assert capsys.readouterr().err == ""
    Raises(ValueError("a real bug"))
    assert "ValueError: a real bug" in capsys.readouterr().err


def test_after_a_stop_signal_failed_trials_are_unfinished(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM to the process group can kill a trial before Tune pauses it: the stopped job must
    conclude interrupted (and resume that trial), not report it failed."""
    rows = [TrialRow(trial_id=t, status=s, params={}, round=1, objective=0.5, objective_std=0.0)
            for t, s in (("a", "failed"), ("b", "finished"), ("c", "running"), ("d", "diverged"))]
    assert [r.status for r in unfinished_if_stopped(rows)] == ["failed", "finished", "running", "diverged"]
    monkeypatch.setattr(driver, "_stopped_by", [15])
    assert [r.status for r in unfinished_if_stopped(rows)] == ["pending", "finished", "running", "diverged"]


def test_last_resorts_nest_and_unwind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison's last resort stays armed around each of its Tune jobs, and every block leaves the list
    as it found it, also when its job raises."""
    monkeypatch.setattr(driver, "_last_resort", [])
    with driver.ending_if_ray_dies(print, "outer"):
        with pytest.raises(KeyboardInterrupt), driver.ending_if_ray_dies(print, "inner"):
            assert [resume for _, resume in driver._last_resort] == ["outer", "inner"]
            raise KeyboardInterrupt
        assert [resume for _, resume in driver._last_resort] == ["outer"]
    assert driver._last_resort == []


def test_a_sigterm_after_a_finished_tune_job_stops_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune's ``fit`` leaves its own SIGINT handler installed after a job that ran to its end. Without
    ``signal_handlers_kept`` a SIGTERM between two jobs of a command went to that stale handler and was
    lost: the driver went on into the next job (CI found it crashing there on the dying GCS, status 1)."""
    from ray.tune.tune import _setup_signal_catching  # what Tune's fit does first

    monkeypatch.setattr(driver, "_stopped_by", [])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGTERM, driver._on_sigterm)
        with driver.signal_handlers_kept():
            _setup_signal_catching()
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler (it runs in the main thread)
        assert driver._stopped_by == [signal.SIGTERM]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_ctrl_c_stops_a_command_that_started_with_it_ignored() -> None:
    """A driver started with SIGINT ignored (a shell's background job, a CI step) took Ctrl-C during a Tune
    job (Tune's own handler) and lost it between two: ``take_ctrl_c`` makes it ``KeyboardInterrupt`` at
    every moment, and keeps a handler that is already installed."""
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        driver.take_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler (it runs in the main thread)

        def own(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGINT, own)
        driver.take_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_stopped_jobs_line_is_whole_and_names_the_signal(monkeypatch, capsys) -> None:
    """The resume command is copied from the terminal: never wrapped, however long."""
    resume = "python cli.py compare --name c --storage /" + "x" * 150 + " --resume"
    monkeypatch.setattr(driver, "_stopped_by", [15])
    driver.say_resume(driver.interrupted(), resume)
    assert capsys.readouterr().err == f"fltune: interrupted (SIGTERM); continue it with: {resume}\n"
    monkeypatch.setattr(driver, "_stopped_by", [])
    assert driver.stop_message() == "fltune: interrupted"
    assert driver.interrupted(15) == "interrupted (SIGTERM)"


@pytest.mark.parametrize("argv, ignored", [
    (["tune", "--resume", "--name", "s", "--storage", "x"], None),
    (["tune", "--resume", "--set", "federation.rounds=9", "--seeds", "2"], "--set, --seeds"),
    (["reproduce", "table2", "--resume", "--out", "o", "--address", "auto"], None),
    (["reproduce", "table2", "--resume", "--scale", "paper", "--rows", "FedAvg"], "--rows, --scale"),
    (["reproduce", "table2", "--resume", "--scale", "quick"], None),  # the default: not given
    (["compare", "--resume", "--name", "c", "--out", "o"], None),
    (["compare", "--resume", "--methods", "fedavg,fedprox", "--rounds", "3", "--checkpoint-every", "2"],
     "--methods, --checkpoint-every, --rounds"),
])
def test_a_resumed_job_names_the_setting_flags_it_ignores(argv, ignored, capsys):
    """A resumed job runs its saved settings: flags that would change them are named once; flags that find
    the job (--name, --storage) or place its output (--out, --address) are honoured and not named."""
    from fltune.cli import build_parser

    driver.note_ignored_on_resume(build_parser().parse_args(argv), "job")
    said = " ".join(capsys.readouterr().err.split())
    if ignored is None:
        assert said == ""
    else:
        assert said == f"note: a resumed job keeps the settings it started with; ignored: {ignored}"


def test_a_storage_uri_that_cannot_be_reached_is_one_line_naming_storage(tmp_path: Path) -> None:
    from fltune.errors import FLTuneError

    with pytest.raises(FLTuneError, match=r"^--storage nosuchfs://bucket/x: Unrecognized filesystem .*; allowed: "):
        driver.storage_root("nosuchfs://bucket/x")
    # a local folder as a URI is that folder (its job files are written whole, as a plain path's are)
    assert driver.storage_root(f"file://{tmp_path}/jobs") == str(tmp_path / "jobs")
    with pytest.raises(FLTuneError, match=r"^--storage file://rel/x: Unsupported hostname .*; allowed: "):
        driver.storage_root("file://rel/x")
    assert driver.storage_root(str(tmp_path / "rel" / ".." / "jobs")) == str(tmp_path / "jobs")


def test_check_gcs_asks_host_port_addresses_only() -> None:
    from fltune.errors import FLTuneError
    from tests.tune.test_cluster import free_port

    for address in (None, "", "auto", "local", "ray://head:10001"):
        driver.check_gcs(address)  # Ray answers these itself
    with pytest.raises(FLTuneError, match="no Ray cluster answers there"):
        driver.check_gcs(f"127.0.0.1:{free_port()}")


def test_a_saved_tuner_that_is_missing_empty_or_cut_is_not_whole(tmp_path: Path) -> None:
    assert not driver.tuner_whole(str(tmp_path))
    saved = pickle.dumps({"_tune_config": list(range(100))})
    for data, whole in ((saved, True), (b"", False), (saved[: len(saved) // 2], False)):
        (tmp_path / "tuner.pkl").write_bytes(data)
        assert driver.tuner_whole(str(tmp_path)) == whole


def test_a_stop_that_another_handler_takes_is_still_seen() -> None:
    """Tune's handler takes a Ctrl-C and only sets its stop event; once its job has no trial left, nothing
    reads that event, so the driver asks the wake-up pipe, which saw the signal arrive."""
    import time

    driver.forget_stops()
    driver.handle_stop_signals()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # as Tune's: no exception
    try:
        assert not driver.stop_arrived()
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not driver.stop_arrived() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver.stop_arrived()
    finally:
        signal.signal(signal.SIGINT, previous)
        driver.forget_stops()


def test_a_ctrl_c_raised_inside_a_finalizer_is_raised_again_after_it() -> None:
    """A KeyboardInterrupt raised in a ``__del__`` (or a weakref callback) that garbage collection runs is
    one Python cannot raise: it used to be printed as ignored and lost."""
    import time

    class Finalized:
        def __del__(self) -> None:
            raise KeyboardInterrupt

    driver.handle_stop_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            Finalized()
            time.sleep(5)  # the re-sent SIGINT ends it
    finally:
        driver.forget_stops()


def test_the_last_resorts_clean_ups_are_waited_for_a_bounded_time(capsys: pytest.CaptureFixture[str]) -> None:
    """A clean-up stuck on a lock must not keep the process past Ray's own end of it (status 1); one that
    raises says why and the next still runs."""
    reached, release = threading.Event(), threading.Event()

    def fails() -> None:
        raise OSError("disk full")

    def stuck() -> None:
        reached.set()
        release.wait()

    assert not driver._within(0.2, [fails, stuck])  # returns although its last call still waits
    assert driver._within(10, [fails])
    assert reached.wait(10)
    release.set()
    assert "OSError: disk full" in capsys.readouterr().err


def test_a_jobs_data_are_checked_as_its_trials_would_check_them_before_ray_starts():
    """``check_data`` partitions each distinct setting of a job's trials and asks the probes each turns on:
    a split that the personalized protocol can't score (some client holds out nothing) is one line here,
    where every trial used to fail with Tune's traceback, retried."""
    from fltune.config import build_config
    from tests.metrics.test_evaluation import SKEWED

    scored_globally = build_config(overrides=[*SKEWED, "partition.eval_fraction=0.015", "metrics.protocols=[global]"])
    scored_per_client = build_config(overrides=[*SKEWED, "partition.eval_fraction=0.015"])
    driver.check_data([scored_globally])
    with pytest.raises(FLTuneError, match=r"^partition\.eval_fraction: 0\.015 holds out no sample of \d of 10 "
                                          r"clients, and the personalized protocol scores every client"):
        driver.check_data([scored_globally, scored_per_client])


def test_runs_that_differ_only_in_method_or_training_share_one_data_check():
    from fltune.config import build_config

    fedavg = build_config(overrides=["method.name=fedavg"])
    assert driver.split_setting(fedavg) == driver.split_setting(build_config(overrides=["method.name=fedprox",
                                                                                         "training.lr=0.1"]))
    assert driver.split_setting(fedavg) != driver.split_setting(build_config(overrides=["federation.seed=1"]))
