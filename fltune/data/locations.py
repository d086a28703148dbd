"""Where each dataset's files are looked for, known without torch, and one clear line per problem:
:class:`DatasetMissing` (every path looked in, how to get it) or :class:`DatasetCorrupt` (the file, how to replace it).

A command checks these places before importing torch or starting Ray (``check_here``), so a missing dataset is one
line at once; damage is the loader's to report, as are datasets not listed (CINIC-10, Tiny-ImageNet).
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fltune.errors import DatasetCorrupt, DatasetMissing

if TYPE_CHECKING:
    import torch

Splits = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"]  # train_x, train_y, test_x, test_y
HOW_TO_REPLACE = "delete it and rerun with --set data.download=true (needs internet), or copy a good file there"

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")  # apt-get install dataset-fashion-mnist
HOW_TO_GET = "pass --set data.root=DIR holding torchvision's files, or --set data.download=true (needs internet)"


def default_root() -> Path:
    """Where torchvision-format datasets live unless ``data.root`` says otherwise."""
    return Path("~/.cache/fltune/data").expanduser()


def missing(name: str, looked_in: list[Path], how: str, cause: Exception | None = None) -> DatasetMissing:
    """The one-line error for files that are not where we looked."""
    reason = f" ({' '.join(str(cause).split())})" if cause else ""
    paths = ", ".join(str(p) for p in looked_in)
    return DatasetMissing(f"data.dataset: {name} not found in {paths}{reason}; {how}")


def _fmnist(root: Path | None) -> tuple[list[Path], str]:
    """``root`` itself and Debian's folder name under it (Debian's folder without one), then torchvision's layout
    under it: ``--set data.root=/usr/share/datasets`` finds the package's files too."""
    return ([root, root / DEBIAN_FMNIST.name] if root else [DEBIAN_FMNIST]) + [
        (root or default_root()) / "FashionMNIST" / "raw"], (
        "apt-get install dataset-fashion-mnist, or " + HOW_TO_GET)


def _under(*parts: str) -> Callable[[Path | None], tuple[list[Path], str]]:
    """torchvision's own layout: one folder or file under the root (several files: each)."""
    return lambda root: ([(root or default_root()) / part for part in parts], HOW_TO_GET)


def _medmnist(name: str) -> Callable[[Path | None], tuple[list[Path], str]]:
    """``<root>/<name>.npz``, else FedSOL's ``<root>/medmnist/<name>.npz``."""
    how = f"pass --set data.root=DIR holding {name}.npz, or --set data.download=true (needs internet)"
    return lambda root: ([(root or default_root()) / f"{name}.npz",
                          (root or default_root()) / "medmnist" / f"{name}.npz"], how)


WHERE: dict[str, Callable[[Path | None], tuple[list[Path], str]]] = {
    "fmnist": _fmnist, "mnist": _under("MNIST/raw"), "emnist_letters": _under("EMNIST/raw"),
    "cifar10": _under("cifar-10-batches-py"), "cifar100": _under("cifar-100-python"),
    "svhn": _under("train_32x32.mat", "test_32x32.mat"),
    "pathmnist": _medmnist("pathmnist"), "tissuemnist": _medmnist("tissuemnist"),
}
"""Dataset → (the paths its loader looks in, in order, and how to get the files), for a ``data.root`` or None."""


def check_here(name: str, root: str | None, download: bool) -> None:
    """The loader's own "not found" line, now, when none of its paths exists and nothing is to download."""
    if download or name not in WHERE:
        return
    looked_in, how = WHERE[name](Path(root).expanduser().resolve() if root else None)
    if not any(path.exists() for path in looked_in):
        raise missing(name, looked_in, how)


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
