"""The commands' console: a log (stderr to a file or a pipe) gets the tables' figures whole."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WIDE_TABLE = """
from rich.table import Table
from fltune.tracking.progress import console
table = Table()
for i in range(12):
    table.add_column(f"final acc_global % {i}")
table.add_row(*[f"{60 + i}.55 ± 1.06" for i in range(12)])
console.print(table)
"""


def _stderr_of(script: str, **env: str) -> str:
    """stderr of ``script`` in a fresh interpreter, captured through a pipe as a log would."""
    clean = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_TERMINAL", "TTY_COMPATIBLE")}
    done = subprocess.run([sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True,
                          check=True)
    return done.stderr


def test_a_log_gets_a_wide_table_whole() -> None:
    """Rich's 80 columns for a pipe cut every cell to "60.…"; the log width keeps them."""
    out = _stderr_of(WIDE_TABLE)
    assert "…" not in out
    assert all(f"{60 + i}.55 ± 1.06" in out for i in range(12))


@pytest.mark.parametrize("columns", ["80", "120"])
def test_columns_still_sets_the_width(columns: str) -> None:
    out = _stderr_of(WIDE_TABLE, COLUMNS=columns)
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    assert "…" in out
