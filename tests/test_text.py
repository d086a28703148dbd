"""The commands' shared wording."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from fltune.text import allowed, counted, invoked_as


@pytest.mark.parametrize(("n", "expected"), [(0, "0 rounds"), (1, "1 round"), (2, "2 rounds"), (500, "500 rounds")])
def test_a_count_of_one_is_singular(n: int, expected: str) -> None:
    assert counted(n, "round") == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("fedprx", "did you mean fedprox?"), ("lrr", "did you mean training.lr?"), ("zzz", "allowed: fedprox, lr, mu"),
])
def test_a_near_miss_is_suggested_and_the_list_shown_only_when_nothing_is_close(value: str, expected: str) -> None:
    section = "training." if value == "lrr" else ""
    assert allowed(value, ["fedprox", "lr", "mu"], section=section) == expected


def test_hints_name_the_command_as_the_user_typed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a console script's: no spec
    monkeypatch.setattr(sys, "argv", ["/home/u/.local/bin/fltune", "tune"])
    assert invoked_as() == "fltune"
    monkeypatch.setattr(sys, "argv", ["../fltune/cli.py", "tune"])
    assert invoked_as() == "python ../fltune/cli.py"
    as_module = types.ModuleType("__main__")
    as_module.__spec__ = importlib.util.find_spec("fltune.cli")
    monkeypatch.setitem(sys.modules, "__main__", as_module)
    assert invoked_as() == "python -m fltune.cli"
