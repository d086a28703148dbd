"""The command's process: quiet library output, one clean way to stop, an end when the local Ray dies."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fltune import process
from fltune.process import quiet_libraries, quiet_worker


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


def test_tunes_missing_metric_tables_of_trials_that_never_reported_are_dropped():
    """A job stopped before some trials reported (a full disk) warned on resume, three lines per job."""
    with shown_by("ray.tune.analysis.experiment_analysis") as (logger, seen):
        logger.warning("Failed to fetch metrics for 1 trial(s):\n- run_cell_1: FileNotFoundError('… not found')")
        logger.warning("No trials found in /s/job")
    assert seen == ["No trials found in /s/job"]


def test_ray_token_banner_is_dropped_and_other_warnings_kept():
    with shown_by("ray._private.authentication.authentication_token_setup") as (logger, seen):
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled …")
        logger.warning("Token authentication is disabled for this Ray cluster.")
    assert seen == ["Token authentication is disabled for this Ray cluster."]


def test_ray_trains_line_per_checkpoint_is_dropped_and_its_warnings_kept():
    """Every trial's checkpoint was one INFO line in the job's output (``workarounds.NOISE``, in every worker)."""
    with shown_by("ray.train._internal.storage") as (logger, seen):
        logger.warning("Checkpoint successfully created at: Checkpoint(path=/s/job/trial/checkpoint_000001)")
        logger.warning("Storage is slow")
    assert seen == ["Storage is slow"]


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


@pytest.mark.parametrize(("error", "shown"), [
    (OSError(errno.ENOSPC, "No space left on device", "/s/study/experiment_state.json"), False),
    (ConnectionError("the bucket went away"), True),
])
def test_a_failed_write_of_tunes_syncer_is_dropped_and_kept_for_the_job(error, shown):
    """Tune's syncer logs "Last sync command failed" with the traceback in its message, inside its ``except``
    block, and goes on (a ~25-line traceback on every copy to a full disk); a write that failed is kept for
    the job to stop on, with its file; any other failure still shows."""
    process.library_write_failure()
    with shown_by("ray.train._internal.syncer") as (logger, seen):
        try:
            raise error
        except Exception:
            logger.warning("Last sync command failed with the following error:\nTraceback …")
    assert seen == (["Last sync command failed with the following error:\nTraceback …"] if shown else [])
    failed = process.library_write_failure()
    assert (failed is None) == shown
    assert shown or (failed.path, failed.reason) == ("/s/study/experiment_state.json", "No space left on device")
    assert process.library_write_failure() is None  # said once


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


def test_last_resorts_nest_and_unwind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison's last resort stays armed around each of its Tune jobs, and every block leaves the list
    as it found it, also when its job raises."""
    monkeypatch.setattr(process, "_last_resort", [])
    with process.ending_if_ray_dies(print, "outer"):
        with pytest.raises(KeyboardInterrupt), process.ending_if_ray_dies(print, "inner"):
            assert [resume for _, resume in process._last_resort] == ["outer", "inner"]
            raise KeyboardInterrupt
        assert [resume for _, resume in process._last_resort] == ["outer"]
    assert process._last_resort == []


def test_a_sigterm_after_a_finished_tune_job_stops_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune's ``fit`` leaves its own SIGINT handler installed after a job that ran to its end. Without
    ``signal_handlers_kept`` a SIGTERM between two jobs of a command went to that stale handler and was
    lost: the driver went on into the next job (CI found it crashing there on the dying GCS, status 1)."""
    from ray.tune.tune import _setup_signal_catching  # what Tune's fit does first

    monkeypatch.setattr(process, "_stopped_by", [])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGTERM, process._on_sigterm)
        with process.signal_handlers_kept():
            _setup_signal_catching()
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler (it runs in the main thread)
        assert process._stopped_by == [signal.SIGTERM]
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
        process.take_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler (it runs in the main thread)

        def own(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGINT, own)
        process.take_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_stopped_jobs_line_is_whole_and_names_the_signal(monkeypatch, capsys) -> None:
    """The resume command is copied from the terminal: never wrapped, however long."""
    resume = "python cli.py compare --name c --storage /" + "x" * 150 + " --resume"
    monkeypatch.setattr(process, "_stopped_by", [15])
    process.say_resume(process.interrupted(), resume)
    assert capsys.readouterr().err == f"fltune: interrupted (SIGTERM); continue it with: {resume}\n"
    monkeypatch.setattr(process, "_stopped_by", [])
    assert process.interrupted() == "interrupted"
    assert process.interrupted(15) == "interrupted (SIGTERM)"


def test_a_stop_that_another_handler_takes_is_still_seen() -> None:
    """Tune's handler takes a Ctrl-C and only sets its stop event; once its job has no trial left, nothing
    reads that event, so the command asks the wake-up pipe, which saw the signal arrive."""
    import time

    process.forget_stops()
    process.handle_stop_signals()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # as Tune's: no exception
    try:
        assert not process.stop_arrived()
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not process.stop_arrived() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.stop_arrived()
    finally:
        signal.signal(signal.SIGINT, previous)
        process.forget_stops()


def test_a_ctrl_c_raised_inside_a_finalizer_is_raised_again_after_it() -> None:
    """A KeyboardInterrupt raised in a ``__del__`` (or a weakref callback) that garbage collection runs is
    one Python cannot raise: it used to be printed as ignored and lost."""
    import time

    class Finalized:
        def __del__(self) -> None:
            raise KeyboardInterrupt

    process.handle_stop_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            Finalized()
            end = time.monotonic() + 5
            while time.monotonic() < end:  # the re-sent SIGINT ends it (``interrupt_main`` waits out a sleep)
                time.sleep(0.01)
    finally:
        process.forget_stops()


def test_the_last_resorts_clean_ups_are_waited_for_a_bounded_time(capsys: pytest.CaptureFixture[str]) -> None:
    """A clean-up stuck on a lock must not keep the process past Ray's own end of it (status 1); one that
    raises says why and the next still runs."""
    reached, release = threading.Event(), threading.Event()

    def fails() -> None:
        raise OSError("disk full")

    def stuck() -> None:
        reached.set()
        release.wait()

    assert not process._within(0.2, [fails, stuck])  # returns although its last call still waits
    assert process._within(10, [fails])
    assert reached.wait(10)
    release.set()
    assert "OSError: disk full" in capsys.readouterr().err
