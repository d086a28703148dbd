"""A reproduction job: a paper table's runnable cells as Ray Tune trials (a grid, no search).

Every cell is one trial of the same trainable body as ``tune`` (``run_federations``: the seeds in
lockstep, a report and a checkpoint per round), so a cluster runs cells in parallel, a crashed cell
restarts from its checkpoint and ``--resume`` continues the job with ``Tuner.restore``.
"""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict
from ray import tune

from fltune.config import TrackingConfig, build_config
from fltune.errors import FLTuneError
from fltune.reproduce.plan import PlannedCell, first_config
from fltune.reproduce.registry import PaperTable, get_table
from fltune.tracking.mlflow_log import mlruns_dir
from fltune.tune.space import Objective
from fltune.tune.spec import SavedSpec
from fltune.tune.study import restore, run_config
from fltune.tune.trainable import run_federations, seed_configs

class CellRun(BaseModel):
    """A runnable cell as the job froze it: its experiment tree and the metric the paper reports."""

    model_config = ConfigDict(frozen=True)

    tree: dict[str, Any]
    metric: str
    substituted: str | None = None


class ReproSpec(SavedSpec):
    """Everything a reproduction job needs, frozen at its start (``--resume`` reruns exactly this)."""

    table: str
    scale: str
    seeds: int
    datasets: list[str] | None
    cells: dict[str, CellRun]
    """Runnable cells by key, in the table's order."""
    missing: dict[str, str]
    """Cells without their dataset: key → the loader's message."""
    workers: int
    gpus_per_worker: float | None
    max_concurrent: int | None
    out: str

    @property
    def paper_table(self) -> PaperTable:
        return get_table(self.table)

    @property
    def tracking(self) -> TrackingConfig:
        """Shared by every cell (it comes from the scale and ``--set``)."""
        return build_config(next(iter(self.cells.values())).tree).tracking


def new_spec(table: PaperTable, scale: str, planned: list[PlannedCell], *, seeds: int, storage: str,
             name: str | None, out: str | None, max_concurrent: int | None,
             datasets: list[str] | None) -> ReproSpec:
    """Name the job ``<paper>-<table>-<scale>-<time>`` unless --name; refuse an existing one."""
    name = name or f"{table.key.replace(':', '-')}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise FLTuneError(f"--name {name!r}: allowed: letters, digits, '.', '_' and '-'")
    resources = first_config(planned).resources
    cells = {p.cell.key: CellRun(tree=p.tree, metric=p.cell.metric, substituted=p.substituted)
             for p in planned if p.runnable}
    spec = ReproSpec(
        name=name, storage=storage, table=table.key, scale=scale, seeds=seeds, datasets=datasets, cells=cells,
        missing={p.cell.key: p.missing for p in planned if not p.runnable}, workers=resources.workers or 1,
        gpus_per_worker=resources.gpus_per_worker, max_concurrent=max_concurrent,
        out=out or str(mlruns_dir() / "reproduce" / name),
    )
    return spec


def run_cell(config: dict[str, Any], spec: ReproSpec) -> None:
    """Tune entry point: ``config["cell"]`` names the cell; its seeds run in lockstep."""
    cell = spec.cells[config["cell"]]
    cfgs = seed_configs(cell.tree, spec.seeds, spec.workers, spec.gpus_per_worker or 0.0)
    run_federations(cfgs, Objective(metric=cell.metric, reduce="final"), checkpoint_every=1)


def trainable(spec: ReproSpec, resources: tune.PlacementGroupFactory):
    return tune.with_resources(tune.with_parameters(run_cell, spec=spec), resources)


def new_tuner(spec: ReproSpec, resources: tune.PlacementGroupFactory, callbacks: list) -> tune.Tuner:
    """A grid over the cells: each runs once (its seeds inside), as many at once as the cluster fits."""
    return tune.Tuner(
        trainable(spec, resources),
        param_space={"cell": tune.grid_search(list(spec.cells))},
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=spec.max_concurrent),
        run_config=run_config(spec, callbacks),
    )


def restored_tuner(spec: ReproSpec, resources: tune.PlacementGroupFactory) -> tune.Tuner:
    """Unfinished and errored cells run again from their checkpoints; finished ones are kept."""
    return restore(spec, trainable(spec, resources), resume_errored=True)
