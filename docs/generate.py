#!/usr/bin/env python
"""Rewrite the generated regions of README.md and docs/*.md from the code, so the reference cannot drift.

A region is the text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``; NAME is one of
:data:`GENERATORS`: ``methods`` (the method registry), ``papers`` and ``tables`` (the reproduce registry, by paper and by
table) and
``configuration`` (the pydantic schema in ``fltune/config.py``).

    python docs/generate.py           # rewrite every stale region
    python docs/generate.py --check   # exit 1 naming the stale regions, write nothing

Why outside the package: only the docs need it, and ``fltune/`` should not grow for them. It reads public
names only (``fltune.methods.METHODS``, each method's ``Params``, ``model_fields``, the reproduce registry),
so a refactor inside fltune leaves it working; where a flag may move, one small function reads it.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's fltune first
    sys.path.insert(0, str(ROOT))

REGION = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)
OFFLINE = {"fmnist": "Debian's `dataset-fashion-mnist`", "synthetic": "generated"}
"""Datasets a run finds without internet access (the install command's apt package; generated data)."""


# ----------------------------------------------------------------------------------------------- methods
def batched(cls: type) -> bool:
    """Whether the batched executor trains this method's clients K at a time (the one place this is read)."""
    from fltune.engine.functional import batchable

    return batchable(cls) and cls.default_model != "resnet56"


def default_text(value: Any) -> str:
    """A default as YAML writes it (null, true, [a, b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(default_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {default_text(v)}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def methods_table() -> str:
    """One row per registered method: name, paper, hyperparameters with their defaults, personalised, batched."""
    from fltune.methods import METHODS, is_personalised, paper

    rows = ["| method | paper | key hyperparameters (default) | personalised | batched |", "|---|---|---|---|---|"]
    for name in sorted(METHODS):
        cls = METHODS[name]
        fields = cls.Params.model_fields  # the method's own first, then what its base's Params adds
        order = sorted(fields, key=lambda p: p not in cls.Params.__annotations__)
        params = ", ".join(f"`{p}` = {default_text(fields[p].default)}" for p in order) or "—"
        rows.append(f"| `{name}` | {cell(paper(cls))} | {cell(params)} | "
                    f"{'yes' if is_personalised(cls) else '—'} | {'yes' if batched(cls) else '—'} |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------------------------- tables
def dataset_list(datasets: Iterable[str]) -> str:
    """Datasets as papers print them, the offline ones marked."""
    from fltune.reproduce.table import DATASET_NAMES

    return ", ".join(DATASET_NAMES.get(d, d) + (" (offline)" if d in OFFLINE else "") for d in datasets)


def offline_note() -> str:
    notes = "; ".join(f"{k}: {v}" for k, v in OFFLINE.items())
    return f"\nOffline ({notes}); every other dataset downloads once with `--set data.download=true`.\n"


def papers_list() -> str:
    """One row per paper ``reproduce`` covers: its tables, grouped by the datasets they need."""
    from fltune.reproduce.registry import all_tables

    papers: dict[str, dict[tuple[str, ...], list[str]]] = {}
    sources: dict[str, str] = {}
    for table in all_tables():
        paper, name = table.key.split(":", 1)
        sources.setdefault(paper, table.source.split(":")[0])
        papers.setdefault(paper, {}).setdefault(tuple(table.datasets), []).append(name)
    rows = ["| paper | tables (`fltune reproduce <paper>:<table>`) and the datasets they need |", "|---|---|"]
    for paper, groups in papers.items():
        order = sorted(groups.items(), key=lambda g: natural(g[1][0]))
        text = "; ".join(", ".join(f"`{n}`" for n in sorted(names, key=natural)) + f": {dataset_list(data)}"
                         for data, names in order)
        rows.append(f"| {cell(sources[paper])} (`{paper}`) | {cell(text)} |")
    return "\n".join(rows) + "\n" + offline_note()


def natural(name: str) -> tuple[str, int]:
    """``table10`` after ``table9``."""
    found = re.match(r"(\D*)(\d*)", name)
    return (found.group(1), int(found.group(2) or 0)) if found else (name, 0)


def tables_list() -> str:
    """One row per paper table ``reproduce`` covers: its name, what it shows, its cells and datasets."""
    from fltune.reproduce.registry import ALIASES, all_tables

    short = {key: alias for alias, key in ALIASES.items()}
    rows = ["| name | table (source) | cells | datasets |", "|---|---|---|---|"]
    for table in all_tables():
        name = f"`{table.key}`" + (f" = `{short[table.key]}`" if table.key in short else "")
        rows.append(f"| {name} | {cell(f'{table.title} ({table.source})')} | {len(table.cells)} | "
                    f"{dataset_list(table.datasets)} |")
    return "\n".join(rows) + "\n" + offline_note()


# ----------------------------------------------------------------------------------------------- configuration
def allowed_text(annotation: Any, metadata: Iterable[Any], names: tuple[str, ...] | None) -> str:
    """What a field accepts, from its type and its pydantic bounds (ge, gt, le, lt, min_length)."""
    if names is not None:
        return ", ".join(names)
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return ", ".join(str(a) for a in args)
    if typing.get_origin(annotation) is list:
        return "list of " + allowed_text(args[0], (), None)
    if args and type(None) in args:  # X | None
        inner = [a for a in args if a is not type(None)]
        return allowed_text(inner[0], metadata, None) + " or null"
    kind = {bool: "true, false", int: "integer", float: "number", str: "text"}.get(annotation, "mapping")
    marks = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    bounds = [f"{marks[k]} {getattr(m, k)}" for m in metadata for k in marks if hasattr(m, k)]
    return kind + (" " + ", ".join(bounds) if bounds and kind in ("integer", "number") else "")


def named_values() -> dict[str, tuple[str, ...]]:
    """Fields whose allowed values a validator checks against the catalog, not the type."""
    from fltune import catalog

    return {"data.dataset": tuple(catalog.NUM_CLASSES), "model.name": ("auto", *sorted(catalog.MODELS)),
            "method.name": catalog.method_names()}


def section_rows(prefix: str, model: type) -> tuple[list[str], list[tuple[str, type]]]:
    """A section's table rows, and its nested sections to write out after it."""
    names = named_values()
    rows, nested = ["| field | default | allowed | description |", "|---|---|---|---|"], []
    for field, info in model.model_fields.items():
        path = f"{prefix}.{field}"
        if isinstance(info.annotation, type) and hasattr(info.annotation, "model_fields"):
            nested.append((path, info.annotation))
            rows.append(f"| `{field}` | | section | {cell(info.description or '')} (below) |")
            continue
        default = info.default_factory() if info.default_factory else info.default
        rows.append(f"| `{field}` | {cell(default_text(default))} | "
                    f"{cell(allowed_text(info.annotation, info.metadata, names.get(path)))} | "
                    f"{cell(info.description or '')} |")
    return rows, nested


def configuration_reference() -> str:
    """Every field of the experiment tree by section: its default, allowed values and description."""
    from fltune.config import ExperimentConfig

    out: list[str] = []
    todo = [(name, info.annotation) for name, info in ExperimentConfig.model_fields.items()]
    while todo:
        path, model = todo.pop(0)
        rows, nested = section_rows(path, model)
        doc = " ".join((model.__doc__ or "").split("\n\n")[0].split())
        out += [f"### `{path}`", "", doc, "", *rows, ""]
        if path == "method":
            out += ["Plus the method's own parameters, `method.<parameter>`, validated by its `Params`: see the "
                    "methods table in the README or `fltune methods`.", ""]
        todo[:0] = nested
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "methods": methods_table, "papers": papers_list, "tables": tables_list, "configuration": configuration_reference,
}


# ----------------------------------------------------------------------------------------------- regions
def documents() -> list[Path]:
    """The files that may hold generated regions."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def regenerate(text: str, where: str, made: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with every region rewritten, and the names of those that changed."""
    stale: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise SystemExit(f"{where}: unknown generated region {name!r}; allowed: {', '.join(GENERATORS)}")
        if name not in made:
            made[name] = GENERATORS[name]()
        if match["body"] != made[name]:
            stale.append(name)
        return match.group(1) + made[name] + match.group(4)

    return REGION.sub(fill, text), stale


def stale_regions(write: bool) -> list[str]:
    """``file: region`` for every region whose text differs from the code's; rewritten when ``write``."""
    made: dict[str, str] = {}
    stale = []
    for path in documents():
        text = path.read_text()
        new, names = regenerate(text, path.name, made)
        stale += [f"{path.relative_to(ROOT)}: {name}" for name in names]
        if write and new != text:
            path.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming stale regions; write nothing")
    args = parser.parse_args(argv)
    stale = stale_regions(write=not args.check)
    if args.check and stale:
        print("stale generated regions (run `python docs/generate.py`):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    for line in stale:
        print(f"rewrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
