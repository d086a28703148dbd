"""Building a study: resolve the spec from its options (the space file, the flags), make its Tuner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from fltune.config import apply_overrides, build_config, describe_validation_error
from fltune.errors import FLTuneError
from fltune.jobs.storage import check_name, storage_root
from fltune.plugins import normalised
from fltune.tune.space import (
    Asha, SearchSpace, base_tree, check_objective, check_params, is_space_setting, parse_space, space_method,
    without_test,
)
from fltune.tune.spec import StudySpec

if TYPE_CHECKING:
    from fltune.tune.command import StudyRequest


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


def scheduler(spec: StudySpec) -> TrialScheduler:
    """ASHA on rounds (``round`` is what trials report), or FIFO: every trial runs all its rounds."""
    sched = spec.space.scheduler
    if not isinstance(sched, Asha):
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="round", metric="objective", mode=spec.space.objective.direction, max_t=spec.rounds,
        grace_period=sched.grace_period, reduction_factor=sched.reduction_factor,
    )
