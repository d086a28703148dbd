"""The filesystem Tune writes a job folder through: on local disk, every file is replaced whole or not at all.

Tune rewrites its state files in place. The driver keeps them in a staging folder and copies *all* of them
(``tuner.pkl``, ``experiment_state-*.json``, ``searcher-state-*.pkl``) to the job folder every few seconds,
truncating each before writing it (``_ExperimentCheckpointManager.sync_up_experiment_state``). A driver
killed mid-copy (SIGKILL, the OOM killer, a pre-empted node) leaves an empty or cut file, and the job can
no longer resume: ``Tuner.restore`` fails with ``EOFError: Ran out of input`` (ray-project/ray#58179).
Writing each file beside its target and renaming it into place when complete (``os.replace``, atomic on
POSIX) leaves the old version or the new one, never a mix. Remote stores (s3://, gs://) already publish
an object only when its upload completes, so Tune keeps its own filesystem for them.
"""

from __future__ import annotations

import io
import os
import uuid

import fsspec
import pyarrow
import pyarrow.fs


def part_path(path: str) -> str:
    """Where a file bound for ``path`` is written first: a hidden name beside it, unique to the writer."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.part")


def write_whole(uri: str, data: bytes) -> None:
    """``data`` as the file at ``uri`` (a local path or a pyarrow URI), all or nothing.

    For fltune's own files in a job folder (its saved spec, its best configuration), which ``--resume``
    reads back. A stop can land mid-write: SIGTERM becomes ``KeyboardInterrupt`` between any two bytecodes
    (``driver._on_sigterm``), and a file opened for writing is already truncated. CI once stopped a
    comparison just as its second study saved its spec, and the resume refused the empty file as "a
    different kind of fltune job". Here the old file, or none, stays until the new one is complete."""
    if "://" in uri:  # a remote store publishes an object only when its upload completes
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    part = part_path(uri)
    try:
        with open(part, "wb") as out:
            out.write(data)
        os.replace(part, uri)
    finally:
        if os.path.exists(part):
            os.remove(part)


class ReplaceOnClose(io.FileIO):
    """A file written under a hidden temporary name in the target's folder, moved onto the target when
    closed. A writer killed before ``close`` leaves the target as it was (and a ``.part`` file that
    Tune's listings, which match ``*.json`` and ``*.pkl``, never pick up)."""

    def __init__(self, path: str) -> None:
        self.target = path
        super().__init__(part_path(path), "wb")

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        os.replace(self.name, self.target)


class AtomicLocalFiles(pyarrow.fs.FSSpecHandler):
    """Local files whose writes are all-or-nothing (``ReplaceOnClose``); everything else is fsspec's
    local filesystem as pyarrow wraps it. Picklable, so Tune ships it to trials with their storage."""

    def __init__(self) -> None:
        super().__init__(fsspec.filesystem("file"))

    def open_output_stream(self, path: str, metadata: dict | None) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(ReplaceOnClose(path), mode="w")


def job_filesystem(storage: str) -> pyarrow.fs.FileSystem | None:
    """What Tune should write ``storage`` through: all-or-nothing files for a local folder (``storage``
    is then a plain absolute path, as ``driver.storage_root`` makes it); None for a URI, which Tune
    resolves itself."""
    if "://" in storage:
        return None
    return pyarrow.fs.PyFileSystem(AtomicLocalFiles())
