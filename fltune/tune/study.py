"""Building a study: resolve the spec, size the trials, make the Tuner. A trial's placement group has an empty head
bundle (its process works only while workers wait) plus one per client actor (``plan_workers``)."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from pydantic import ValidationError
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from fltune import folders
from fltune.config import apply_overrides, build_config, describe_validation_error, set_fields
from fltune.engine.pool import plan_workers
from fltune.errors import FLTuneError
from fltune.plugins import normalised
from fltune.process import library_write_failure
from fltune.tune.results import failed_result
from fltune.tune.space import (
    Asha, SearchSpace, base_tree, check_objective, check_params, is_space_setting, parse_space, space_method,
    without_test,
)
from fltune.tune.spec import SavedSpec, StudySpec
from fltune.tune.storage import check_name, job_filesystem, storage_root
from fltune.tune.trainable import run_trial

MAX_FAILURES = 2
"""Restarts of a crashed trial from its last checkpoint; a failed write is no crash (``StopOnFailedWrite``)."""


class StopOnFailedWrite(tune.Callback):
    """Stop the job at once, in the driver, when a write failed (a trial's, or one Tune only logs:
    ``process.library_write_failure``). A restart fails the same way on a full disk and ``fail_fast`` would end
    the other trials as if done; raising ends ``fit`` with every unfinished trial resumable."""

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._stop_if_failed(trial)

    on_trial_error = on_trial_recover

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if (failed := library_write_failure()) is not None:
            raise failed

    @staticmethod
    def _stop_if_failed(trial: Any) -> None:
        """Raise the failed write that ended ``trial``'s attempt, if any (pickled by ``Trial.handle_error``)."""
        path = trial.pickled_error_file
        if path is None or not Path(path).is_file():
            return
        with open(path, "rb") as saved:
            error = pickle.load(saved)
        if (failed := folders.failed_write(error)) is not None:
            raise failed


@dataclass(frozen=True)
class StudyRequest:
    """What the command line asks for; None means "as the space file (or the saved study) says"."""

    space: str | None
    method: str | None = None
    overrides: tuple[str, ...] = ()
    num_samples: int | None = None
    max_concurrent: int | None = None
    seeds: int | None = None
    confirm: dict[str, int] | str | None = None
    warm_start: str | None = None
    name: str | None = None
    storage: str | None = None
    checkpoint_every: int | None = None
    checkpoint_seconds: float | None = None


def resolve_space(request: StudyRequest) -> tuple[SearchSpace, str, dict]:
    """The validated space with the CLI flags applied, its method, and the base experiment tree."""
    space = parse_space(request.space)
    method = normalised(request.method) if request.method else space_method(space, request.space)
    if method is None:
        raise FLTuneError(f"{request.space}: no method; add `method: NAME` to the file or pass --method")
    if request.method and space.method and method != space_method(space, request.space):
        raise FLTuneError(f"--method {request.method}: the space file {request.space} is for {space.method}")
    flags = {"num_samples": request.num_samples, "max_concurrent": request.max_concurrent, "seeds": request.seeds,
             "confirm": request.confirm, "checkpoint_every": request.checkpoint_every, "checkpoint_seconds": request.checkpoint_seconds}
    settings = [text for text in request.overrides if is_space_setting(text)]
    tree = {**space.model_dump(), **{k: v for k, v in flags.items() if v is not None}}
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
    from fltune.tune.search import finished_trials

    if folder is None:
        return None
    folder = storage_root(folder)
    finished_trials(folder)
    return folder


def placement(
    tree: dict, workers: int, gpus_per_worker: float | None, cluster: dict[str, float], node_cpus: list[float],
) -> tune.PlacementGroupFactory:
    """Head bundle (empty) + one bundle per client actor; refuse what the cluster can never place."""
    pinned = {"resources.workers": workers, "resources.gpus_per_worker": gpus_per_worker}
    plan = plan_workers(build_config(set_fields(tree, pinned)), cluster)
    if plan.in_driver:
        raise FLTuneError(
            "resources.driver_worker: a Tune trial's own process reserves no CPU to train on; "
            "allowed: false or null (the default)"
        )
    largest = max(node_cpus, default=0.0)
    if plan.cpus > largest + 1e-9:
        raise FLTuneError(
            f"resources.cpus_per_worker: {plan.cpus:g} CPUs per worker but the largest Ray node has "
            f"{largest:g}; allowed: ≤ {largest:g}"
        )
    return tune.PlacementGroupFactory([{"CPU": 0}, *plan.bundles()])


def cluster_shape() -> tuple[dict[str, float], list[float]]:
    """The cluster's total resources and each live node's CPUs."""
    nodes = [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return ray.cluster_resources(), nodes


def scheduler(spec: StudySpec) -> TrialScheduler:
    """ASHA on rounds (``round`` is what trials report), or FIFO: every trial runs all its rounds."""
    sched = spec.space.scheduler
    if not isinstance(sched, Asha):
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="round", metric="objective", mode=spec.space.objective.direction, max_t=spec.rounds,
        grace_period=sched.grace_period, reduction_factor=sched.reduction_factor,
    )


def bound_trainable(entry: Callable[[dict[str, Any], Any], None], spec: Any,
                    resources: tune.PlacementGroupFactory) -> Callable[[dict[str, Any]], None]:
    """A job's Tune trainable: ``entry(config, spec)`` under ``entry``'s name, in the trial's placement group. Not
    ``tune.with_parameters``: a driver owning object-store data exits 1, with no clean-up, when the local Ray dies under
    it (a process-group SIGTERM); the few-KB spec travels in the trainable. A refused trial (``FLTuneError``) ends with
    a ``failed`` result, not an exception that each restart would repeat."""
    def trainable(config: dict[str, Any]) -> None:
        try:
            entry(config, spec)
        except FLTuneError as err:
            tune.report(failed_result(err))

    trainable.__name__ = trainable.__qualname__ = entry.__name__  # names the trials' folders
    return tune.with_resources(trainable, resources)


def new_tuner(spec: StudySpec, resources: tune.PlacementGroupFactory, callbacks: list[tune.Callback]) -> tune.Tuner:
    """Optuna + ASHA/FIFO, at most ``max_concurrent`` trials. Optuna is imported here: grid jobs skip it. Every fltune
    job reuses a finished trial's process for the next (``reuse_actors``): torch and fltune stay imported, and a
    trial's numbers depend only on its configuration (randomness keyed by seed, round and client)."""
    from fltune.tune.search import make_searcher

    space = spec.space
    return tune.Tuner(
        bound_trainable(run_trial, spec, resources),
        tune_config=tune.TuneConfig(
            search_alg=make_searcher(spec), scheduler=scheduler(spec), num_samples=space.num_samples,
            max_concurrent_trials=space.max_concurrent, reuse_actors=True,
        ),
        run_config=run_config(spec, callbacks),
    )


def grid_tuner(trainable_: Any, cells: list[str], spec: SavedSpec, max_concurrent: int | None,
               callbacks: list[tune.Callback]) -> tune.Tuner:
    """A grid over named cells (``config["cell"]``), each run once: the jobs of ``reproduce`` and ``compare``."""
    return tune.Tuner(
        trainable_, param_space={"cell": tune.grid_search(cells)},
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=max_concurrent, reuse_actors=True),
        run_config=run_config(spec, callbacks),
    )


def run_config(spec: SavedSpec, callbacks: list[tune.Callback]) -> tune.RunConfig:
    """Every fltune Tune job's: all-or-nothing folder (``storage.job_filesystem``), crash restarts, and
    ``StopOnFailedWrite`` first (before the board says a trial restarts)."""
    return tune.RunConfig(
        name=spec.name, storage_path=spec.storage, storage_filesystem=job_filesystem(spec.storage),
        callbacks=[StopOnFailedWrite(), *callbacks], verbose=0,
        failure_config=tune.FailureConfig(max_failures=MAX_FAILURES),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
