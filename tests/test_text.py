"""The commands' shared wording."""

from __future__ import annotations

import pytest

from fltune.text import allowed, counted


@pytest.mark.parametrize(("n", "expected"), [(0, "0 rounds"), (1, "1 round"), (2, "2 rounds"), (500, "500 rounds")])
def test_a_count_of_one_is_singular(n: int, expected: str) -> None:
    assert counted(n, "round") == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("fedprx", "did you mean fedprox?"), ("lrr", "did you mean training.lr?"), ("zzz", "allowed: fedprox, lr, mu"),
])
def test_a_near_miss_is_suggested_and_the_list_shown_only_when_nothing_is_close(value: str, expected: str) -> None:
    section = "training." if value == "lrr" else ""
    assert allowed(value, ["fedprox", "lr", "mu"], section=section) == expected
