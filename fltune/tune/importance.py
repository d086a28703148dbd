"""Which hyperparameter mattered: Optuna's fANOVA importances (Hutter et al., 2014: each parameter's share of the
objective's variance over the space, from a random forest fitted to the completed trials) read from the study's
own Optuna storage, printed after the ranking and kept on the MLflow parent run with Optuna's slice and contour
plots. A trial ASHA stopped counts with the score it had when stopped."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
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
    if len({first(trial) for trial in completed(study)}) < 2:
        return {}
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    return {name: float(value) for name, value in
            optuna.importance.get_param_importances(study, evaluator=evaluator, target=first).items()}


def completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def first(trial: optuna.trial.FrozenTrial) -> float:
    """The ranking objective's value of a trial, in a study of one objective or several."""
    return trial.values[0]


def plots(study: optuna.Study, found: dict[str, float], metric: str) -> dict[str, Callable[[], Any]]:
    """Optuna's matplotlib plots of the study's (first) objective ``metric``: importances, slices, and the two
    leading parameters' contour."""
    from optuna.visualization import matplotlib as plot

    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    drawn: dict[str, Callable[[], Any]] = {
        "importances": lambda: plot.plot_param_importances(study, evaluator=evaluator, target=first,
                                                           target_name=metric),
        "slice": lambda: plot.plot_slice(study, target=first, target_name=metric),
    }
    if len(found) >= 2:
        drawn["contour"] = lambda: plot.plot_contour(study, params=list(found)[:2], target=first, target_name=metric)
    return drawn


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
    """Importances to MLflow (tracking on) and their line; None when the study has too few trials or no journal."""
    study = optuna_study(spec)
    found = importances(study) if study is not None else {}
    if not found:
        return None
    if spec.tracking.enabled:
        table = "".join(f"| {name} | {value:.4f} |\n" for name, value in found.items())
        log_on_parent(spec, {"importance.md": "| parameter | importance |\n| --- | --- |\n" + table},
                      plots(study, found, spec.space.objective.metric), "importance",
                      {f"importance.{name}": value for name, value in found.items()})
    shares = ", ".join(f"{name} {value:.2f}" for name, value in found.items())
    return f"which parameter mattered (fANOVA over {len(completed(study))} completed trials): {shares}"
