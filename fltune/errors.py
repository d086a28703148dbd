"""User-facing errors: every bad input a user can make raises :class:`FLTuneError` with one line naming the field and
what is allowed; the CLI prints that line and exits with status 2, never a traceback."""


class FLTuneError(Exception):
    """A user error: bad config, missing data, impossible partition or resources."""


class DatasetMissing(FLTuneError):
    """The dataset's files are not where fltune looked for them."""


class DatasetCorrupt(FLTuneError):
    """A dataset file is there but unusable: truncated, not gzip, a wrong header or checksum, unreadable."""


class WriteFailed(Exception):
    """A job could not write one of its files (full disk, read-only or gone folder). Tune would restart the
    trial to fail the same way, and go on without the files ``--resume`` needs, so the job stops at once,
    every file written whole, with this line and ``STATUS``; ``resume`` continues it once there is room."""

    STATUS = 74
    """``EX_IOERR`` of sysexits.h: an I/O error, distinct from bad input (2) and a stop (130, 143)."""

    def __init__(self, path: str, reason: str, free: str = "", resume: str = "") -> None:
        super().__init__(path, reason, free, resume)
        self.path, self.reason, self.free, self.resume = path, reason, free, resume

    def __str__(self) -> str:
        room = f" ({self.free})" if self.free else ""
        then = f"continue it with: {self.resume}" if self.resume else "run it again"
        return f"cannot write {self.path or 'a file'}: {self.reason}{room}; make room, then {then}"


class UserCodeError(Exception):
    """The user's own method broke its contract (``local_loss`` returned per-sample losses): one line naming their
    file:line and the error; the CLI exits 1 without a traceback (``plugins.user_fault``)."""


def defined_at(function: object) -> str:
    """``file:line`` where ``function`` is defined (the user's hook an error names)."""
    import inspect

    return f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"  # type: ignore[arg-type]
