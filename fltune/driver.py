"""What the long commands share around their work: quiet library output, one clean way to stop, and the
scaffold of a Ray Tune job (``tune`` and ``reproduce``).

Stopping. Ctrl-C (SIGINT) and SIGTERM (what ``timeout``, schedulers, Kubernetes and ``ray job stop``
send) take one path: a plain run gets ``KeyboardInterrupt`` (its MLflow run ends KILLED, its workers
stop), a Tune job gets Tune's own graceful stop (trials checkpointed, the study saved for ``--resume``).
The exit status says which signal it was: 128 + its number (130, 143). Ray installs handlers of its
own in the driver when it starts — a Python one that turns SIGTERM into ``SystemExit`` and a C++ one
that dumps a stack trace and aborts — so ours is installed again right after Ray starts.

Quiet. Ray's banner about token authentication (the security default stays on) and Tune's "stop
signal received" advice are dropped; a worker that Ray ends with SIGTERM (a trial stopped early by ASHA,
an interrupted job) no longer prints ``SystemExit`` tracebacks. Real errors are untouched.
"""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fltune.errors import FLTuneError
from fltune.folders import make_out

if TYPE_CHECKING:  # Ray Tune and MLflow load only when a command runs
    from ray.tune import PlacementGroupFactory, Tuner
    from ray.tune.experiment import Trial

    from fltune.config import ExperimentConfig, TrackingConfig
    from fltune.tune.board import TrialBoard
    from fltune.tune.mlflow_runs import RunTree
    from fltune.tune.results import TrialRow
    from fltune.tune.spec import SavedSpec

JOB_ENV = {
    # with verbose=0 and the old output engine Tune prints nothing: the board is the job's output
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune snapshots its state every `num_to_keep` trial checkpoints (so a resume never points at a deleted
    # one) and warns when that is frequent: with a checkpoint per round it is, by design
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Tune logs every failed attempt's whole traceback; fltune says each restart in a line (the board's
    # on_trial_recover) and why trials failed in one line per reason at the end (say_failures)
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
}

CHATTER = {
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",),
    # Tune's advice on a stop, and its resume hint naming its Python API: fltune prints its own command
    "ray.tune.tune": ("Stop signal received", "Experiment has been interrupted"),
    "ray.tune.trainable.trainable": ("Restored on",),  # every resumed trial, in its worker
}
"""Logger → how the messages of it that are noise to an fltune user start (the rest still show)."""

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
class _DropChatter(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


class _DropHarmless(logging.Filter):
    """Drop a library's error record (one that starts with ``start`` and carries a traceback) in the one case
    ``harmless`` recognises from its exception and the names of its traceback's frames; every other error of
    that kind still shows, with its traceback."""

    def __init__(self, start: str, harmless: Callable[[BaseException, list[str]], bool]) -> None:
        super().__init__()
        self.start, self.harmless = start, harmless

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.start) or not record.exc_info:
            return True
        _, error, trace = record.exc_info
        return not self.harmless(error, [frame.name for frame in traceback.extract_tb(trace)])


def _stale_prune(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Error handling checkpoint" when an old checkpoint it prunes (``num_to_keep``) is already gone:
    a driver killed mid-prune had deleted it, so a resumed job tries again. The new checkpoint is registered
    before the prune, so nothing is lost."""
    return isinstance(error, FileNotFoundError) and "_delete_fs_path" in frames


def _superseded_sync(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Saving experiment state to storage … failed" when the copy of its driver folder to the study
    folder found one of Tune's own temporary files (``…-tmp-…``) gone: Tune saves the next state (a temporary
    file renamed into place) before it waits for the previous copy, which may have listed that file. The
    copy Tune starts next carries the renamed file and reports its own failure (seen once in CI, as a
    SIGTERM stopped a study: Tune's graceful stop saves, then starts and waits for a last copy)."""
    return isinstance(error, FileNotFoundError) and "_upload_to_fs_path" in frames and "-tmp-" in str(error)


HARMLESS = {
    "ray.tune.execution.tune_controller": ("Trial %s: Error handling checkpoint", _stale_prune),
    "ray.tune.execution.experiment_state": ("Saving experiment state to storage at ", _superseded_sync),
}
"""Logger → (how its error record starts, the case in which it is harmless): see ``_DropHarmless``."""


def quiet_libraries() -> None:
    """Drop the library chatter listed in ``CHATTER``; workers get ``quiet_worker`` (Ray's setup hook).

    Also numpy's "All-NaN slice" warning: ASHA takes a percentile of the objectives at a rung, which are
    all NaN when every trial there diverged (the board already says so, trial by trial)."""
    warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
    for name, prefixes in CHATTER.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropChatter) for f in logger.filters):
            logger.addFilter(_DropChatter(prefixes))
    for name, (start, harmless) in HARMLESS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropHarmless) for f in logger.filters):
            logger.addFilter(_DropHarmless(start, harmless))


def quiet_worker() -> None:
    """In every Ray worker of an fltune job (Ray's ``worker_process_setup_hook``).

    A SIGTERM from Ray (a trial stopped by ASHA, an ended job) raises ``SystemExit`` wherever the worker
    is; inside a weakref callback Python cannot raise it and prints "Exception ignored in … SystemExit"
    with a traceback instead. That report is dropped; every other one still prints. ``CHATTER`` too.
    (Ctrl-C needs nothing here: Ray starts its processes with SIGINT blocked; the driver stops them.)"""
    quiet_libraries()

    def hook(unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, SystemExit):
            sys.__unraisablehook__(unraisable)

    sys.unraisablehook = hook


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
    import time

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


def exit_now_if_ray_died(code: int) -> None:
    """A stopped command whose local Ray died under it (a process-group SIGTERM) ends here with ``code``:
    Ray's shutdown at exit would wait a minute for the dead GCS, then end the process with status 1."""
    node = _local_ray() if _stopped_by else None
    if node is not None and not _ray_alive(node):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _local_ray() -> Any:
    """The local Ray node this driver started (its processes are ours to watch), else None."""
    import ray

    return getattr(ray._private.worker, "_global_node", None)


def _ray_alive(node: Any) -> bool:
    """Whether the local raylet and GCS server still run and the GCS still accepts connections: on SIGTERM
    it closes its port at once, seconds (under load, sometimes over a minute) before its process is gone."""
    import socket

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


def unfinished_if_stopped(rows: list[TrialRow]) -> list[TrialRow]:
    """After a stop signal, trials that ended in error count as unfinished ("pending"): a signal sent to
    the whole process group (``timeout``, Slurm) kills trials' processes too, and Tune may record such a
    trial as failed before its graceful stop pauses it. The job then concludes interrupted, and
    ``--resume`` runs those trials again from their last checkpoints (``resume_errored``)."""
    if not _stopped_by:
        return rows
    return [replace(row, status="pending") if row.status == "failed" else row for row in rows]


def say_failures(trials: list[Trial]) -> None:
    """Why trials failed (after Tune's retries), one line per reason (``results.failure_lines``); nothing
    after a stop signal, whose killed trials are resumed rather than failed (``unfinished_if_stopped``)."""
    from ray.tune.experiment import Trial

    from fltune.tracking.progress import console
    from fltune.tune.results import failure_lines

    if _stopped_by:
        return
    traces = [(trial.path, _trace(trial)) for trial in trials if trial.status == Trial.ERROR]
    refused = [str(trial.last_result["error"]) for trial in trials
               if trial.status != Trial.ERROR and (trial.last_result or {}).get("status") == "failed"]
    for line in failure_lines(traces, refused):
        console.print(line, markup=False, soft_wrap=True)


def _trace(trial: Trial) -> str:
    """The trial's error trace as Tune kept it ("" when it kept none, or its storage cannot be read)."""
    try:
        return trial.get_error() or ""
    except OSError:
        return ""


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


def stop_message() -> str:
    """The one line a stopped command prints when there is nothing to continue (else ``say_resume``)."""
    return f"fltune: {interrupted()}"


def say_resume(what: str, resume: str) -> None:
    """A stopped job's line: what stopped and the command that continues it, printed whole (never wrapped
    to the terminal's width) so that it can be copied, and found by scripts."""
    print(f"fltune: {what}; continue it with: {resume}", file=sys.stderr, flush=True)


def start_ray(address: str | None) -> bool:
    """Start or join Ray (one clear line when there is nothing to join), then take the signals back.
    True when this started a local Ray of its own (``cluster.ensure_ray``)."""
    from fltune.engine.cluster import ensure_ray

    check_gcs(address or os.environ.get("RAY_ADDRESS"))
    try:
        started = ensure_ray(address)
    except ConnectionError as err:  # no cluster there, or several and no address to choose one
        raise FLTuneError(f"--address {address or '$RAY_ADDRESS'}: {err}") from None
    handle_stop_signals()
    return started


def check_gcs(address: str | None) -> None:
    """A cluster address of the form ``host:port`` (a head's GCS) accepts connections: for one where nothing
    listens, ``ray.init`` retries for many minutes, printing a warning every few seconds. Other forms
    (``auto``, ``local``, ``ray://…``) are left to Ray, which answers them at once."""
    import socket

    if not address or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise FLTuneError(f"--address {address}: the port is not a number; allowed: host:port of a Ray head's GCS")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise FLTuneError(f"--address {address}: no Ray cluster answers there ({reason}); allowed: host:port of "
                          "a running Ray head's GCS (ray start --head), auto, or none for a local Ray") from None


def check_data(configs: Iterable[ExperimentConfig]) -> None:
    """Before a job starts Ray: every dataset its trials load is here, and every distinct setting of them
    partitions into data that serves its run. Each trial would otherwise fail on a missing dataset, a client
    left without training samples or a split too small for its probes (``check_probes``), after Ray and the
    job had started, and the job end with nothing run; here it is one line (``data.dataset: … not found
    in …; pass --set data.root=…``, ``partition.eval_fraction: …``). With ``data.download`` the files are
    fetched now, once, rather than by every trial at once into the same folder. The partitions land in the
    trials' disk cache; nothing stays loaded in the driver (its data are the trials')."""
    from fltune.data.datasets import load_dataset, release_loaded
    from fltune.engine.builders import load_data
    from fltune.metrics.probe import check_probes

    configs = list(configs)
    try:
        for name, root, download in dict.fromkeys((c.data.dataset, c.data.root, c.data.download) for c in configs):
            load_dataset(name, root, download)
        for cfg in {split_setting(c): c for c in configs}.values():
            check_probes(cfg, load_data(cfg))
    finally:
        release_loaded()


def split_setting(cfg: ExperimentConfig) -> str:
    """What a run's partitioned data, and what its probes need of them, depend on: runs that agree here
    (methods, learning rates) are checked once."""
    return cfg.model_dump_json(include={"data", "partition", "federation", "metrics"})


# ---------------------------------------------------------------------------------------------- jobs
CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS = 25, 60.0
"""A job cell's default checkpoint cadence (reproduce, compare): paper-scale cells run hundreds of rounds,
and a checkpoint of a personalised method's state costs more than its round."""


def check_cadence(args: argparse.Namespace) -> None:
    """``--checkpoint-every`` ≥ 1 and ``--checkpoint-seconds`` > 0 when given."""
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise FLTuneError(f"--checkpoint-every: {args.checkpoint_every}; allowed: ≥ 1")
    if args.checkpoint_seconds is not None and not args.checkpoint_seconds > 0:
        raise FLTuneError(f"--checkpoint-seconds: {args.checkpoint_seconds:g}; allowed: > 0")


def add_checkpoint_args(p: argparse.ArgumentParser, rounds_default: str, seconds_default: str) -> None:
    """The checkpoint cadence of a Tune job's trials (``trainable.Cadence``), shared by tune and reproduce."""
    p.add_argument("--checkpoint-every", type=int, metavar="ROUNDS",
                   help=f"checkpoint each trial every ROUNDS rounds, always at the end (default: {rounds_default})")
    p.add_argument("--checkpoint-seconds", type=float, metavar="S",
                   help=f"also checkpoint once S seconds have passed since the last one (default: {seconds_default})")


def keep_on_resume(p: argparse.ArgumentParser, *dests: str) -> None:
    """Mark the flags of ``p`` that shape a job (its cells, trials, seeds, cadence): a resumed job runs the
    settings it saved instead, so ``note_ignored_on_resume`` names those given anyway. Their defaults are
    recorded here, so a flag left alone is told apart from one the user set."""
    p.set_defaults(kept_on_resume={dest: p.get_default(dest) for dest in dests})


def note_ignored_on_resume(args: argparse.Namespace, what: str) -> None:
    """One note naming the job-shaping flags given to ``--resume`` (``keep_on_resume``): they change nothing,
    and saying so beats a user believing the continued job runs the new settings."""
    from fltune.tracking.progress import console

    given = [_flag(dest) for dest, default in args.kept_on_resume.items() if getattr(args, dest) != default]
    if given:
        console.print(f"note: a resumed {what} keeps the settings it started with; ignored: {', '.join(given)}")


def _flag(dest: str) -> str:
    return "--set" if dest == "overrides" else f"--{dest.replace('_', '-')}"


def storage_root(storage: str | None) -> str:
    """Where jobs live: a URI as given, a local path made absolute (Ray requires it); default
    ``<repo>/studies`` next to ``mlruns`` (a source checkout keeps its jobs in one place). A ``file://``
    URI is the local folder it names, so its job files are written whole too (``tune.storage``)."""
    from fltune.tracking.paths import mlruns_dir

    storage = storage or str(mlruns_dir().parent / "studies")
    if "://" not in storage:
        return str(Path(storage).expanduser().resolve())
    import pyarrow.fs

    try:  # a remote store that cannot be reached fails here, in one line, not inside Tune
        fs, folder = pyarrow.fs.FileSystem.from_uri(storage)
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            return str(Path(folder).resolve())
        fs.get_file_info(folder)
    except (OSError, ValueError) as err:
        raise FLTuneError(f"--storage {storage}: {str(err)[:200]}; allowed: a local folder, or a URI of a "
                          "filesystem pyarrow can reach (s3://, gs://, hdfs://)") from None
    return storage


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise FLTuneError(f"--name {name!r}: allowed: letters, digits, '.', '_' and '-'")
    return name


def holds(path: str, name: str) -> bool:
    """Whether the folder at ``path`` holds the file ``name``, on any pyarrow filesystem."""
    import pyarrow.fs

    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(f"{folder}/{name}").type == pyarrow.fs.FileType.File


def exists(path: str) -> bool:
    """Whether ``path`` holds an fltune job (its saved spec), on any pyarrow filesystem."""
    from fltune.tune.spec import SPEC_FILE

    return holds(path, SPEC_FILE)


def tune_started(path: str) -> bool:
    """Whether Tune saved the state of the job at ``path`` (``experiment_state-*.json``), on any pyarrow
    filesystem. A Tuner writes itself (``tuner.pkl``, all ``Tuner.can_restore`` looks for) before its
    first state; restoring a job stopped in between starts trials without their configurations, so such
    a job starts afresh instead."""
    import pyarrow.fs

    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    found = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    return any(info.base_name.startswith("experiment_state-") for info in found)


def tuner_whole(path: str) -> bool:
    """Whether the Tuner that Tune saved in the job at ``path`` (``tuner.pkl``) reads back. fltune writes
    job folders whole (``tune.storage``), but a job saved before that, or copied cut, may hold an empty or
    truncated one (ray-project/ray#58179): ``Tuner.restore`` then fails on it, though the job's trials,
    checkpoints and searcher state are all there."""
    import pickle

    import pyarrow.fs

    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    try:
        with fs.open_input_stream(f"{folder}/tuner.pkl") as saved:
            pickle.loads(saved.readall())
    except (OSError, EOFError, pickle.UnpicklingError):
        return False
    return True


Spec = TypeVar("Spec", bound="SavedSpec")


def newest(spec_class: type[Spec], storage: str, what: str, keep: Callable[[Spec], bool] = lambda _: True) -> Spec:
    """The most recently created job of ``spec_class`` under ``storage`` that ``keep`` accepts: what
    ``--resume`` without ``--name`` continues."""
    import pyarrow.fs

    from fltune.tune.spec import SPEC_FILE

    fs, folder = pyarrow.fs.FileSystem.from_uri(storage)
    found: list[tuple[Any, Spec]] = []
    for info in fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True)):
        saved = fs.get_file_info(f"{info.path}/{SPEC_FILE}")
        if saved.type != pyarrow.fs.FileType.File:
            continue
        try:
            spec = spec_class.load(f"{storage.rstrip('/')}/{info.base_name}")
        except FLTuneError:  # another kind of job
            continue
        if keep(spec):
            found.append((saved.mtime, spec))
    if not found:
        raise FLTuneError(f"--resume: no {what} under {storage}; pass --name")
    return max(found, key=lambda pair: pair[0])[1]


def with_gpu_share(spec: Spec, cluster: dict[str, float], cpus_per_worker: float, max_concurrent: int | None) -> Spec:
    """Pin ``gpus_per_worker`` once (a job keeps it on resume). Unset, the cluster's GPUs are shared by
    the client workers of the trials that run at once: as many as ``max_concurrent`` allows *and* the
    CPUs fit. Dividing by ``max_concurrent`` alone starves the GPU when the CPUs fit fewer trials;
    dividing by the CPU fit alone does when ``--max-concurrent`` allows fewer."""
    if spec.gpus_per_worker is not None:
        return spec
    gpus = cluster.get("GPU", 0.0)
    fit = max(1, int(cluster.get("CPU", 0.0) // (spec.workers * cpus_per_worker)))
    at_once = min(fit, max_concurrent or fit)
    return spec.model_copy(update={"gpus_per_worker": min(1.0, gpus / (spec.workers * at_once)) if gpus else 0.0})


class TuneJob(ABC, Generic[Spec]):
    """One kind of fltune Tune job (a study, a paper-table reproduction) in the shared driver ``run``."""

    what = "job"
    """How messages name the job."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @abstractmethod
    def new_spec(self, storage: str) -> Spec:
        """A fresh job from the command line, validated before Ray starts."""

    @abstractmethod
    def saved_spec(self, storage: str) -> Spec:
        """The job ``--resume`` continues (``--name``, else the newest of its kind)."""

    @abstractmethod
    def experiment(self, spec: Spec) -> dict[str, Any]:
        """An experiment tree of the job's trials (their resources are the same)."""

    @abstractmethod
    def max_concurrent(self, spec: Spec) -> int | None:
        """Trials at once (None: as many as fit)."""

    @abstractmethod
    def tracking(self, spec: Spec) -> TrackingConfig:
        ...

    def trial_configs(self, spec: Spec) -> list[ExperimentConfig]:
        """The settings of the job's trials (jobs of cells: every cell's; studies: their base), whose data
        are checked before Ray starts (``check_data``)."""
        from fltune.config import build_config

        return [build_config(self.experiment(spec))]

    @abstractmethod
    def new_tuner(self, spec: Spec, resources: PlacementGroupFactory) -> Tuner:
        """A new Tuner of the job, with ``callbacks``."""

    def callbacks(self, spec: Spec) -> list[Any]:
        """The terminal board always; MLflow only when tracking is on (off, MLflow is never imported)."""
        board = self.board(spec)
        if not self.tracking(spec).enabled:
            return [board]
        from fltune.tune.mlflow_runs import MLflowStudyCallback

        return [board, MLflowStudyCallback(spec, self.run_tree())]

    def board(self, spec: Spec) -> TrialBoard:
        """The live board: the trials ranked (jobs of cells draw their cells instead)."""
        from fltune.tune.board import TrialBoard

        return TrialBoard(spec)

    def run_tree(self) -> type[RunTree]:
        """The MLflow runs the job keeps: a parent and a child per trial (jobs of cells: per cell)."""
        from fltune.tune.mlflow_runs import StudyLog

        return StudyLog

    @abstractmethod
    def restored_tuner(self, spec: Spec, resources: PlacementGroupFactory) -> Tuner:
        ...

    def out(self, spec: Spec) -> str | None:
        """The folder of the job's result files besides its job folder (``--out``); None: it has none."""
        return None

    @abstractmethod
    def describe(self, spec: Spec, nodes: int) -> str:
        """The job's first line(s) on the terminal."""

    @abstractmethod
    def resume_command(self, spec: Spec) -> str:
        """The command line that continues the job."""

    @abstractmethod
    def conclude(self, spec: Spec, rows: list[TrialRow]) -> int:
        """Results, files and the exit status (130 when trials are left to resume)."""

    def resuming(self) -> bool:
        """Whether ``prepare`` continues a saved job (``--resume``) rather than creating one."""
        return bool(self.args.resume)

    def prepare(self) -> tuple[Spec, Tuner, int]:
        """Validate (before Ray starts), join or start Ray, size the trials, then create or restore the
        Tuner; also the number of Ray nodes."""
        from fltune.config import build_config
        from fltune.tracking.paths import check_tracking
        from fltune.tune import study

        storage = storage_root(self.args.storage)
        spec = self.saved_spec(storage) if self.resuming() else self.new_spec(storage)
        if not self.resuming() and exists(spec.path):
            raise FLTuneError(f"--name {spec.name}: {self.what} {spec.path} already exists; "
                              "add --resume to continue it")
        check_data(self.trial_configs(spec))
        if (out := self.out(spec)) is not None:
            make_out(out)
        check_tracking(self.tracking(spec))
        tree = self.experiment(spec)
        start_ray(self.args.address or build_config(tree).resources.address)
        cluster, node_cpus = study.cluster_shape()
        spec = with_gpu_share(spec, cluster, build_config(tree).resources.cpus_per_worker, self.max_concurrent(spec))
        resources = study.placement(tree, spec.workers, spec.gpus_per_worker, cluster, node_cpus)
        if self.resuming() and tune_started(spec.path):
            if not tuner_whole(spec.path):  # a new Tuner of the saved spec writes it again, as it was
                self.new_tuner(spec, resources)
            tuner = self.restored_tuner(spec, resources)
        else:
            if not self.resuming():
                spec.save()
            tuner = self.new_tuner(spec, resources)
        return spec, tuner, len(node_cpus)

    def close_runs(self, spec: Spec) -> None:
        """End the job's MLflow runs still RUNNING as KILLED (the driver is going down)."""
        from fltune.tune.mlflow_runs import close_open_runs

        if self.tracking(spec).enabled:
            close_open_runs(self.tracking(spec), spec.path, "killed")

    def run(self) -> int:
        """The whole command: prepare, fit, and conclude from the job folder's final state — every trial,
        also those a stop left pending or running. A driver that dies of an exception ends its MLflow
        runs KILLED (Tune's own clean-up ends them in every other case)."""
        from ray.tune import ExperimentAnalysis

        from fltune.tracking.progress import console
        from fltune.tune.results import trial_row

        for key, value in JOB_ENV.items():
            os.environ.setdefault(key, value)
        spec, tuner, nodes = self.prepare()
        console.print(self.describe(spec, nodes))
        with ending_if_ray_dies(lambda: self.close_runs(spec), self.resume_command(spec)):
            try:
                with signal_handlers_kept():
                    tuner.fit()
            except BaseException:
                self.close_runs(spec)
                raise
        trials = ExperimentAnalysis(spec.path).trials
        say_failures(trials)
        code = self.conclude(spec, unfinished_if_stopped([trial_row(trial) for trial in trials]))
        if code != 130 and stop_arrived():  # a stop the job took after its last trial: the command ends here
            raise KeyboardInterrupt
        return code
