"""Folders a command writes to, made and checked before it starts any work."""

from __future__ import annotations

import os
from pathlib import Path

from fltune.errors import FLTuneError


def make_out(out: str, flag: str = "--out") -> None:
    """Create the folder a command writes its result files to (``flag``) before Ray starts: one that cannot
    be written then fails in one line at the start, not with a traceback after all the work is done."""
    try:
        if Path(out).exists() and not Path(out).is_dir():
            raise NotADirectoryError(20, "Not a directory")
        Path(out).mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise FLTuneError(
            f"{flag} {out}: {err.strerror or err}; allowed: a folder this user can create and write") from None
