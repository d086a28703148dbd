"""A study's search: its space resolved from the file and the flags into a ``StudySpec``, ASHA or FIFO, and Optuna as
Tune's searcher: a define-by-run space (so ``when`` conditions are native), seeded samplers,
a diverged (or refused) trial told to Optuna as FAILED rather than scored with its last good value, and the
Optuna study kept in a journal file in the study folder, where ``optuna.load_study`` and ``optuna-dashboard``
open it and a later study's ``--warm-start`` reads its trials."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from pydantic import ValidationError
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search.optuna import OptunaSearch

from fltune.config import apply_overrides, build_config, describe_validation_error
from fltune.errors import FLTuneError
from fltune.jobs.storage import check_name, storage_root
from fltune.plugins import normalised
from fltune.tune.space import (
    Asha, SearchSpace, base_tree, check_objective, check_params, is_space_setting, parse_space, space_method,
    without_test,
)
from fltune.tune.spec import StudySpec
from fltune.tune.trainable import objective_key
from fltune.workarounds import optuna_study, optuna_trial_open

if TYPE_CHECKING:
    from fltune.tune.command import StudyRequest

JOURNAL = "optuna.journal"
"""The study's Optuna storage (``JournalStorage`` over a file), in a local study folder."""


class FLOptunaSearch(OptunaSearch):
    """OptunaSearch that reports diverged and refused trials as failures (Tune sees them end normally), and
    passes over a trial it never suggested or whose end its storage already holds (``workarounds.optuna_trial_open``,
    after a killed driver); that trial still runs and is tracked."""

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if optuna_trial_open(self, trial_id):
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if not optuna_trial_open(self, trial_id):
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


def journal(folder: str) -> optuna.storages.JournalStorage | None:
    """The Optuna storage of a study folder; None for a remote one (a journal needs a local file and its lock)."""
    if "://" in folder:
        return None
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(f"{folder}/{JOURNAL}"))


def stored_study(folder: str) -> optuna.Study | None:
    """The Optuna study a study folder keeps (one per folder); None when it keeps none: a remote folder, or one
    without a journal (checked before opening it: the backend creates the file)."""
    if "://" in folder or not Path(folder, JOURNAL).is_file():
        return None
    storage = journal(folder)
    return optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)


def completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def finished_trials(folder: str) -> list[optuna.trial.FrozenTrial]:
    """The completed trials of the study in ``folder`` (``--warm-start``), checked to be there."""
    if (study := stored_study(folder)) is None:
        raise FLTuneError(f"--warm-start {folder}: no Optuna study there ({JOURNAL}); allowed: the local folder "
                          "of a study this fltune ran")
    if not (trials := completed(study)):
        raise FLTuneError(f"--warm-start {folder}: its study has no completed trial to carry over")
    return trials


def resolve_space(request: StudyRequest) -> tuple[SearchSpace, str, dict]:
    """The validated space with the CLI flags applied, its method, and the base experiment tree."""
    if not request.space:
        raise FLTuneError("--space or --method is required (a search-space YAML, e.g. search_spaces/fedprox.yaml, "
                          "or a method with a shipped space)")
    space = parse_space(request.space)
    method = normalised(request.method) if request.method else space_method(space, request.space)
    if method is None:
        raise FLTuneError(f"{request.space}: no method; add `method: NAME` to the file or pass --method")
    if request.method and space.method and method != space_method(space, request.space):
        raise FLTuneError(f"--method {request.method}: the space file {request.space} is for {space.method}")
    flags = ("num_samples", "max_concurrent", "seeds", "confirm", "checkpoint_every", "checkpoint_seconds")
    settings = [text for text in request.overrides if is_space_setting(text)]
    tree = {**space.model_dump(), **{k: getattr(request, k) for k in flags if getattr(request, k) is not None}}
    try:
        space = SearchSpace.model_validate(apply_overrides(tree, settings, fresh=("scheduler",)))
    except ValidationError as err:
        raise FLTuneError(f"command line: {describe_validation_error(err, model=SearchSpace)}") from None
    experiment = [text for text in request.overrides if not is_space_setting(text)]
    tree = apply_overrides(base_tree(space, request.space, method), [*space.overrides, *experiment])
    cfg = build_config(tree)  # raises with the bad field named
    check_params(space, tree, method)
    check_objective(space, cfg)
    if space.on_validation:  # and as the search trains it, without test data
        check_objective(space, build_config(without_test(tree)))
    return space, method, tree


def new_spec(request: StudyRequest) -> StudySpec:
    """A fresh study: validated, named ``<space stem>-<time>`` unless --name (no Ray needed yet)."""
    space, method, tree = resolve_space(request)
    name = check_name(request.name or f"{Path(request.space).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    resources = build_config(tree).resources
    return StudySpec(
        name=name, storage=storage_root(request.storage), method=method, space_file=str(request.space),
        space_text=Path(request.space).read_text(), space=space, base=tree, workers=resources.workers or 1,
        gpus_per_worker=resources.gpus_per_worker, warm_start=warm_start(request.warm_start),
    )


def warm_start(folder: str | None) -> str | None:
    """``--warm-start``'s study folder, absolute, once checked to hold completed trials."""
    if folder is None:
        return None
    folder = storage_root(folder)
    finished_trials(folder)
    return folder


def make_searcher(spec: StudySpec) -> FLOptunaSearch:
    """The study's searcher, its Optuna study in the study folder's journal. A new study starts with the
    ``--warm-start`` study's completed trials, which the sampler learns from and Tune never runs (a Tuner made
    again for the same study finds its journal holding trials and adds none)."""
    searcher = optuna_search(spec.space, journal(spec.path), spec.name)
    study = optuna_study(searcher)
    if spec.warm_start and not study.trials:
        study.add_trials(finished_trials(spec.warm_start))
    return searcher


def optuna_search(space: SearchSpace, storage: optuna.storages.BaseStorage | None = None,
                  study_name: str | None = None) -> FLOptunaSearch:
    """Tune's OptunaSearch on the space's sampler, seeded. Metric and mode are passed here explicitly: OptunaSearch
    given a space ignores TuneConfig's."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the trials table says it all
    chosen = space.sampler
    sampler = optuna.samplers.RandomSampler(seed=chosen.seed) if chosen.name == "random" else \
        optuna.samplers.TPESampler(seed=chosen.seed, n_startup_trials=chosen.n_startup_trials,
                                   multivariate=chosen.multivariate)
    multi = bool(space.trade_off)  # several objectives: a list of metrics and modes, Optuna's Pareto front
    return FLOptunaSearch(
        space=DefineByRun(space), metric=[f"objective:{objective_key(o)}" for o in space.objectives] if multi
        else "objective", mode=[o.direction for o in space.objectives] if multi else space.objective.direction,
        sampler=sampler, storage=storage, study_name=study_name,
    )


def scheduler(spec: StudySpec) -> TrialScheduler:
    """ASHA on rounds (``round`` is what trials report), or FIFO: every trial runs all its rounds."""
    sched = spec.space.scheduler
    if not isinstance(sched, Asha):
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="round", metric="objective", mode=spec.space.objective.direction, max_t=spec.rounds,
        grace_period=sched.grace_period, reduction_factor=sched.reduction_factor,
    )
