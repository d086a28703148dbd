"""``--tune-budget N``: one ordinary ``tune`` study per method, scored on the validation split only (no test data).
Every method gets N trials of all rounds (no early stopping: a noisy early rung cuts no method short)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fltune.compare.spec import ACCURACY, SHARED, TUNING_SEED_OFFSET, TUNING_VAL_FRACTION, CompareSpec, method_tree
from fltune.config import build_config, set_fields
from fltune.errors import FLTuneError
from fltune.jobs.scaffold import JobOptions
from fltune.jobs.storage import holds, tune_started
from fltune.plugins import label
from fltune.search_spaces import method_space, shipped
from fltune.tune.command import Study, StudyRequest
from fltune.tune.results import TrialRow, unfinished
from fltune.tune.space import SearchSpace, check_objective, check_params, parse_space, without_test
from fltune.tune.spec import StudySpec, exists


def space_file(method: str) -> Path:
    """The method's search space: the shipped one, or for a method in a file the ``.yaml`` beside it."""
    if not (path := method_space(method)).is_file():
        raise FLTuneError(f"--methods: {method} has no search space ({path}) to tune with --tune-budget; "
                          f"allowed: {', '.join(shipped())}, or leave out --tune-budget")
    return path


def tuning_tree(spec: CompareSpec, method: str) -> dict[str, Any]:
    """The method's setting as its study trains it: a validation split, no test data, the tuning seed, only the
    objective's protocol; no rounds-to-target or fine-tuning (both need test data)."""
    tree = method_tree(spec.base, method)
    val = build_config(tree).partition.val_fraction or TUNING_VAL_FRACTION
    protocol = next(p for p, acc in ACCURACY.items() if acc == spec.primary)
    return set_fields(without_test(tree), {"partition.val_fraction": val, "metrics.protocols": [protocol],
                                           "federation.seed": spec.base_seed + TUNING_SEED_OFFSET})


def study_spec(spec: CompareSpec, method: str) -> StudySpec:
    """The method's study, validated: its space over the user's setting (no ``SHARED`` setting tuned),
    ``tune_budget`` trials, the validation objective, all rounds."""
    path = space_file(method)
    space = parse_space(path)
    shared = [p for p in space.params if p.startswith(SHARED)]
    if shared:
        raise FLTuneError(f"{path}: params.{shared[0]} would differ between methods; allowed in a comparison: "
                          "method.* and training.* parameters")
    space = SearchSpace.model_validate({
        **space.model_dump(), "base": {}, "overrides": [], "num_samples": spec.tune_budget, "seeds": 1,
        "scheduler": {"name": "none"}, "confirm": "none", "max_concurrent": spec.max_concurrent or space.max_concurrent,
        "objective": {"metric": f"val_{spec.primary}", "mode": "max", "reduce": "final"},
    })
    tree = tuning_tree(spec, method)
    check_params(space, tree, method)
    check_objective(space, build_config(tree))
    return StudySpec(name=f"{spec.name}-tune-{label(method)}", storage=spec.storage, method=method, space_file=str(path),
                     space_text=path.read_text(), space=space, base=tree, workers=spec.workers,
                     gpus_per_worker=spec.gpus_per_worker)


class TuningStudy(Study):
    """One method's study inside a comparison, naming the comparison's resume command when stopped."""

    def __init__(self, options: JobOptions, spec: StudySpec, resume: str) -> None:
        super().__init__(StudyRequest(storage=spec.storage, address=options.address, resume=exists(spec.path)))
        self.spec, self.hint = spec, resume

    def new_spec(self, storage: str) -> StudySpec:
        return self.spec

    def saved_spec(self, storage: str) -> StudySpec:
        return StudySpec.load(self.spec.path)

    def resume_command(self, spec: StudySpec) -> str:
        return self.hint

    def conclude(self, spec: StudySpec, rows: list[TrialRow]) -> int:
        """The study's ranking and best configuration, or 130 (the comparison prints its resume line)."""
        if unfinished(rows, spec.space.num_samples):
            return 130
        return super().conclude(spec, rows)


def saved(study: StudySpec) -> StudySpec:
    """The study as its folder saved it, or as the comparison derives it before it starts. A saved spec left
    cut by an older fltune is written again from the comparison's, as derived when the study started."""
    from fltune.tracking.progress import console
    from fltune.tune.spec import CutSpec

    if not exists(study.path):
        return study
    try:
        return StudySpec.load(study.path)
    except CutSpec:
        console.print(f"fltune: note: {study.path}: its saved spec was cut short; written again from the comparison's")
        study.save()
        return study


def concluded(study: StudySpec) -> bool:
    """Whether the study wrote its best configuration, its last act; finished trials alone do not say so (a
    stop can land before it concludes: it then runs again and, with nothing left to train, concludes)."""
    from fltune.tune.command import BEST_CONFIG

    return holds(study.path, BEST_CONFIG)


def tuned_tree(spec: CompareSpec, study: StudySpec) -> dict[str, Any] | None:
    """The user's setting with the study's best values; None when no trial scored."""
    from ray.tune import ExperimentAnalysis

    from fltune.tune.results import best, trial_row

    trials = ExperimentAnalysis(study.path).trials if tune_started(study.path) else []
    top = best([trial_row(trial) for trial in trials], "max")
    return None if top is None else set_fields(method_tree(spec.base, study.method), top.params)
