"""Folders a command writes to, made and checked before it starts any work, and files written into them
whole or not at all."""

from __future__ import annotations

import errno
import io
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

from fltune.errors import FLTuneError, WriteFailed

MIN_FREE = 1 << 20
"""The free space a folder needs before a command writes there (1 MiB): less is refused as a full disk."""


def make_out(out: str, flag: str = "--out") -> None:
    """Create the folder a command writes its results to (``flag``) before Ray starts, so an unwritable or
    full one fails in one line at the start, not after the work began."""
    try:
        if Path(out).exists() and not Path(out).is_dir():
            raise NotADirectoryError(20, "Not a directory")
        Path(out).mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise FLTuneError(
            f"{flag} {out}: {err.strerror or err}; allowed: a folder this user can create and write") from None
    if shutil.disk_usage(out).free < MIN_FREE:
        raise FLTuneError(f"{flag} {out}: {free_space(out)}; allowed: a folder on a disk with at least "
                          f"{MIN_FREE >> 20} MiB free (make room, or choose another folder)")


FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
"""The errors that only a write meets: a full disk or quota, a file too big, a read-only filesystem."""
SQLITE_FULL = ("database or disk is full", "disk I/O error")
"""How sqlite says so (its errors carry no errno): an MLflow store on a full disk."""


class NotWritten(OSError):
    """A job file that ``ReplaceOnClose`` could not write, whatever the reason; it names the file."""


def failed_write(error: BaseException | None, store: str = "") -> WriteFailed | None:
    """The failed write among ``error`` and its causes (Ray's ``RayTaskError.cause``, ``__cause__``,
    ``__context__``) as a ``WriteFailed`` naming its file (``store`` for an sqlite error); else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(getattr(error, "cause", None), BaseException):  # Ray's wrapper poses without errno
            error = error.cause
            continue
        if isinstance(error, WriteFailed):
            return error
        if isinstance(error, NotWritten) or (isinstance(error, OSError) and error.errno in FULL):
            return WriteFailed(str(error.filename or ""), error.strerror or str(error))
        if isinstance(error, sqlite3.Error) and str(error).startswith(SQLITE_FULL):
            return WriteFailed(store, str(error))
        error = error.__cause__ or error.__context__
    return None


def said(failed: WriteFailed, where: str = "", resume: str = "") -> WriteFailed:
    """``failed`` with its file (else ``where``), the room left there, and the ``resume`` command."""
    path = failed.path or where
    return WriteFailed(path, failed.reason, free_space(path) if path else "", resume or failed.resume)


def free_space(path: str) -> str:
    """'<n> free on <mount point>' for the disk that holds ``path``, for the lines that say a write failed."""
    folder = Path(path)
    while not (folder.is_dir() and os.path.ismount(folder)) and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"free space of {folder} unknown"
    size = next((f"{free / 2 ** p:.1f} {unit}" for p, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"))
                 if free >= 2 ** p), f"{free} B")
    return f"{size} free on {folder}"


class ReplaceOnClose(io.FileIO):
    """A file written under a hidden ``.part`` name and moved onto the target when closed: all or nothing (a
    cut checkpoint would kill the resumed trial). A failed write or raising ``with`` leaves no ``.part`` and
    raises ``NotWritten`` naming the target."""

    def __init__(self, path: str) -> None:
        self.target = path
        self.failed = False
        try:
            folder, name = os.path.split(path)  # a hidden name beside the target, unique to the writer
            super().__init__(os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.part"), "wb")
        except OSError as err:
            raise NotWritten(err.errno, err.strerror, path) from None

    def write(self, data: bytes) -> int:  # type: ignore[override]
        """All of ``data``: a filling disk writes part and says how much, which pyarrow (Tune's checkpoints)
        does not check."""
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                done += super().write(view[done:])
        except OSError as err:
            self.failed = True
            self.close()  # its room is given back now, not when the writer lets go of the file
            raise NotWritten(err.errno, err.strerror, self.target) from None
        return done

    def __exit__(self, *raised: object) -> None:
        self.failed = self.failed or raised[0] is not None
        super().__exit__(*raised)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        try:
            if not self.failed:
                os.replace(self.name, self.target)
        finally:  # a failed write, or a stop as the file is moved: no .part stays
            if os.path.exists(self.name):
                os.remove(self.name)
