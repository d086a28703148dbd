"""Wording the commands' lines share."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from pathlib import Path


def counted(n: int, noun: str) -> str:
    """``n noun`` with the noun plural unless n is 1: "1 round", "500 rounds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def allowed(value: str, names: Iterable[str], none: str = "none", section: str = "") -> str:
    """The tail of an "unknown name" line: "did you mean fedprox?" for a near miss (a long list would bury
    it), else "allowed: a, b, c" (``none``). ``section``: the dotted path, for a pasteable suggestion."""
    names = list(names)
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.75)
    if close:
        return f"did you mean {' or '.join(section + name for name in close)}?"
    return f"allowed: {', '.join(names) or none}"


def invoked_as() -> str:
    """The command as the user typed it, for resume and rerun lines: ``python -m fltune.cli``,
    ``python cli.py`` (by the path given) or ``fltune`` (anything else)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("fltune"):
        return f"python -m {spec.name}"
    if Path(sys.argv[0]).name == "cli.py":
        return f"python {sys.argv[0]}"
    return "fltune"
