"""Where fltune's jobs live (``<storage>/<name>``, on any pyarrow filesystem) and the filesystem Tune writes a job
folder through: on local disk, every file is replaced whole or not at all. Tune truncates and rewrites its state files
in the job folder every few seconds (``sync_up_experiment_state``): a driver killed mid-copy leaves a cut file and
``Tuner.restore`` fails with ``EOFError: Ran out of input`` (ray-project/ray#58179). Here each file is written beside
its target and ``os.replace``-d; remote stores (s3://, gs://) publish an object only once uploaded whole, so they keep
Tune's filesystem (and Tune's pruning: ``AtomicLocalFiles``)."""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path

import fsspec
import pyarrow
import pyarrow.fs

from fltune.errors import FLTuneError
from fltune.folders import ReplaceOnClose
from fltune.tracking.paths import mlruns_dir
from fltune.workarounds import PRUNES


def write_whole(uri: str, data: bytes) -> None:
    """``data`` as the file at ``uri`` (a local path or a pyarrow URI), all or nothing: fltune's own job files,
    which ``--resume`` reads back. SIGTERM becomes ``KeyboardInterrupt`` between any two bytecodes
    (``process._on_sigterm``), so the old file, or none, stays until the new one is complete."""
    if "://" in uri:  # a remote store publishes an object only when its upload completes
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    with ReplaceOnClose(uri) as out:
        out.write(data)


STATE_PREFIX = "experiment_state-"
CHECKPOINT = re.compile(r"checkpoint_\d+")


class AtomicLocalFiles(pyarrow.fs.FSSpecHandler):
    """fsspec's local filesystem with all-or-nothing writes (``ReplaceOnClose``) and pruned checkpoints held
    (``workarounds.HeldPrunes``). Picklable, so Tune ships it to trials with their storage."""

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
        if whole:  # moved into place: a failed move raised above
            PRUNES.state_copied(self.opened, time.monotonic())


def job_filesystem(storage: str) -> pyarrow.fs.FileSystem | None:
    """What Tune writes ``storage`` through: all-or-nothing files for a local path; None for a URI."""
    if "://" in storage:
        return None
    return pyarrow.fs.PyFileSystem(AtomicLocalFiles())


def storage_root(storage: str | None) -> str:
    """Where jobs live: a URI as given, a local path (or ``file://`` URI, so its files are written whole) made
    absolute as Ray requires; default ``<repo>/studies`` next to ``mlruns``."""
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


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise FLTuneError(f"--name {name!r}: allowed: letters, digits, '.', '_' and '-'")
    return name


def holds(path: str, name: str) -> bool:
    """Whether the folder at ``path`` holds the file ``name``, on any pyarrow filesystem."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(f"{folder}/{name}").type == pyarrow.fs.FileType.File


def tune_started(path: str) -> bool:
    """Whether Tune saved the job's state (``experiment_state-*.json``), not just ``tuner.pkl`` (all
    ``Tuner.can_restore`` checks): restoring without it starts trials without their configurations."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    found = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    return any(info.base_name.startswith(STATE_PREFIX) for info in found)


def tuner_whole(path: str) -> bool:
    """Whether the job's ``tuner.pkl`` at ``path`` reads back: a job copied cut may hold a truncated one
    (ray-project/ray#58179), and one an older fltune wrote may name a class this one moved or removed; either
    fails ``Tuner.restore`` though the job's trials and checkpoints are all there."""
    fs, folder = pyarrow.fs.FileSystem.from_uri(path)
    try:
        with fs.open_input_stream(f"{folder}/tuner.pkl") as saved:
            pickle.loads(saved.readall())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return False
    return True

