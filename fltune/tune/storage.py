"""Where fltune's jobs live (``<storage>/<name>``, on any pyarrow filesystem), what their folders hold, and
the filesystem Tune writes a job folder through: on local disk, every file is replaced whole or not at all.

Tune rewrites its state files in place. The driver keeps them in a staging folder and copies *all* of them
(``tuner.pkl``, ``experiment_state-*.json``, ``searcher-state-*.pkl``) to the job folder every few seconds,
truncating each before writing it (``_ExperimentCheckpointManager.sync_up_experiment_state``). A driver
killed mid-copy (SIGKILL, the OOM killer, a pre-empted node) leaves an empty or cut file, and the job can
no longer resume: ``Tuner.restore`` fails with ``EOFError: Ran out of input`` (ray-project/ray#58179).
Writing each file beside its target and renaming it into place when complete (``os.replace``, atomic on
POSIX) leaves the old version or the new one, never a mix. Remote stores (s3://, gs://) already publish
an object only when its upload completes, so Tune keeps its own filesystem for them.

Tune also deletes a trial's checkpoints beyond ``num_to_keep`` the moment a newer one registers, while the
job folder's state that names them is copied later (a forced copy waits for the driver's next step and for
the copy before it). A driver killed in between leaves a state whose trial resumes from a deleted
checkpoint ("Could not recover from checkpoint as it does not exist on storage anymore"), on every retry.
On local disk such deletions wait (``AtomicLocalFiles.delete_dir``) until the job folder holds a state
saved after them.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import threading
import time
from pathlib import Path

import fsspec
import pyarrow
import pyarrow.fs

from fltune.errors import FLTuneError
from fltune.folders import ReplaceOnClose, make_out
from fltune.tracking.paths import mlruns_dir


def write_whole(uri: str, data: bytes) -> None:
    """``data`` as the file at ``uri`` (a local path or a pyarrow URI), all or nothing.

    For fltune's own files in a job folder (its saved spec, its best configuration), which ``--resume``
    reads back. A stop can land mid-write: SIGTERM becomes ``KeyboardInterrupt`` between any two bytecodes
    (``process._on_sigterm``), and a file opened for writing is already truncated. Here the old file, or
    none, stays until the new one is complete."""
    if "://" in uri:  # a remote store publishes an object only when its upload completes
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    with ReplaceOnClose(uri) as out:
        out.write(data)


STATE_PREFIX = "experiment_state-"
CHECKPOINT = re.compile(r"checkpoint_\d+")


class HeldPrunes:
    """Trial checkpoints Tune pruned, held until the job folder holds a state saved after the prune.

    One per process: the driver deletes through the filesystem each checkpoint came back with (a copy
    unpickled from its trial), and copies its state through the one its storage holds. Tune's driver thread
    saves its state, then starts a copy only when the previous copy has ended (``_BackgroundSyncer``), and
    prunes on that thread between copies, never between a save and the start of its copy. So a copy that
    *opened* after a prune may still carry a state saved before it, but a copy that opens after that one
    *ended* was started, and so saved, after the prune: once it ends, no state in the job folder names the
    checkpoint. A driver killed while it holds some leaves them on disk: superseded checkpoints, never a
    missing one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: list[tuple[str, float]] = []  # (checkpoint, when pruned)
        self._passed: list[tuple[str, float]] = []  # (checkpoint, when the first copy opened after it ended)

    def hold(self, path: str) -> None:
        with self._lock:
            self._asked.append((path, time.monotonic()))

    def state_copied(self, opened: float, ended: float) -> None:
        """A copy of the job state, opened and ended (whole) at these ``time.monotonic()`` times."""
        with self._lock:
            ready = [path for path, since in self._passed if opened > since]
            self._passed = [(path, since) for path, since in self._passed if opened <= since]
            self._passed += [(path, ended) for path, asked in self._asked if opened > asked]
            self._asked = [(path, asked) for path, asked in self._asked if opened <= asked]
        self._delete(ready)

    def release(self) -> None:
        """Delete every held checkpoint: Tune's last save of a job whose run ended (``tune.py``: it saves
        and waits for the copy after its loop, also when stopped) came after every prune."""
        with self._lock:
            ready = [path for path, _ in self._asked + self._passed]
            self._asked, self._passed = [], []
        self._delete(ready)

    @staticmethod
    def _delete(paths: list[str]) -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


PRUNES = HeldPrunes()


class AtomicLocalFiles(pyarrow.fs.FSSpecHandler):
    """Local files whose writes are all-or-nothing (``ReplaceOnClose``), and trial checkpoints that Tune
    prunes held until no saved job state names them (``HeldPrunes``); everything else is fsspec's local
    filesystem as pyarrow wraps it. Picklable, so Tune ships it to trials with their storage."""

    def __init__(self) -> None:
        super().__init__(fsspec.filesystem("file"))

    def open_output_stream(self, path: str, metadata: dict | None) -> pyarrow.NativeFile:
        if Path(path).name.startswith(STATE_PREFIX):
            return pyarrow.PythonFile(StateCopy(path), mode="w")
        return pyarrow.PythonFile(ReplaceOnClose(path), mode="w")

    def delete_dir(self, path: str) -> None:
        if CHECKPOINT.fullmatch(Path(path).name):
            PRUNES.hold(path)
        else:
            super().delete_dir(path)


class StateCopy(ReplaceOnClose):
    """A copy of Tune's job state into the job folder, which tells ``PRUNES`` when it opened and ended whole."""

    def __init__(self, path: str) -> None:
        self.opened = time.monotonic()
        super().__init__(path)

    def close(self) -> None:
        whole = not self.closed and not self.failed
        super().close()
        if whole and os.path.exists(self.target):
            PRUNES.state_copied(self.opened, time.monotonic())


def job_filesystem(storage: str) -> pyarrow.fs.FileSystem | None:
    """What Tune should write ``storage`` through: all-or-nothing files for a local folder (``storage``
    is then a plain absolute path, as ``storage_root`` makes it); None for a URI, which Tune
    resolves itself."""
    if "://" in storage:
        return None
    return pyarrow.fs.PyFileSystem(AtomicLocalFiles())


def storage_root(storage: str | None) -> str:
    """Where jobs live: a URI as given, a local path made absolute (Ray requires it); default
    ``<repo>/studies`` next to ``mlruns`` (a source checkout keeps its jobs in one place). A ``file://``
    URI is the local folder it names, so its job files are written whole too (``job_filesystem``)."""
    storage = storage or str(mlruns_dir().parent / "studies")
    if "://" not in storage:
        return str(Path(storage).expanduser().resolve())
    try:  # a remote store that cannot be reached fails here, in one line, not inside Tune
        fs, folder = pyarrow.fs.FileSystem.from_uri(storage)
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            return str(Path(folder).resolve())
        fs.get_file_info(folder)
    except (OSError, ValueError) as err:
        raise FLTuneError(f"--storage {storage}: {str(err)[:200]}; allowed: a local folder, or a URI of a "
                          "filesystem pyarrow can reach (s3://, gs://, hdfs://)") from None
    return storage


def check_storage(storage: str) -> None:
    """Before a job starts work: a local ``storage`` can be written and has room (``folders.make_out``); a
    URI was reached by ``storage_root``."""
    if "://" not in storage:
        make_out(storage, "--storage")


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise FLTuneError(f"--name {name!r}: allowed: letters, digits, '.', '_' and '-'")
    return name


def holds(path: str, name: str) -> bool:
    """Whether the folder at ``path`` holds the file ``name``, on any pyarrow filesystem."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(f"{folder}/{name}").type == pyarrow.fs.FileType.File


def tune_started(path: str) -> bool:
    """Whether Tune saved the state of the job at ``path`` (``experiment_state-*.json``), on any pyarrow
    filesystem. A Tuner writes itself (``tuner.pkl``, all ``Tuner.can_restore`` looks for) before its
    first state; restoring a job stopped in between starts trials without their configurations, so such
    a job starts afresh instead."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    found = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    return any(info.base_name.startswith(STATE_PREFIX) for info in found)


def tuner_whole(path: str) -> bool:
    """Whether the Tuner that Tune saved in the job at ``path`` (``tuner.pkl``) reads back. fltune writes
    job folders whole (``job_filesystem``), but a job saved before that, or copied cut, may hold an empty or
    truncated one (ray-project/ray#58179): ``Tuner.restore`` then fails on it, though the job's trials,
    checkpoints and searcher state are all there."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    try:
        with fs.open_input_stream(f"{folder}/tuner.pkl") as saved:
            pickle.loads(saved.readall())
    except (OSError, EOFError, pickle.UnpicklingError):
        return False
    return True

