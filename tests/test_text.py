"""The commands' shared wording."""

from __future__ import annotations

import pytest

from fltune.text import counted


@pytest.mark.parametrize(("n", "expected"), [(0, "0 rounds"), (1, "1 round"), (2, "2 rounds"), (500, "500 rounds")])
def test_a_count_of_one_is_singular(n: int, expected: str) -> None:
    assert counted(n, "round") == expected
