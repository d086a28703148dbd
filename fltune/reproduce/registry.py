"""The paper tables by name: importing ``fltune.reproduce.papers`` registers them (``table.register_table``)."""

from __future__ import annotations

import fltune.reproduce.papers  # noqa: F401  (registers every table)
from fltune.errors import FLTuneError
from fltune.reproduce.table import TABLES, PaperTable

ALIASES = {"table2": "simfafl:table2", "table3": "simfafl:table3", "table4": "simfafl:table4"}
"""Short names: the SimFAFL tables, the product's default."""


def get_table(name: str) -> PaperTable:
    """A table by ``paper:table`` or short alias; one clear line when unknown."""
    key = ALIASES.get(name, name)
    if key not in TABLES:
        allowed = ", ".join([*ALIASES, *sorted(TABLES)])
        raise FLTuneError(f"table: unknown table {name!r}; allowed: {allowed}")
    return TABLES[key]


def all_tables() -> list[PaperTable]:
    return [TABLES[k] for k in sorted(TABLES)]
