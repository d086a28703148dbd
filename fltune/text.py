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
    """The tail of an "unknown name" line: "did you mean fedprox?" when names are close to ``value`` (a typo),
    else "allowed: a, b, c" (``none`` when there are no names). A near miss is what a user needs to see;
    a list of forty methods buries it, so the list shows only when nothing is close. ``section``: the
    dotted path the names sit in, for a suggestion the user can paste (``training.lr``)."""
    names = list(names)
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.75)
    if close:
        return f"did you mean {' or '.join(section + name for name in close)}?"
    return f"allowed: {', '.join(names) or none}"


def invoked_as() -> str:
    """The command as the user typed it, for the lines that tell them what to run next (resume, rerun):
    ``python -m fltune.cli``, ``python cli.py`` (a checkout's script, by the path given) or ``fltune``
    (the installed entry point, and any other way in, such as a test calling ``main``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("fltune"):
        return f"python -m {spec.name}"
    if Path(sys.argv[0]).name == "cli.py":
        return f"python {sys.argv[0]}"
    return "fltune"
