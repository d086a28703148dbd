"""What the study's own Optuna storage says once the search ends. Which hyperparameter mattered: Optuna's fANOVA
importances (Hutter et al., 2014: each parameter's share of the objective's variance over the space, from a random
forest fitted to the completed trials), printed after the ranking and kept on the MLflow parent run with Optuna's
slice and contour plots; a trial ASHA stopped counts with the score it had when stopped. With several objectives,
the Pareto front (``Study.best_trials``: the trials no other beats on every objective) as a table, ``pareto.yaml``
and Optuna's Pareto-front plot."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import yaml

from fltune.jobs.storage import write_whole
from fltune.tune.search import completed, stored_study
from fltune.tune.spec import StudySpec

IMPORTANCE_SEED = 0
"""The forest's seed: the same trials give the same importances."""
PARETO = "pareto.yaml"


def first(trial: optuna.trial.FrozenTrial) -> float:
    """The ranking objective's value of a trial, in a study of one objective or several."""
    return trial.values[0]


def importances(study: optuna.Study) -> dict[str, float]:
    """Each parameter's importance for the (first) objective (they sum to 1), most important first; empty when
    the completed trials all scored the same: no variance to share out."""
    if len({first(trial) for trial in completed(study)}) < 2:
        return {}
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    return {name: float(value) for name, value in
            optuna.importance.get_param_importances(study, evaluator=evaluator, target=first).items()}


def log_on_parent(spec: StudySpec, texts: dict[str, str], plots: dict[str, Callable[[], Any]],
                  folder: str | None = None, metrics: dict[str, float] | None = None) -> None:
    """Files, metrics and Optuna's plots (PNG, under ``folder``) on the study's MLflow parent. Optuna's plotting
    functions are experimental and say so in a warning on each call."""
    import matplotlib.pyplot as plt
    import numpy as np

    from fltune.tune.mlflow_runs import study_parent

    tracker, run_id = study_parent(spec)
    if run_id is None:
        return
    for file, text in texts.items():
        tracker.log_text(run_id, text, file)
    tracker.log_metrics(run_id, metrics or {})
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for name, draw in plots.items():
            figure = np.ravel(draw())[0].figure  # a plot's axes, or an array of them
            figure.savefig(path := Path(tmp) / f"{name}.png", dpi=100, bbox_inches="tight")
            plt.close(figure)
            tracker.log_artifact(run_id, path, folder)


def explain(spec: StudySpec) -> str | None:
    """Importances to MLflow (tracking on) with the plots of the first objective (importances, slices, the two
    leading parameters' contour) and their line; None when the study has too few trials or no journal."""
    from optuna.visualization import matplotlib as plot

    study = stored_study(spec.path)
    found = importances(study) if study is not None else {}
    if not found:
        return None
    if spec.tracking.enabled:
        metric = spec.space.objective.metric
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
        drawn: dict[str, Callable[[], Any]] = {
            "importances": lambda: plot.plot_param_importances(study, evaluator=evaluator, target=first,
                                                               target_name=metric),
            "slice": lambda: plot.plot_slice(study, target=first, target_name=metric),
        }
        if len(found) >= 2:
            drawn["contour"] = lambda: plot.plot_contour(study, params=list(found)[:2], target=first,
                                                         target_name=metric)
        table = "".join(f"| {name} | {value:.4f} |\n" for name, value in found.items())
        log_on_parent(spec, {"importance.md": "| parameter | importance |\n| --- | --- |\n" + table}, drawn,
                      "importance", {f"importance.{name}": value for name, value in found.items()})
    shares = ", ".join(f"{name} {value:.2f}" for name, value in found.items())
    return f"which parameter mattered (fANOVA over {len(completed(study))} completed trials): {shares}"


def show_front(spec: StudySpec) -> None:
    """The Pareto front, best on the first objective first: a table, ``pareto.yaml`` in the study folder (written
    whole), and on the MLflow parent that file and Optuna's plot (of the first two objectives when there are more
    than three: Optuna draws three at most)."""
    from optuna.visualization import matplotlib as plot

    from fltune.tracking.progress import console
    from fltune.tune.board import config_table, shown

    study = stored_study(spec.path)
    if study is None or not study.best_trials:
        return
    names = [o.metric for o in spec.space.objectives]
    sign = -1.0 if spec.space.objective.direction == "max" else 1.0
    trials = sorted(study.best_trials, key=lambda t: (sign * t.values[0], t.number))
    rows = [{"params": dict(t.params), "values": dict(zip(names, map(float, t.values)))} for t in trials]
    console.print(config_table(f"study {spec.name}: Pareto front, {len(rows)} configuration(s)", spec.space.params,
                               [f"{o.metric} ({o.reduce}, {o.direction})" for o in spec.space.objectives],
                               [(row["params"], [shown(value) for value in row["values"].values()]) for row in rows]))
    text = yaml.safe_dump(rows, sort_keys=False)
    write_whole(path := f"{spec.path}/{PARETO}", text.encode())
    if spec.tracking.enabled:
        drawn = {"target_names": names} if len(names) <= 3 else \
            {"targets": lambda t: tuple(t.values[:2]), "target_names": names[:2]}
        log_on_parent(spec, {PARETO: text}, {"pareto_front": lambda: plot.plot_pareto_front(study, **drawn)})
    console.print(f"  Pareto front: {path}")
