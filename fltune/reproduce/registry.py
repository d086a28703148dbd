"""The paper tables by name: every table that a module of ``fltune/reproduce/papers/`` lists."""

from __future__ import annotations

from fltune.errors import FLTuneError
from fltune.text import allowed
from fltune.reproduce.papers import fedalign, fedsol, man, simfafl
from fltune.reproduce.table import PaperTable


def _by_key(tables: list[PaperTable]) -> dict[str, PaperTable]:
    """Every table under its key; a key or a cell listed twice is a mistake in ``papers/``."""
    found: dict[str, PaperTable] = {}
    for table in tables:
        if table.key in found:
            raise ValueError(f"table {table.key} registered twice")
        keys = [c.key for c in table.cells]
        if len(set(keys)) != len(keys):
            raise ValueError(f"table {table.key}: duplicate cells")
        found[table.key] = table
    return found


TABLES = _by_key([*fedalign.TABLES, *fedsol.TABLES, *man.TABLES, *simfafl.TABLES])
ALIASES = {"table2": "simfafl:table2", "table3": "simfafl:table3", "table4": "simfafl:table4"}
"""Short names: the SimFAFL tables, the product's default."""


def get_table(name: str) -> PaperTable:
    """A table by ``paper:table`` or short alias; one clear line when unknown."""
    key = ALIASES.get(name, name)
    if key not in TABLES:
        raise FLTuneError(f"table: unknown table {name!r}; {allowed(name, [*ALIASES, *sorted(TABLES)])}")
    return TABLES[key]


def all_tables() -> list[PaperTable]:
    return [TABLES[k] for k in sorted(TABLES)]
