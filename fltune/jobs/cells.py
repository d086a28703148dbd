"""A job of fixed cells (a comparison's method × seed, a paper table's cells): what its spec freezes beside its
cells, and its trials' one Tune entry point."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from fltune.jobs.scaffold import CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS
from fltune.tune.space import Objective
from fltune.tune.spec import JobSpec


class CellSpec(JobSpec):
    """A job of cells frozen at its start: its trials' workers and GPU share, concurrency, ``--out`` folder and
    checkpoint cadence (``trainable.Cadence``)."""

    workers: int
    gpus_per_worker: float | None
    max_concurrent: int | None
    out: str
    checkpoint_every: int | None = CELL_CHECKPOINT_EVERY
    checkpoint_seconds: float | None = CELL_CHECKPOINT_SECONDS

    @abstractmethod
    def trial(self, cell: str) -> tuple[dict[str, Any], int, list[Objective]]:
        """The trial ``cell``: its experiment tree, its seeds, and the objectives it reports (the first ranks)."""


def run_cell(config: dict[str, Any], spec: CellSpec) -> None:
    """Tune entry point: ``config["cell"]`` names the trial; its seeds train and report every objective."""
    from fltune.tune.trainable import Cadence, run_federations, seed_configs

    tree, seeds, (first, *extra) = spec.trial(config["cell"])
    cfgs = seed_configs(tree, seeds, spec.workers, spec.gpus_per_worker or 0.0)
    run_federations(cfgs, first, Cadence(spec.checkpoint_every, spec.checkpoint_seconds), extra=extra)
