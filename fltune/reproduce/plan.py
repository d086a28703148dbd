"""From a paper table to runnable cells, before Ray starts. A cell whose dataset is missing is planned as "no data" with
the loader's message, unless the scale substitutes a dataset."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fltune.config import apply_overrides, build_config, set_fields
from fltune.data.datasets import DATASETS, load_dataset
from fltune.errors import DatasetMissing, FLTuneError
from fltune.reproduce.table import DATASET_NAMES, Cell, PaperTable, Scale
from fltune.text import allowed
from fltune.metrics.probe import check_probes
from fltune.tune.space import unmet_need


@dataclass(frozen=True)
class PlannedCell:
    """A cell as this job runs it: its experiment tree, or why it cannot run here."""

    cell: Cell
    tree: dict[str, Any] | None
    missing: str | None = None
    substituted: str | None = None
    """e.g. 'fmnist for cifar100': the scale ran another dataset because the paper's is absent."""
    fetched: bool = False
    """Its dataset is not here yet: ``data.download`` fetches it when the job runs, not when planning."""

    @property
    def runnable(self) -> bool:
        return self.tree is not None


LIKE_FOR_LIKE = {"fmnist": ("mnist", "emnist_letters"), "mnist": ("fmnist", "emnist_letters")}
"""A substitute named in ``--datasets`` selects the cells it stands in for like-for-like (28×28 grey, 10 classes):
``--datasets fmnist`` on FedSOL's Table 2 is its MNIST column run on FMNIST."""


def pick_cells(table: PaperTable, datasets: Sequence[str] | None, rows: Sequence[str] | None = None,
               substitute: str | None = None) -> list[Cell]:
    """The table's cells of ``datasets`` (or a ``substitute``: :data:`LIKE_FOR_LIKE`) and ``rows`` when given."""
    cells = list(table.cells)
    if rows:
        labels = list(dict.fromkeys(c.row for c in cells))
        unknown = [r for r in rows if r not in labels]
        if unknown:
            raise FLTuneError(f"--rows: {unknown[0]!r} is not a row of {table.key}; {allowed(unknown[0], labels)}")
        cells = [c for c in cells if c.row in rows]
    if not datasets:
        return cells
    names = {n.lower(): d for d, n in DATASET_NAMES.items()} | {d: d for d in DATASETS}
    wanted = set()
    for name in datasets:
        dataset = names.get(name.lower())
        stands_for = [d for d in LIKE_FOR_LIKE.get(dataset, ()) if d in table.datasets]
        if dataset in table.datasets:
            wanted.add(dataset)
        elif dataset is not None and dataset == substitute and stands_for:
            wanted.update(stands_for)
        else:
            raise FLTuneError(f"--datasets: {name!r} is not a dataset of {table.key}; {allowed(name, table.datasets)}")
    return [c for c in cells if c.dataset in wanted]


def available(dataset: str, root: str | None) -> str | None:
    """None when the dataset loads, else the loader's one-line message (where it looked, how to get it)."""
    try:
        load_dataset(dataset, root)
    except DatasetMissing as err:
        return str(err)
    return None


def cell_tree(cell: Cell, scale: Scale, dataset: str, overrides: Sequence[str]) -> dict[str, Any]:
    """Validated tree: scale (then dataset) settings < the cell's < the scale's column, then row < ``--set``."""
    values = {**scale.settings, **scale.per_dataset.get(dataset, {}), **cell.settings,
              **scale.per_column.get(cell.column, {}), **scale.per_row.get(cell.row, {}), "data.dataset": dataset}
    if cell.finetune:
        values["training.finetune_epochs"] = scale.finetune_epochs
    tree = apply_overrides(set_fields({}, values), list(overrides))
    cfg = build_config(tree)  # one line naming the field when a --set breaks a cell
    need = unmet_need(cell.metric, cell.reduce, cfg)
    if need:
        raise FLTuneError(f"{cell.key}: its metric {cell.metric} {need}")
    try:
        check_probes(cfg)
    except FLTuneError as err:
        raise FLTuneError(f"{cell.key}: {err}") from None
    return tree


def plan(table: PaperTable, scale_name: str, datasets: Sequence[str] | None, overrides: Sequence[str],
         rows: Sequence[str] | None = None) -> list[PlannedCell]:
    """Every selected cell, runnable or not; raises only for bad input."""
    if scale_name not in table.scales:
        raise FLTuneError(f"--scale: {table.key} has no scale {scale_name!r}; {allowed(scale_name, table.scales)}")
    scale = table.scales[scale_name]
    cells = pick_cells(table, datasets, rows, scale.substitute)
    data = apply_overrides({}, list(overrides)).get("data", {})  # where the runs will look, and whether they fetch
    root, download = data.get("root"), data.get("download") is True
    missing = {d: available(d, root) for d in dict.fromkeys(c.dataset for c in cells)}
    fetched = {d for d, why in missing.items() if why and download}
    stand_in = scale.substitute if scale.substitute and available(scale.substitute, root) is None else None
    planned = []
    for cell in cells:
        if not missing[cell.dataset] or cell.dataset in fetched:
            planned.append(PlannedCell(cell, cell_tree(cell, scale, cell.dataset, overrides),
                                       fetched=cell.dataset in fetched))
        elif stand_in:
            planned.append(PlannedCell(cell, cell_tree(cell, scale, stand_in, overrides),
                                       substituted=f"{stand_in} for {cell.dataset}"))
        else:
            planned.append(PlannedCell(cell, None, missing=missing[cell.dataset]))
    return planned
