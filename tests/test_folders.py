"""A folder a command will write to is made, or refused in one line naming the flag, before any work; a file
written into one is whole or not there, also when the disk fills as it is written."""

from __future__ import annotations

import errno
import os
import resource
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs
import pytest
from ray.exceptions import RayTaskError

from fltune.errors import FLTuneError, WriteFailed
from fltune.folders import NotWritten, ReplaceOnClose, failed_write, make_out
from fltune.jobs.storage import job_filesystem


def test_a_missing_folder_is_made_with_its_parents(tmp_path):
    make_out(str(tmp_path / "a" / "b"), "--out")
    assert (tmp_path / "a" / "b").is_dir()


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_a_folder_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path, where):
    (tmp_path / "file").write_text("")
    with pytest.raises(FLTuneError) as err:
        make_out(str(tmp_path / where), "--json-out")
    assert str(err.value) == (f"--json-out {tmp_path / where}: Not a directory; allowed: a folder this user can "
                              "create and write")


@contextmanager
def files_capped_at(size: int) -> Iterator[None]:
    """This process can write no file past ``size`` bytes (``RLIMIT_FSIZE``), as a disk that fills: the write
    that crosses it writes part of its bytes and says how many, the next fails (EFBIG; SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


def test_a_file_cut_by_a_full_disk_never_replaces_the_old_one(tmp_path: Path) -> None:
    """A checkpoint cut by a full disk was renamed into place, and the resumed trial died unpickling it;
    both ways fltune and Tune write (a ``with`` block, pyarrow's copy to the job folder) keep the old file."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "federations.pkl").write_bytes(os.urandom(300_000))
    (tmp_path / "job").mkdir()
    kept = tmp_path / "job" / "federations.pkl"
    kept.write_bytes(b"old")
    with files_capped_at(100_000):
        with pytest.raises(OSError) as direct, ReplaceOnClose(str(kept)) as out:
            out.write(os.urandom(300_000))
        with pytest.raises(OSError) as copied:
            pyarrow.fs.copy_files(str(tmp_path / "src"), str(tmp_path / "job"),
                                  destination_filesystem=job_filesystem(str(tmp_path)))
    for raised in (direct.value, copied.value):
        assert (raised.errno, raised.filename) == (errno.EFBIG, str(kept))
    assert kept.read_bytes() == b"old" and os.listdir(tmp_path / "job") == ["federations.pkl"]


def test_a_failed_write_is_found_among_the_causes_of_what_ended_a_trial() -> None:
    """Ray hands the driver a trial's error wrapped (``RayTaskError``); MLflow its store's as its own."""
    full = OSError(errno.ENOSPC, "No space left on device", "/s/t/checkpoint_000001/federations.pkl")
    wrapped = RayTaskError("run_trial", "Traceback …", full)
    for raised in (wrapped, wrapped.as_instanceof_cause()):  # as Tune hands it over, and as Ray raises it
        assert (failed_write(raised).path, failed_write(raised).reason) == (full.filename, full.strerror)
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.Error as err:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full") from err
    except RuntimeError as mlflow_error:
        assert failed_write(mlflow_error, "/m/mlflow.db").path == "/m/mlflow.db"
    assert failed_write(PermissionError(errno.EACCES, "denied", "/data/x")) is None  # a read, maybe
    assert failed_write(NotWritten(errno.EACCES, "denied", "/s/x")).path == "/s/x"  # a job file's write
    assert str(WriteFailed("/s/a.pkl", "No space left on device", "0 B free on /s", "fltune tune --resume")) == (
        "cannot write /s/a.pkl: No space left on device (0 B free on /s); make room, then continue it with: "
        "fltune tune --resume")
