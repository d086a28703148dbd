"""A study of several objectives (accuracy against communication, FLOPs or rounds): its Pareto front, the trials no
other trial beats on every objective, as Optuna's study in the journal holds it (``Study.best_trials``): a table,
``pareto.yaml`` in the study folder, and Optuna's Pareto-front plot on the MLflow parent run."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml

from fltune.jobs.storage import write_whole
from fltune.tune.importance import optuna_study, save_plot
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
    from rich.table import Table

    from fltune.tune.board import shown

    table = Table(title=f"study {spec.name}: Pareto front, {len(rows)} configuration(s)")
    for name in spec.space.params:
        table.add_column(name, justify="right")
    for objective in spec.space.objectives:
        table.add_column(f"{objective.metric} ({objective.reduce}, {objective.direction})", justify="right")
    for row in rows:
        table.add_row(*(shown(row["params"].get(name, "—")) for name in spec.space.params),
                      *(shown(value) for value in row["values"].values()))
    return table


def write_front(spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    """``pareto.yaml`` in the study folder, written whole; the MLflow parent gets it and the plot too."""
    text = yaml.safe_dump(rows, sort_keys=False)
    path = f"{spec.path}/{PARETO}"
    write_whole(path, text.encode())
    if spec.tracking.enabled:
        log_front(spec, text)
    return path


def log_front(spec: StudySpec, text: str) -> None:
    """``pareto.yaml`` and Optuna's Pareto-front plot (of the first two objectives when there are more than three)
    on the study's parent run."""
    from optuna.visualization import matplotlib as plot

    from fltune.tune.mlflow_runs import study_parent

    parent, study = study_parent(spec), optuna_study(spec)
    if parent is None or study is None:
        return
    tracker, run_id = parent
    tracker.log_text(run_id, text, PARETO)
    names = [o.metric for o in spec.space.objectives]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = (plot.plot_pareto_front(study, target_names=names) if len(names) <= 3 else  # Optuna draws ≤ 3
                plot.plot_pareto_front(study, targets=lambda t: tuple(t.values[:2]), target_names=names[:2]))
        tracker.log_artifact(run_id, save_plot(axes, Path(tmp) / "pareto_front.png"))
