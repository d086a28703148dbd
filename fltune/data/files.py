"""Reading a dataset's files with one clear line per problem: :class:`DatasetMissing` (every path looked in,
how to get it) or :class:`DatasetCorrupt` (the file, how to replace it)."""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch

from fltune.errors import DatasetCorrupt

Splits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # train_x, train_y, test_x, test_y
HOW_TO_REPLACE = "delete it and rerun with --set data.download=true (needs internet), or copy a good file there"


def damaged(path: Path, problem: str, how: str) -> DatasetCorrupt:
    """The one-line error for a file that is there but cannot be used."""
    return DatasetCorrupt(f"data.root: {path} {problem}; {how}")


def read_bytes(path: Path, how: str) -> bytes:
    """The file's bytes (gunzipped for ``.gz``); an unreadable or broken file → one DatasetCorrupt line."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            return f.read()
    except EOFError as err:  # gzip stream cut short: the classic interrupted download
        raise damaged(path, "is truncated (its compressed data ends early)", how) from err
    except (gzip.BadGzipFile, zlib.error) as err:
        raise damaged(path, f"is not valid gzip data ({err})", how) from err
    except OSError as err:  # permission denied, a directory, an I/O error
        raise damaged(path, f"cannot be read ({err.strerror or err})", how) from err


def check_md5_files(folder: Path, files: Sequence[Sequence[str]]) -> None:
    """Compare each existing ``(name, md5)`` file with its published checksum (torchvision's lists). torchvision checks
    them too but says only "Dataset not found or corrupted"; this names the file."""
    for name, md5 in files:
        path = folder / name
        if not path.exists():
            continue
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()
        except OSError as err:
            raise damaged(path, f"cannot be read ({err.strerror or err})", HOW_TO_REPLACE) from err
        if digest != md5:
            raise damaged(path, "does not match its published MD5 checksum (truncated or damaged download)",
                          HOW_TO_REPLACE)
