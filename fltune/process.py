"""The command's process: quiet library output, one clean way to stop, and an end when the local Ray dies.

Ctrl-C and SIGTERM take one path: a plain run gets ``KeyboardInterrupt`` (MLflow run KILLED), a Tune job
Tune's graceful stop (saved for ``--resume``); exit status 128 + the signal. Ray installs its own handlers, so
ours is reinstalled after it starts (``engine.cluster.start_ray``). Library noise is dropped; a failed write
Tune logs and goes on past is kept for the job to stop on (``library_write_failure``).
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fltune import folders
from fltune.errors import WriteFailed
from fltune.workarounds import (
    NOISE, Rule, local_ray_node, mute_published_errors_after_a_stop, ray_node_alive, stop_local_ray,
)

_failed_writes: list[WriteFailed] = []
"""Writes that failed in a library that logged them and went on (``_Drop``), for the job to stop on."""

_stopped_by: list[int] = []
"""The stop signals this process received, in order (the last one names the exit status)."""

_last_resort: list[tuple[Callable[[], None], str]] = []
"""What the running Tune jobs do and say when the local Ray dies under them (``ending_if_ray_dies``)."""
_last_resort_lock = threading.Lock()

CLEAN_UP_S = 20.0
"""The longest the last resort waits for a job's clean-ups (``_within``): Ray's core worker ends a driver whose
GCS is gone, status 1, a minute later (``gcs_rpc_server_reconnect_timeout_s``)."""

_wakeup: list[int] = []
"""The write end of the signal wake-up pipe, once ``handle_stop_signals`` made it."""
_arrived: list[int] = []
"""Stop signals as the wake-up pipe saw them arrive (``_watch_signals``)."""


# ---------------------------------------------------------------------------------------------- quiet
class _Drop(logging.Filter):
    """Drop a library's records that start with a rule's ``prefixes``; with a ``harmless`` check, only error
    records it recognises, or failed writes (kept for ``library_write_failure``). The exception is the
    record's, or the one being handled (Tune's syncer logs inside its ``except``)."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        super().__init__()
        self.rules = rules

    def filter(self, record: logging.LogRecord) -> bool:
        matched = [harmless for prefixes, harmless in self.rules if str(record.msg).startswith(prefixes)]
        if not matched:
            return True
        if matched[0] is None:
            return False
        _, error, trace = record.exc_info or sys.exc_info()
        if error is None:
            return True
        failed = folders.failed_write(error, "")
        if failed is not None:
            _failed_writes.append(failed)
            return False
        return not matched[0](error, [frame.name for frame in traceback.extract_tb(trace)])


def quiet_libraries() -> None:
    """Drop the library noise in ``NOISE``, and numpy's "All-NaN slice" warning (ASHA's percentile of a rung
    where every trial diverged; the board says so already). Workers get ``quiet_worker``."""
    warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
    for name in NOISE:
        drop_noise(name)


def drop_noise(name: str) -> None:
    """Drop logger ``name``'s records that ``NOISE[name]`` lists, once however often called."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _Drop) for f in logger.filters):
        logger.addFilter(_Drop(NOISE[name]))


def quiet_worker() -> None:
    """Ray's ``worker_process_setup_hook``: ``NOISE``, and drop the "Exception ignored in … SystemExit" report
    of a Ray SIGTERM landing in a weakref callback. (Ray starts workers with SIGINT blocked.)"""
    quiet_libraries()

    def hook(unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, SystemExit):
            sys.__unraisablehook__(unraisable)

    sys.unraisablehook = hook


def library_write_failure() -> WriteFailed | None:
    """The first write that failed inside a library since the last call, else None (a Tune job stops on it)."""
    failed = _failed_writes[0] if _failed_writes else None
    _failed_writes.clear()
    return failed


# ---------------------------------------------------------------------------------------------- stop
def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM does what Ctrl-C does at this moment."""
    _stopped_by.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, frame)
    else:
        raise KeyboardInterrupt


def handle_stop_signals() -> None:
    """(Re)install fltune's SIGTERM handler (after Ray too) and the wake-up pipe ``_watch_signals`` reads: a
    driver blocked on a dead GCS never reaches Python's handlers, but the C-level one writes the pipe."""
    take_ctrl_c()
    signal.signal(signal.SIGTERM, _on_sigterm)
    keep_stops_raised_in_finalizers()
    if not _wakeup:
        read, write = os.pipe()
        os.set_blocking(write, False)
        _wakeup.append(write)
        threading.Thread(target=_watch_signals, args=(read,), daemon=True, name="fltune-signals").start()
    signal.set_wakeup_fd(_wakeup[0], warn_on_full_buffer=False)


def keep_stops_raised_in_finalizers() -> None:
    """A ``KeyboardInterrupt`` raised in a weakref callback or ``__del__`` (printed and dropped by Python) is
    re-sent to the main thread 10 ms later, past the finalizer; other reports go to the previous hook."""
    if getattr(sys.unraisablehook, "fltune_keeps_stops", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):  # sent later, from a thread: in the hook it is lost
            again = threading.Timer(0.01, _thread.interrupt_main, args=(signal.SIGINT,))
            again.daemon = True
            again.start()
        else:
            previous(unraisable)

    hook.fltune_keeps_stops = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def take_ctrl_c() -> None:
    """Make Ctrl-C a stop also in a process started with SIGINT ignored (a background job), else a SIGINT
    between two Tune jobs would be lost; an installed handler is kept."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _watch_signals(read: int) -> None:
    """Record every stop signal's arrival (``_arrived``) for the process's life, from which Ray's published errors
    are muted (the group's stop reached Ray's services too); on SIGTERM, start the running Tune job's last resort
    (``_end_if_ray_died``) on a thread of its own."""
    last_resort: threading.Thread | None = None
    while True:
        got = os.read(read, 64)
        _arrived.extend(signum for signum in got if signum in (signal.SIGINT, signal.SIGTERM))
        if _arrived:
            mute_published_errors_after_a_stop(stop_arrived)
        if signal.SIGTERM in got and (last_resort is None or not last_resort.is_alive()):
            last_resort = threading.Thread(target=_end_if_ray_died, args=(signal.SIGTERM,), daemon=True,
                                           name="fltune-last-resort")
            last_resort.start()


def forget_stops() -> None:
    """A new command starts with no stop received (tests run several in one process)."""
    _arrived.clear()


def stop_arrived() -> bool:
    """Whether a stop signal reached this driver, whatever handler took it: a Tune job can take one and still
    end complete (its stop event is unread once the last trial ended), yet the command must stop."""
    return bool(_arrived)


@contextmanager
def ending_if_ray_dies(cleanup: Callable[[], None], resume: str) -> Iterator[None]:
    """In this block a SIGTERM that ends the local Ray runs ``cleanup`` and prints ``resume``
    (``_end_if_ray_died``); nested, every clean-up runs and the outermost line prints."""
    entry = (cleanup, resume)
    with _last_resort_lock:
        _last_resort.append(entry)
    try:
        yield
    finally:
        with _last_resort_lock:
            _last_resort.remove(entry)


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Restore SIGINT and SIGUSR1 handlers after the block: Tune's ``fit`` leaves its own, stale after a
    finished job, which would swallow a stop between two Tune jobs."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGUSR1)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def _end_if_ray_died(signum: int) -> None:
    """A process-group SIGTERM also ends the local Ray, so Tune's graceful stop can never finish (Ray would exit 1).
    Watch the local Ray (under load it takes a while to go); once it goes, inside ``ending_if_ray_dies``, clean up,
    print the line and exit 128 + the signal. A joined cluster or surviving Ray is left to the graceful stop."""
    node = local_ray_node()
    if node is None:
        return
    while ray_node_alive(node):
        time.sleep(0.1)
    with _last_resort_lock:
        if not _last_resort:
            return
        whole = _within(CLEAN_UP_S, [cleanup for cleanup, _ in reversed(_last_resort)])
        cut = "" if whole else f"; its clean-up took over {CLEAN_UP_S:g} s, so MLflow may show its runs RUNNING"
        say_resume(interrupted(signum) + cut, _last_resort[0][1])
        os._exit(128 + signum)


def _within(seconds: float, calls: list[Callable[[], None]]) -> bool:
    """Run ``calls`` in order on a thread for ``seconds`` at most (a clean-up stuck on MLflow's sqlite lock
    must not outlive Ray's core worker); whether they all ended. One that raises does not stop the rest."""

    def run_all() -> None:
        for call in calls:
            try:
                call()
            except Exception:  # the others still run; the traceback says what failed
                traceback.print_exc()

    worker = threading.Thread(target=run_all, daemon=True, name="fltune-clean-up")
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


RAYLET_STOP_S = 5.0
"""The longest ``exit_now`` waits for the raylet to end its workers and agents."""


def exit_now(code: int) -> None:
    """A command that started a local Ray exits here with ``code``, skipping Ray's slow shutdown and Python's
    exit collection (``workarounds.stop_local_ray``). After a stop whose Ray already died, exit at once: Ray's
    shutdown would wait for the dead GCS and exit 1. A driver that joined a cluster returns."""
    node = local_ray_node()
    if node is None:
        return
    if not (_stopped_by and not ray_node_alive(node)):
        stop_local_ray(node, RAYLET_STOP_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def terminated() -> bool:
    """Whether a SIGTERM reached this process (sent to the group, it may have killed trials too)."""
    return bool(_stopped_by)


def _last_signal() -> int:
    """The last stop signal received (SIGINT when none was: a ``KeyboardInterrupt``)."""
    return _stopped_by[-1] if _stopped_by else signal.SIGINT


def stop_status() -> int:
    """The exit status of a stopped command: 128 + the signal (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + _last_signal()


def interrupted(signum: int | None = None) -> str:
    """What stopped the command: by ``signum``, else by the last stop signal received."""
    name = signal.Signals(signum or _last_signal()).name
    return "interrupted" + ("" if name == "SIGINT" else f" ({name})")


def say_resume(what: str, resume: str) -> None:
    """A stopped job's line, never wrapped: what stopped and the command that continues it."""
    print(f"fltune: {what}; continue it with: {resume}", file=sys.stderr, flush=True)

