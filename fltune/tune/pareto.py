"""A study of several objectives (accuracy against communication, FLOPs or rounds): its Pareto front, the trials no
other trial beats on every objective, as Optuna's study in the journal holds it (``Study.best_trials``): a table,
``pareto.yaml`` in the study folder, and Optuna's Pareto-front plot on the MLflow parent run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from fltune.jobs.storage import write_whole
from fltune.tune.importance import log_on_parent, optuna_study
from fltune.tune.spec import StudySpec

if TYPE_CHECKING:
    from rich.table import Table

PARETO = "pareto.yaml"


def front(spec: StudySpec) -> list[dict[str, Any]]:
    """The Pareto trials' parameters and objective values, best on the first objective first."""
    study = optuna_study(spec)
    if study is None:
        return []
    names = [o.metric for o in spec.space.objectives]
    sign = -1.0 if spec.space.objective.direction == "max" else 1.0
    trials = sorted(study.best_trials, key=lambda t: (sign * t.values[0], t.number))
    return [{"params": dict(t.params), "values": dict(zip(names, map(float, t.values)))} for t in trials]


def front_table(spec: StudySpec, rows: list[dict[str, Any]]) -> Table:
    """One line per Pareto configuration: its parameters and every objective."""
    from fltune.tune.board import config_table, shown

    return config_table(f"study {spec.name}: Pareto front, {len(rows)} configuration(s)", spec.space.params,
                        [f"{o.metric} ({o.reduce}, {o.direction})" for o in spec.space.objectives],
                        [(row["params"], [shown(value) for value in row["values"].values()]) for row in rows])


def write_front(spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    """``pareto.yaml`` in the study folder, written whole; the MLflow parent gets it and Optuna's Pareto-front plot
    (of the first two objectives when there are more than three: Optuna draws three at most)."""
    from optuna.visualization import matplotlib as plot

    text = yaml.safe_dump(rows, sort_keys=False)
    path = f"{spec.path}/{PARETO}"
    write_whole(path, text.encode())
    if spec.tracking.enabled and (study := optuna_study(spec)) is not None:
        names = [o.metric for o in spec.space.objectives]
        shown = {"target_names": names} if len(names) <= 3 else \
            {"targets": lambda t: tuple(t.values[:2]), "target_names": names[:2]}
        log_on_parent(spec, {PARETO: text}, {"pareto_front": lambda: plot.plot_pareto_front(study, **shown)})
    return path
