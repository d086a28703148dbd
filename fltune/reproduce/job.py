"""A reproduction job: a paper table's runnable cells as a Ray Tune grid of ``run_federations`` trials. Cells that
differ only in the metric they read (e.g. MAN Table 1's accuracy and rounds-to-target) share one trial."""

from __future__ import annotations

import json
import time
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from fltune.config import ExperimentConfig, build_config
from fltune.errors import FLTuneError
from fltune.jobs.cells import CellSpec
from fltune.jobs.storage import check_name
from fltune.reproduce.plan import PlannedCell
from fltune.reproduce.registry import get_table
from fltune.reproduce.table import PaperTable
from fltune.text import invoked_as
from fltune.tracking.paths import outputs_dir
from fltune.tune.space import Objective


class CellRun(BaseModel):
    """A runnable cell as the job froze it: its experiment tree and the metric the paper reports."""

    model_config = ConfigDict(frozen=True)

    tree: dict[str, Any]
    metric: str
    reduce: str = "final"
    substituted: str | None = None


class ReproSpec(CellSpec):
    """Everything a reproduction job needs, frozen at its start (``--resume`` reruns exactly this)."""

    table: str
    scale: str
    seeds: int
    cells: dict[str, CellRun]
    """Runnable cells by key, in the table's order."""
    missing: dict[str, str]
    """Cells without their dataset: key → the loader's message."""
    checkpoint_every: int | None = 1
    checkpoint_seconds: float | None = None
    """A job saved before the cadence was a setting: every round."""
    trial_order: list[str] | None = None
    """Longest estimated first, frozen so a resumed grid is the same; None: the table's (data not here to time)."""
    trial_seconds: dict[str, float] | None = None
    """Each trial's estimated seconds, weighing the ETA (``tune.board.eta``); None: all weigh the same."""

    @property
    def paper_table(self) -> PaperTable:
        return get_table(self.table)

    @cached_property
    def trials(self) -> dict[str, list[str]]:
        """One trial per distinct experiment tree, named by its first cell: trial → the cells it scores."""
        groups: dict[str, list[str]] = {}
        for key, run in self.cells.items():
            groups.setdefault(json.dumps(run.tree, sort_keys=True, default=str), []).append(key)
        return {keys[0]: keys for keys in groups.values()}

    @cached_property
    def config(self) -> ExperimentConfig:
        """The first cell's config, whose tracking and resources every cell shares (from the scale and ``--set``)."""
        return build_config(next(iter(self.cells.values())).tree)

    def trial(self, cell: str) -> tuple[dict[str, Any], int, list[Objective]]:
        """A trial, every seed: the distinct (metric, reduction) pairs its cells read, its first cell's first."""
        pairs = dict.fromkeys((self.cells[key].metric, self.cells[key].reduce) for key in self.trials[cell])
        return self.cells[cell].tree, self.seeds, [Objective(metric=metric, reduce=reduce) for metric, reduce in pairs]


def new_spec(table: PaperTable, scale: str, planned: list[PlannedCell], *, seeds: int, storage: str,
             name: str | None, out: str | None, max_concurrent: int | None, checkpoint_every: int | None = 1,
             checkpoint_seconds: float | None = None) -> ReproSpec:
    """Name the job ``<paper>-<table>-<scale>-<time>`` unless --name (``TuneJob.prepare`` refuses an existing one)."""
    name = check_name(name or f"{table.key.replace(':', '-')}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}")
    cells = {p.cell.key: CellRun(tree=p.tree, metric=p.cell.metric, reduce=p.cell.reduce, substituted=p.substituted)
             for p in planned if p.runnable}
    if not cells:
        raise FLTuneError(f"datasets: no cell of this table has its dataset here (see `{invoked_as()} tables`)")
    first = build_config(next(iter(cells.values())).tree)  # its resources and tracking are every cell's
    spec = ReproSpec(
        name=name, storage=storage, table=table.key, scale=scale, seeds=seeds, cells=cells,
        missing={p.cell.key: p.missing for p in planned if not p.runnable}, workers=first.resources.workers or 1,
        gpus_per_worker=first.resources.gpus_per_worker, max_concurrent=max_concurrent,
        out=out or str(outputs_dir(first.tracking) / "reproduce" / name), checkpoint_every=checkpoint_every,
        checkpoint_seconds=checkpoint_seconds,
    )
    if any(p.fetched for p in planned):  # data the job downloads is not here to calibrate on: the table's order
        return spec
    from fltune.estimate import longest_first, run_seconds

    # Longest first: a job's trials can outnumber its slots. At quick scale each model is timed once, without the
    # method's share, as per-method calibration would add much to a job of minutes (docs/performance.md).
    items = [(trial, spec.cells[trial].tree, spec.seeds) for trial in spec.trials]
    seconds = run_seconds(items, as_built=spec.scale == "paper")
    return spec.model_copy(update={"trial_order": longest_first(seconds), "trial_seconds": seconds})

