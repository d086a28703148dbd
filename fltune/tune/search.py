"""Optuna as Tune's searcher: a define-by-run space (so ``when`` conditions are native), seeded samplers,
and a diverged (or refused) trial told to Optuna as FAILED rather than scored with its last good value."""

from __future__ import annotations

from typing import Any

import optuna
from ray.tune.search.optuna import OptunaSearch

from fltune.tune.space import SearchSpace


class FLOptunaSearch(OptunaSearch):
    """OptunaSearch that reports diverged trials, and trials fltune refused, as failures (Tune sees them
    end normally), and passes over a trial it never suggested.

    Such a trial comes from a driver killed (SIGKILL, a lost node) after Tune had saved a new trial in the
    experiment state but before it saved the searcher's state: on ``--resume`` the trial runs, and
    OptunaSearch would raise ``KeyError`` on its first result. Its Optuna trial was lost with the killed
    driver, so there is nothing to tell Optuna; the trial still runs, scores and is tracked as any other."""

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self._ot_trials:
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id not in self._ot_trials:
            return
        if result and result.get("status") in ("diverged", "failed"):
            super().on_trial_complete(trial_id, result=None, error=True)
        else:
            super().on_trial_complete(trial_id, result=result, error=error)


class DefineByRun:
    """Optuna's define-by-run space: sample the parameters in file order, skipping unmet conditions.
    A class, not a closure, because the searcher's state is pickled into the study folder."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def __call__(self, trial: Any) -> None:
        chosen: dict[str, Any] = {}
        for name, dist in self.space.params.items():
            if dist.applies(chosen):
                chosen[name] = dist.suggest(trial, name)


def make_searcher(space: SearchSpace) -> FLOptunaSearch:
    """Metric and mode are passed here explicitly: OptunaSearch given a space ignores TuneConfig's."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the trials table says it all
    sampler_cls = optuna.samplers.TPESampler if space.sampler.name == "tpe" else optuna.samplers.RandomSampler
    return FLOptunaSearch(
        space=DefineByRun(space), metric="objective", mode=space.objective.direction,
        sampler=sampler_cls(seed=space.sampler.seed),
    )
