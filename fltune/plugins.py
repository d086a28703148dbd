"""The user's own methods, models and datasets, without a fork: by reference or by installed plug-in.

A name may also be a *reference* (``package.module:Name``, ``path/to/file.py:Name``) or an entry point in
``fltune.methods``, ``fltune.models`` or ``fltune.datasets``. A file is imported as the module named after its
stem, so its classes pickle by reference; a worker on another node imports the copy :func:`shipped` sends.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import sysconfig
import traceback
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from fltune.errors import FLTuneError, UserCodeError
from fltune.text import allowed

Kind = Literal["method", "model", "dataset"]

FIELDS: dict[str, str] = {"method": "method.name", "model": "model.name", "dataset": "data.dataset"}
"""The config field each kind is named in, which every error about it names."""

EXPECTED: dict[str, str] = {
    "method": "a subclass of fltune.Method",
    "model": "a model builder (in_shape, num_classes, **options) -> fltune.models.SplitModel",
    "dataset": "a dataset loader (root, download) -> fltune.data.UserDataset",
}

_LOADED: dict[str, Path | ModuleType] = {}
"""What this process imported by reference: a file's path, or a module's top-level package."""


def unknown(kind: Kind, name: str, names: list[str], field: str | None = None) -> FLTuneError:
    """The one line for an unknown name: "did you mean …?", else the names allowed and reference forms."""
    hint = allowed(name, [*names, *sorted(plugins(kind))])
    forms = ", or a reference package.module:Name or path/to/file.py:Name" if hint.startswith("allowed") else ""
    return FLTuneError(f"{field or FIELDS[kind]}: unknown {kind} {name!r}; {hint}{forms}")


def is_reference(name: str) -> bool:
    """``module:Name`` or ``file.py:Name`` rather than a registered name."""
    return ":" in name


def normalised(name: str) -> str:
    """A file reference with its path made absolute; anything else unchanged."""
    where, _, attr = name.rpartition(":")
    if not where.endswith(".py"):
        return name
    return f"{Path(where).expanduser().resolve()}:{attr}"


def label(name: str) -> str:
    """A short, file-safe name: ``stem.Name`` or ``module.Name`` of a reference, else the name itself."""
    where, _, attr = name.rpartition(":")
    stem = Path(where).stem if where.endswith(".py") else where
    return re.sub(r"[^\w.+-]", "_", f"{stem}.{attr}" if where else name)


def plugins(kind: Kind) -> dict[str, EntryPoint]:
    """The entry points installed packages declare for ``kind``, by name."""
    return {ep.name: ep for ep in entry_points(group=f"fltune.{kind}s")}


def origin(kind: Kind, name: str) -> str:
    """Where a plug-in name comes from: its distribution and version, and its target."""
    ep = plugins(kind)[name]
    dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an installed package"
    return f"{dist} ({ep.value})"


def resolve(kind: Kind, name: str) -> Any | None:
    """The object a reference or plug-in name refers to, loaded; None for any other name."""
    if is_reference(name):
        return load(kind, normalised(name))
    found = plugins(kind).get(name)
    return None if found is None else load(kind, found.value, f"{name!r} (entry point of {origin(kind, name)})")


@cache
def load(kind: Kind, ref: str, shown: str | None = None) -> Any:
    """Import ``module:Name`` or ``/abs/file.py:Name`` once per process; one user error line on failure."""
    shown = shown or repr(ref)
    where, _, attr = ref.rpartition(":")
    problem = f"{FIELDS[kind]}: {shown}"
    expected = f"expected package.module:Name or path/to/file.py:Name naming {EXPECTED[kind]}"
    if not where or not attr.isidentifier():
        raise FLTuneError(f"{problem}: not a reference; {expected}")
    try:
        module = _import_file(Path(where)) if where.endswith(".py") else importlib.import_module(where)
    except FLTuneError as err:
        raise FLTuneError(f"{problem}: {err}; {expected}") from None
    except Exception as err:  # the user's module failed: its own error, in one line
        raise FLTuneError(f"{problem}: cannot import {where} ({type(err).__name__}: {err}); {expected}") from None
    if not hasattr(module, attr):
        raise FLTuneError(f"{problem}: {where} has no {attr!r}; {expected}")
    found = getattr(module, attr)
    if not callable(found):
        raise FLTuneError(f"{problem}: {attr} is a {type(found).__name__}; {expected}")
    _LOADED[ref] = Path(where) if where.endswith(".py") else sys.modules[where.partition(".")[0]]
    return found


def _import_file(path: Path) -> ModuleType:
    """``path`` imported as the module named after its stem; missing, as that module (Ray's shipped copy)."""
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
        return loaded
    if not path.is_file():
        if name.isidentifier() and loaded is None and importlib.util.find_spec(name) is not None:
            return importlib.import_module(name)
        raise FLTuneError("no such file")
    if loaded is not None:
        raise FLTuneError(f"a module named {name!r} is imported already (from {loaded.__file__}): rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_fault(error: BaseException) -> str | None:
    """One line for an error of the user's own code, raised in the driver or a Ray worker (whose exception Ray
    wraps: ``cause``, ``traceback_str``): a broken contract (``UserCodeError``), else the error at the deepest frame
    in a file loaded by reference; None for an error that never passed through the user's code."""
    cause = getattr(error, "cause", None) or error
    if isinstance(cause, UserCodeError):
        return str(cause.args[0])
    trace = getattr(error, "traceback_str", None) or "".join(traceback.format_exception(error))
    files = {str(item) for item in _LOADED.values() if isinstance(item, Path)}
    frames = [frame for frame in _FRAME.findall(trace) if frame[0] in files]
    if not frames:
        return None
    return f"{frames[-1][0]}:{frames[-1][1]}: {type(cause).__name__}: {cause}"


def shipped() -> list[str | ModuleType]:
    """Ray ``py_modules`` for joining a cluster: the files and packages loaded by reference, not installed."""
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    found: list[str | ModuleType] = []
    for item in _LOADED.values():
        if isinstance(item, Path):
            found.append(str(item))
        elif item.__name__ != "fltune" and not any(Path(p).resolve().is_relative_to(site)
                                                    for p in getattr(item, "__path__", [item.__file__])
                                                    for site in installed):
            found.append(item)
    return list(dict.fromkeys(found))
