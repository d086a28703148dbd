"""Optuna as Tune's searcher: a define-by-run space (so ``when`` conditions are native), seeded samplers,
and a diverged (or refused) trial told to Optuna as FAILED rather than scored with its last good value."""

from __future__ import annotations

from typing import Any

import optuna
from ray.tune.search.optuna import OptunaSearch

from fltune.tune.space import SearchSpace


class FLOptunaSearch(OptunaSearch):
    """OptunaSearch that reports diverged and refused trials as failures (Tune sees them end normally), and
    passes over a trial it never suggested: one a driver killed between saving Tune's state and the searcher's
    leaves, on which OptunaSearch would raise ``KeyError``. That trial still runs and is tracked."""

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
    """Optuna's define-by-run space: parameters in file order, unmet conditions skipped. A class, not a
    closure, because the searcher's state is pickled."""

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
