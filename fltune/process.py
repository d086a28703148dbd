"""The command's process: quiet library output, one clean way to stop, and an end when the local Ray dies.

Stopping. Ctrl-C (SIGINT) and SIGTERM (what ``timeout``, schedulers, Kubernetes and ``ray job stop``
send) take one path: a plain run gets ``KeyboardInterrupt`` (its MLflow run ends KILLED, its workers
stop), a Tune job gets Tune's own graceful stop (trials checkpointed, the study saved for ``--resume``).
The exit status says which signal it was: 128 + its number (130, 143). Ray installs handlers of its
own in the driver when it starts — a Python one that turns SIGTERM into ``SystemExit`` and a C++ one
that dumps a stack trace and aborts — so ours is installed again right after Ray starts
(``engine.cluster.start_ray``).

Quiet. Ray's banner about token authentication (the security default stays on) and Tune's "stop
signal received" advice are dropped; a worker that Ray ends with SIGTERM (a trial stopped early by ASHA,
an interrupted job) no longer prints ``SystemExit`` tracebacks. A failed write that Tune's driver logs and
goes on past (its syncer, its state snapshots: a full disk) is dropped too, and kept for the job to stop on
(``library_write_failure``): fltune says it once, in its own words. Real errors are untouched.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import socket
import subprocess
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

Rule = tuple[tuple[str, ...], "Callable[[BaseException, list[str]], bool] | None"]
"""A kind of library record: how its message starts, and when such an error record is harmless (``_Drop``)."""

_failed_writes: list[WriteFailed] = []
"""Writes that failed in a library that logged them and went on (``_Drop``), for the job to stop on."""

_stopped_by: list[int] = []
"""The stop signals this process received, in order (the last one names the exit status)."""

_last_resort: list[tuple[Callable[[], None], str]] = []
"""What the running Tune jobs do and say when the local Ray dies under them (``ending_if_ray_dies``)."""
_last_resort_lock = threading.Lock()

CLEAN_UP_S = 20.0
"""The longest the last resort waits for a job's clean-ups (``_within``): Ray's core worker ends a driver
whose GCS is gone with status 1 a minute later (``gcs_rpc_server_reconnect_timeout_s``)."""

_wakeup: list[int] = []
"""The write end of the signal wake-up pipe, once ``handle_stop_signals`` made it."""
_arrived: list[int] = []
"""Stop signals as the wake-up pipe saw them arrive (``_watch_signals``)."""


# ---------------------------------------------------------------------------------------------- quiet
class _Drop(logging.Filter):
    """Drop a library's records that start with one of a rule's ``prefixes``; with the rule's ``harmless``,
    only its error records in the one case ``harmless`` recognises from the exception and the names of its
    traceback's frames, or whose exception is a failed write (``folders.failed_write``), which is kept for
    the job to stop on (``library_write_failure``); every other error of that kind still shows, with its
    traceback.
    The exception is the record's, or the one being handled where the library logs it (Tune's syncer formats
    its traceback into the message, inside its ``except`` block)."""

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


def _never(error: BaseException, frames: list[str]) -> bool:
    """For a library's error records that are noise only when they are failed writes (``_Drop``)."""
    return False


def _stale_prune(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Error handling checkpoint" when an old checkpoint it prunes (``num_to_keep``) is already gone:
    a driver killed mid-prune had deleted it, so a resumed job tries again. The new checkpoint is registered
    before the prune, so nothing is lost. (A URI storage's: on local disk prunes wait, ``tune.storage.HeldPrunes``.)"""
    return isinstance(error, FileNotFoundError) and "_delete_fs_path" in frames


def _superseded_sync(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Saving experiment state to storage … failed" when the copy of its driver folder to the study
    folder found one of Tune's own temporary files (``…-tmp-…``) gone: Tune saves the next state (a temporary
    file renamed into place) before it waits for the previous copy, which may have listed that file. The
    copy Tune starts next carries the renamed file and reports its own failure (seen once in CI, as a
    SIGTERM stopped a study: Tune's graceful stop saves, then starts and waits for a last copy)."""
    return isinstance(error, FileNotFoundError) and "_upload_to_fs_path" in frames and "-tmp-" in str(error)


NOISE: dict[str, tuple[Rule, ...]] = {
    "ray._private.authentication.authentication_token_setup": ((("Token authentication is enabled",), None),),
    "ray.tune.tune": (
        # Tune's advice on a stop, and its resume hint naming its Python API: fltune prints its own command
        (("Stop signal received", "Experiment has been interrupted"), None),
        (("Experiment state snapshotting failed",), _never),  # its last save, on a full storage
    ),
    "ray.tune.trainable.trainable": ((("Restored on",), None),),  # every resumed trial, in its worker
    "ray.tune.execution.tune_controller": ((("Trial %s: Error handling checkpoint",), _stale_prune),),
    "ray.tune.execution.experiment_state": ((("Saving experiment state to storage at ",), _superseded_sync),),
    # the metric tables of trials that never reported (a job stopped before they did), which fltune never
    # reads: it takes each trial's results from Tune's saved state (``Trial.last_result``)
    "ray.tune.analysis.experiment_analysis": ((("Failed to fetch metrics for",), None),),
    # its copies of the driver's files to a full or read-only storage: the job stops (``library_write_failure``)
    "ray.train._internal.syncer": ((("Last sync command failed",), _never),),
}
"""Logger → rules: how its records that are noise to an fltune user start, and the one case in which such an
error record is harmless (None: every such record is noise); the rest still show (``_Drop``)."""


def quiet_libraries() -> None:
    """Drop the library noise listed in ``NOISE``; workers get ``quiet_worker`` (Ray's setup hook).

    Also numpy's "All-NaN slice" warning: ASHA takes a percentile of the objectives at a rung, which are
    all NaN when every trial there diverged (the board already says so, trial by trial)."""
    warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
    for name, rules in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(rules))


def quiet_worker() -> None:
    """In every Ray worker of an fltune job (Ray's ``worker_process_setup_hook``).

    A SIGTERM from Ray (a trial stopped by ASHA, an ended job) raises ``SystemExit`` wherever the worker
    is; inside a weakref callback Python cannot raise it and prints "Exception ignored in … SystemExit"
    with a traceback instead. That report is dropped; every other one still prints. ``NOISE`` too.
    (Ctrl-C needs nothing here: Ray starts its processes with SIGINT blocked; the driver stops them.)"""
    quiet_libraries()

    def hook(unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, SystemExit):
            sys.__unraisablehook__(unraisable)

    sys.unraisablehook = hook


def library_write_failure() -> WriteFailed | None:
    """The first write that failed inside a library since the last call (``_Drop``), else None: a Tune job
    stops on it (``tune.study.StopOnFailedWrite``)."""
    failed = _failed_writes[0] if _failed_writes else None
    _failed_writes.clear()
    return failed


# ---------------------------------------------------------------------------------------------- stop
def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM does what Ctrl-C does at this moment: Tune's graceful stop while a job runs, else
    ``KeyboardInterrupt``."""
    _stopped_by.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, frame)
    else:
        raise KeyboardInterrupt


def handle_stop_signals() -> None:
    """(Re)install fltune's SIGTERM handler; call at start and after anything that installs its own (Ray).

    Also the signal wake-up pipe that ``_watch_signals`` reads: Python runs a signal's handler in the main
    thread only between bytecodes, and a driver blocked in a call to Ray's GCS (Tune registering a trainable,
    sizing the cluster) never gets there once a process-group SIGTERM has killed the GCS — Ray's core worker
    ends it 60 s later with status 1. The interpreter's C-level handler writes each signal's number to
    this pipe at once, whatever the main thread is doing."""
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
    """A stop raised where Python cannot raise is delivered again instead of lost.

    Python runs a signal's handler in the main thread at the next bytecode, which may be a weakref callback
    or a ``__del__`` that garbage collection is running; a ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM through
    ``_on_sigterm``) raised there is printed as "Exception ignored in …" and dropped, and the command went on
    to its end, status 0 (a comparison stopped between two studies ran every study and cell after it). The
    hook has a thread re-send SIGINT to the main thread 10 ms later (``_thread.interrupt_main``), past the
    finalizer (one still running gets it again, and the hook sends it again): whatever handles SIGINT then
    (the default ``KeyboardInterrupt``, or Tune's stop during a job) gets it. Every other report goes to the
    hook that was there before."""
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
    """Make Ctrl-C (SIGINT) a stop at every moment of the command, also in a process that started with it
    ignored: a non-interactive shell starts its background jobs so, and Python then leaves it ignored.
    Tune's ``fit`` installs its own handler whatever the disposition, so such a driver took a SIGINT during
    a Tune job and lost one between two (a comparison went on into its next study and ran to the end,
    status 0). A handler already installed is kept."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _watch_signals(read: int) -> None:
    """Every stop signal's arrival (``_arrived``), whichever handler then takes it, for the process's life
    (tests run several commands in one); from a SIGTERM on, the last resort of whatever Tune job is running
    (``_end_if_ray_died``, on a thread of its own: this one goes on reading)."""
    last_resort: threading.Thread | None = None
    while True:
        got = os.read(read, 64)
        _arrived.extend(signum for signum in got if signum in (signal.SIGINT, signal.SIGTERM))
        if signal.SIGTERM in got and (last_resort is None or not last_resort.is_alive()):
            last_resort = threading.Thread(target=_end_if_ray_died, args=(signal.SIGTERM,), daemon=True,
                                           name="fltune-last-resort")
            last_resort.start()


def forget_stops() -> None:
    """A new command starts with no stop received (tests run several in one process)."""
    _arrived.clear()


def stop_arrived() -> bool:
    """Whether a stop signal (Ctrl-C, SIGTERM) reached this driver. A Tune job can take one and still end
    complete: Tune's handler only sets its stop event, which nothing reads once the last trial has ended
    (a Ctrl-C during its final checkpoint, or a job resumed with nothing left to run), so the command used
    to go on to its next job as if none had come (a comparison stopped between two studies ran to its end,
    status 0). The wake-up pipe sees every signal, whatever handler takes it."""
    return bool(_arrived)


@contextmanager
def ending_if_ray_dies(cleanup: Callable[[], None], resume: str) -> Iterator[None]:
    """Within this block a SIGTERM that also ends the local Ray ends the job by its last resort (see
    ``_end_if_ray_died``): ``cleanup``, then one line naming ``resume``, the command that continues it.
    Blocks nest (a comparison around each of its Tune jobs): every clean-up runs, the outermost line
    prints. Outside every block the driver ends its own way (Ray shutting down at exit is no reason)."""
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
    """Whatever handles SIGINT and SIGUSR1 before the block handles them after it.

    Tune's ``fit`` installs a handler of its own for both that sets its stop event and puts the old one
    back only when a signal arrives. After a job that ran to its end that handler stays, stale: in a
    command that runs several Tune jobs (a comparison tunes each method in turn), a Ctrl-C or SIGTERM
    between two jobs would set the finished job's event and be lost, and the driver would go on into the
    next job — where, after a process-group SIGTERM, its first call to the dying GCS ends the process
    with a Ray stack trace and status 1 instead of 143 and the line to resume with."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGUSR1)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def _end_if_ray_died(signum: int, poll_s: float = 0.1) -> None:
    """A SIGTERM sent to the whole process group (``timeout``, Slurm) also ends the local Ray this driver
    started; then Tune's graceful stop can never finish, and Ray's core worker would end the process with
    status 1. So from the signal on, watch the local Ray (``_ray_alive``): the moment it is going, inside
    an ``ending_if_ray_dies`` block, end the job here: its clean-ups (its MLflow runs → KILLED; its
    folder resumes as after a crash), its line, 128 + the signal. Watching rather than looking once:
    under load Ray takes a while to go. A cluster that was joined (no local node), or a local one that
    survives (SIGTERM to the driver only), leaves the graceful stop to finish."""
    node = _local_ray()
    if node is None:
        return
    while _ray_alive(node):
        time.sleep(poll_s)
    with _last_resort_lock:
        if not _last_resort:
            return
        whole = _within(CLEAN_UP_S, [cleanup for cleanup, _ in reversed(_last_resort)])
        cut = "" if whole else f"; its clean-up took over {CLEAN_UP_S:g} s, so MLflow may show its runs RUNNING"
        say_resume(interrupted(signum) + cut, _last_resort[0][1])
        os._exit(128 + signum)


def _within(seconds: float, calls: list[Callable[[], None]]) -> bool:
    """``calls`` in order on a thread of their own, waited for ``seconds`` at most (``CLEAN_UP_S``); whether
    they all ended. A clean-up that waits on a lock (MLflow's sqlite store, retried for two minutes) held
    the last resort past the moment Ray's core worker ends the process: status 1 and no line (a CI run;
    reproduced by locking the store as the SIGTERM lands). One that raises prints its traceback, as any
    thread's exception does, and the rest still run."""

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
    """A command that started a local Ray ends here with ``code``, once its raylet has stopped, its output
    flushed, skipping the interpreter's exit. The run's MLflow writes and files were done before ``main``
    returned; what is skipped is what the user waited for after the last line: Ray's shutdown at exit,
    which sleeps 0.5 s and then stops its services one by one, waiting up to a second for each, and Python
    collecting every object torch, Ray and MLflow made. The raylet is stopped as Ray's shutdown stops it
    (SIGTERM, then waited for): it ends the workers and agents it started, which would otherwise linger a
    minute; the GCS and Ray's other services are this process's children, which Ray binds to it (its fate
    sharing), so they end with it. A stopped command whose local Ray died under it (a process-group
    SIGTERM) ends at once: Ray's shutdown would wait a minute for the dead GCS, then end the process with
    status 1. A driver that joined a cluster leaves the usual way (Ray disconnects it)."""
    node = _local_ray()
    if node is None:
        return
    if not (_stopped_by and not _ray_alive(node)):
        from ray._private.ray_constants import PROCESS_TYPE_RAYLET

        for info in node.all_processes.get(PROCESS_TYPE_RAYLET, []):
            info.process.terminate()
            try:
                info.process.wait(timeout=RAYLET_STOP_S)
            except subprocess.TimeoutExpired:  # ends with this process (Ray's fate sharing)
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _local_ray() -> Any:
    """The local Ray node this driver started (its processes are ours to watch), else None; a command
    that never imported Ray (bad input refused first) started none, and imports none here."""
    ray = sys.modules.get("ray")
    return None if ray is None else getattr(ray._private.worker, "_global_node", None)


def _ray_alive(node: Any) -> bool:
    """Whether the local raylet and GCS server still run and the GCS still accepts connections: on SIGTERM
    it closes its port at once, seconds (under load, sometimes over a minute) before its process is gone."""
    from ray._private.ray_constants import PROCESS_TYPE_GCS_SERVER, PROCESS_TYPE_RAYLET

    if any(info.process.poll() is not None for kind in (PROCESS_TYPE_RAYLET, PROCESS_TYPE_GCS_SERVER)
           for info in node.all_processes.get(kind, [])):
        return False
    host, port = node.gcs_address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def terminated() -> bool:
    """Whether a SIGTERM reached this process: it may have killed a Tune job's trials too, when it was sent
    to the whole process group (``tune.job.unfinished_if_stopped``)."""
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
    """A stopped job's line: what stopped and the command that continues it, printed whole (never wrapped
    to the terminal's width) so that it can be copied, and found by scripts."""
    print(f"fltune: {what}; continue it with: {resume}", file=sys.stderr, flush=True)

