"""The search spaces fltune ships, ``<method>.yaml`` (package data, found from any folder; README.md says the
format), and where ``--space`` and ``--method`` find a space file. Imports nothing heavy: a missing file is one line
before torch loads."""

from __future__ import annotations

from pathlib import Path

from fltune.errors import FLTuneError

SPACES = Path(__file__).resolve().parent


def shipped() -> list[str]:
    """The names of the shipped spaces (``--space NAME``)."""
    return sorted(path.stem for path in SPACES.glob("*.yaml"))


def method_space(method: str) -> Path:
    """A method's own search space (the file may not exist): for a method in a file the ``.yaml`` beside it,
    else the shipped ``<method>.yaml``."""
    where = method.rpartition(":")[0]
    return Path(where).with_suffix(".yaml") if where.endswith(".py") else SPACES / f"{method}.yaml"


def space_path(space: str | None, method: str | None) -> str | None:
    """The file ``--space`` names: a file here, else a shipped space by name (``fedprox``) or by its place in
    fltune's checkout (``search_spaces/fedprox.yaml``, as the docs write it); without ``--space``, ``--method``'s
    own (:func:`method_space`). None without either."""
    if space is None:
        if method is None:
            return None
        if not (path := method_space(method)).is_file():
            raise FLTuneError(f"--method {method}: no search space ({path}); allowed: --space FILE, or a method "
                              f"with a shipped space: {', '.join(shipped())}")
        return str(path)
    given = Path(space)
    named = given.parent in (Path("."), Path("search_spaces")) and given.suffix in ("", ".yaml")
    return str(SPACES / f"{given.stem}.yaml") if not given.is_file() and named and given.stem in shipped() else space
