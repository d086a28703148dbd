"""Which hyperparameter mattered: Optuna's fANOVA importances (Hutter et al., 2014: each parameter's share of the
objective's variance over the space, from a random forest fitted to the completed trials) read from the study's
own Optuna storage, printed after the ranking and kept on the MLflow parent run with Optuna's slice and contour
plots. A trial ASHA stopped counts with the score it had when stopped."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import optuna

from fltune.tune.search import JOURNAL, journal
from fltune.tune.spec import StudySpec

IMPORTANCE_SEED = 0
"""The forest's seed: the same trials give the same importances."""


def optuna_study(spec: StudySpec) -> optuna.Study | None:
    """The study's Optuna study from its journal; None for a remote study folder, which keeps none."""
    storage = journal(spec.path)
    if storage is None or not Path(spec.path, JOURNAL).is_file():
        return None
    return optuna.load_study(study_name=spec.name, storage=storage)


def importances(study: optuna.Study) -> dict[str, float]:
    """Each parameter's importance for the (first) objective (they sum to 1), most important first; empty when
    the completed trials all scored the same: no variance to share out."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len({first(trial) for trial in done}) < 2:
        return {}
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    return {name: float(value) for name, value in
            optuna.importance.get_param_importances(study, evaluator=evaluator, target=first).items()}


def first(trial: optuna.trial.FrozenTrial) -> float:
    """The ranking objective's value of a trial, in a study of one objective or several."""
    return trial.values[0]


def importance_line(found: dict[str, float], trials: int) -> str:
    """One terminal line: the parameters by importance."""
    shares = ", ".join(f"{name} {value:.2f}" for name, value in found.items())
    return f"which parameter mattered (fANOVA over {trials} completed trials): {shares}"


def log_importances(spec: StudySpec, study: optuna.Study, found: dict[str, float]) -> None:
    """The importances on the study's MLflow parent: a table, metrics, and Optuna's plots as PNG artifacts."""
    from fltune.tune.mlflow_runs import study_parent

    parent = study_parent(spec)
    if parent is None:
        return
    tracker, run_id = parent
    tracker.log_text(run_id, "| parameter | importance |\n| --- | --- |\n"
                     + "".join(f"| {name} | {value:.4f} |\n" for name, value in found.items()), "importance.md")
    tracker.log_metrics(run_id, {f"importance.{name}": value for name, value in found.items()})
    with tempfile.TemporaryDirectory() as tmp:
        for name, draw in plots(study, found, spec.space.objective.metric).items():
            tracker.log_artifact(run_id, save_plot(draw(), Path(tmp) / f"{name}.png"), "importance")


def plots(study: optuna.Study, found: dict[str, float], metric: str) -> dict[str, Any]:
    """Optuna's matplotlib plots of the study's (first) objective ``metric``: importances, slices, and the two
    leading parameters' contour."""
    from optuna.visualization import matplotlib as plot

    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    drawn: dict[str, Any] = {
        "importances": lambda: plot.plot_param_importances(study, evaluator=evaluator, target=first,
                                                           target_name=metric),
        "slice": lambda: plot.plot_slice(study, target=first, target_name=metric),
    }
    if len(found) >= 2:
        drawn["contour"] = lambda: plot.plot_contour(study, params=list(found)[:2], target=first, target_name=metric)
    return drawn


def save_plot(axes: Any, path: Path) -> Path:
    """An Optuna plot (its axes, or an array of them) written as a PNG; its pyplot figure closed."""
    import matplotlib.pyplot as plt
    import numpy as np

    figure = np.ravel(axes)[0].figure
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def explain(spec: StudySpec) -> str | None:
    """Importances to MLflow (tracking on) and their line; None when the study has too few trials or no journal.
    Optuna's plotting functions are experimental and say so in a warning on each call."""
    study = optuna_study(spec)
    if study is None:
        return None
    found = importances(study)
    if not found:
        return None
    if spec.tracking.enabled:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            log_importances(spec, study, found)
    done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    return importance_line(found, done)
