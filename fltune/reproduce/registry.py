"""The paper tables by name: every table that a module of ``fltune/reproduce/papers/`` lists."""

from __future__ import annotations

from fltune.errors import FLTuneError
from fltune.text import allowed
from fltune.reproduce.papers import fedalign, fedsol, man, simfafl
from fltune.reproduce.table import PaperTable


TABLES = {table.key: table for table in (*fedalign.TABLES, *fedsol.TABLES, *man.TABLES, *simfafl.TABLES)}
"""Keys and cells unique: ``tests/reproduce/test_registry.py``."""
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
