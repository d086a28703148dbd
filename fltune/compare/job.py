"""The comparison's cells (method × seed) as a Ray Tune grid, as ``reproduce`` runs a table. A cell also reports each
protocol's best accuracy so far (``objective:best:<acc>``): with the final values, all the table needs."""

from __future__ import annotations

from typing import Any

from fltune.compare.spec import CompareSpec
from fltune.tune.space import Objective
from fltune.tune.trainable import Cadence, objective_key, run_federations, seed_configs


def objectives(spec: CompareSpec) -> list[Objective]:
    """The ranking accuracy's final value first, then every protocol's best value."""
    return [Objective(metric=spec.primary, reduce="final"),
            *(Objective(metric=acc, reduce="best") for acc in spec.accuracies)]


def best_key(accuracy: str) -> str:
    """Where a cell reports an accuracy's best value so far."""
    return f"objective:{objective_key(Objective(metric=accuracy, reduce='best'))}"


def run_cell(config: dict[str, Any], spec: CompareSpec) -> None:
    """Tune entry point: ``config["cell"]`` names the method and seed."""
    cfgs = seed_configs(spec.cell_tree(config["cell"]), 1, spec.workers, spec.gpus_per_worker or 0.0)
    first, *extra = objectives(spec)
    run_federations(cfgs, first, Cadence(spec.checkpoint_every, spec.checkpoint_seconds), extra=extra)
