"""A study's last stage: its top configurations trained again, whole, on fresh seeds and with the test data. The
winner is the best mean of the search's objective over those seeds; the test accuracy is read once, from these
runs, beside the validation one. A configuration whose ±1 std interval over seeds overlaps the winner's is
marked as within seed noise: its rank against the winner is the seeds' luck as much as its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fltune.config import set_fields
from fltune.jobs.scaffold import GridJob, JobOptions
from fltune.tune.space import Confirm, Objective, SearchSpace
from fltune.tune.spec import JobSpec, StudySpec, exists

if TYPE_CHECKING:
    from rich.table import Table

    from fltune.config import ExperimentConfig
    from fltune.tune.results import TrialRow

FOLDER = "confirm"
"""The confirmation's Tune job, inside the study folder."""


def plan(space: SearchSpace, testing: bool) -> Confirm | None:
    """What a study confirms: ``confirm``'s top and seeds; with ``confirm: none`` a validation study (one whose
    base has test data: ``testing``) still reads the test data once, for its best configuration on the search's
    seeds; a test-scored one, or one of several objectives (a Pareto front, no one winner), does nothing."""
    if space.trade_off:
        return None
    if space.confirm != "none":
        return space.confirm
    return Confirm(top=1, seeds=space.seeds) if space.on_validation and testing else None


class ConfirmSpec(JobSpec):
    """The confirmation job: the study, its top configurations (JSON of their parameters), best first, and
    ``uri``, the driver's MLflow store, where the trials log their seeds' runs."""

    study: StudySpec
    cells: list[str]
    seeds: int
    first_seed: int
    workers: int
    gpus_per_worker: float | None
    uri: str = ""

    @property
    def config(self) -> ExperimentConfig:
        return self.study.config

    @property
    def max_concurrent(self) -> int:
        return self.study.space.max_concurrent


def test_objective(space: SearchSpace) -> Objective | None:
    """The test metric beside a validation objective: the same accuracy on the test data, final value."""
    if not space.on_validation:
        return None
    return Objective(metric=space.objective.metric.removeprefix("val_"), reduce="final")


def run_confirmation(config: dict[str, Any], spec: ConfirmSpec) -> None:
    """Tune entry point: one configuration (``config["cell"]``), every confirmation seed in lockstep."""
    from functools import partial

    from fltune.tune.mlflow_runs import log_seed_runs
    from fltune.tune.trainable import Cadence, run_federations, seed_configs

    study = spec.study
    tree = set_fields(study.base, {**json.loads(config["cell"]), "federation.seed": spec.first_seed})
    if study.space.objective.reduce == "final":  # only the last round's scores count: evaluate only then
        tree = set_fields(tree, {"metrics.every": study.rounds})
    cfgs = seed_configs(tree, spec.seeds, spec.workers, spec.gpus_per_worker or 0.0)
    test = test_objective(study.space)
    run_federations(cfgs, study.space.objective, Cadence(study.space.checkpoint_every, study.space.checkpoint_seconds),
                    extra=[test] if test else (),
                    at_end=partial(log_seed_runs, spec, config["cell"]) if study.tracking.enabled else None)


class Confirmation(GridJob[ConfirmSpec]):
    """The confirmation as a Tune job of cells: resumable, stopped and cleaned up as every fltune job is."""

    what = "confirmation"
    command = "tune"

    def __init__(self, study: StudySpec, rows: list[TrialRow], confirm: Confirm, address: str | None,
                 resume: str) -> None:
        super().__init__(JobOptions(storage=study.path, address=address, resume=exists(f"{study.path}/{FOLDER}")))
        self.study, self.search_rows, self.confirm, self.hint = study, rows, confirm, resume

    def new_spec(self, storage: str) -> ConfirmSpec:
        """Fresh seeds follow the search's, except when only the test data is read (``confirm: none``)."""
        from fltune.tracking.paths import default_uri
        from fltune.tune.results import rank

        study, confirm = self.study, self.confirm
        ranked = [row for row in rank(self.search_rows, study.space.objective.direction) if row.scored][:confirm.top]
        fresh = study.space.seeds if study.space.confirm != "none" else 0
        return ConfirmSpec(name=FOLDER, storage=study.path, study=study, seeds=confirm.seeds,
                           cells=[json.dumps(row.params, sort_keys=True) for row in ranked],
                           first_seed=study.config.federation.seed + fresh, workers=study.workers,
                           gpus_per_worker=study.gpus_per_worker, uri=study.tracking.uri or default_uri())

    def saved_spec(self, storage: str) -> ConfirmSpec:
        return ConfirmSpec.load(f"{storage}/{FOLDER}")

    def experiment(self, spec: ConfirmSpec) -> dict[str, Any]:
        return spec.study.base

    def entry(self) -> Callable[[dict[str, Any], ConfirmSpec], None]:
        return run_confirmation

    def callbacks(self, spec: ConfirmSpec) -> list[Any]:
        """The board alone: the confirmation's figures go to the study's MLflow parent once it ends."""
        from fltune.tune.board import TrialBoard

        return [TrialBoard(spec, render=live_confirmation)]

    def describe(self, spec: ConfirmSpec, nodes: int) -> str:
        seeds = f"seed {spec.first_seed}" if spec.seeds == 1 else \
            f"seeds {spec.first_seed}…{spec.first_seed + spec.seeds - 1}"
        what = "with the test data" if spec.study.space.confirm == "none" else f"on {spec.seeds} fresh seed(s)"
        return f"[bold]confirming[/] the top {len(spec.cells)} configuration(s) {what} ({seeds}), all rounds"

    def resume_command(self, spec: ConfirmSpec) -> str:
        return self.hint

    def conclude(self, spec: ConfirmSpec, rows: list[TrialRow]) -> int:
        from fltune.tune.results import unfinished

        self.confirmed = confirmed(spec, rows)
        if unfinished(rows, len(spec.cells)):
            self.close_runs(spec)
            return 130
        return 0

    def close_runs(self, spec: ConfirmSpec) -> None:
        """The study's parent run, ended with the search, ends KILLED as the command does (its seeds' runs are
        logged once each ends: none is RUNNING)."""
        from fltune.tune.mlflow_runs import study_parent

        if spec.study.tracking.enabled:
            tracker, parent = study_parent(spec.study)
            if parent is not None:
                tracker.end(parent, "killed")


@dataclass
class Confirmed:
    """One configuration after the confirmation: its objective, and with a validation objective its test
    accuracy, as mean and std over the seeds."""

    params: dict[str, Any]
    mean: float
    std: float
    test_mean: float | None
    test_std: float | None
    within_noise: bool = False

    @property
    def gap(self) -> float | None:
        """Test minus validation: how far the selection score was from the data it never saw."""
        return None if self.test_mean is None else self.test_mean - self.mean


def confirmed(spec: ConfirmSpec, rows: list[TrialRow]) -> list[Confirmed]:
    """The scored configurations, the winner first, each marked when within seed noise of it."""
    from fltune.tune.results import rank
    from fltune.tune.trainable import objective_key

    test = test_objective(spec.study.space)
    key = test and objective_key(test)
    out = [Confirmed(params=json.loads(row.params["cell"]), mean=row.objective, std=row.objective_std,
                     test_mean=row.metrics.get(f"objective:{key}") if key else None,
                     test_std=row.metrics.get(f"objective_std:{key}") if key else None)
           for row in rank(rows, spec.study.space.objective.direction) if row.scored]
    for other in out[1:]:
        other.within_noise = abs(out[0].mean - other.mean) <= out[0].std + other.std
    return out


def live_confirmation(spec: ConfirmSpec, rows: list[TrialRow], planned: Any = None) -> Table:
    """The board while the confirmation runs (``TrialBoard`` renderer): each configuration's round and score."""
    from fltune.tune.board import config_table, eta, shown
    from fltune.tune.results import ENDED

    done = sum(r.status in ENDED for r in rows)
    space = spec.study.space
    return config_table(f"confirming {spec.study.name}: {done}/{len(spec.cells)} done{eta(rows, len(spec.cells))}",
                        space.params, ["state", "round", f"{space.objective.metric} (mean)"],
                        [(json.loads(row.params["cell"]),
                          [row.status, f"{row.round}/{spec.study.rounds}", shown(row.objective)]) for row in rows])


def confirmed_table(spec: ConfirmSpec, rows: list[Confirmed]) -> Table:
    """Mean ± std over seeds per configuration, validation and test side by side with their gap."""
    from fltune.tune.board import config_table

    space = spec.study.space
    columns = [f"{space.objective.metric} ({space.objective.reduce})"]
    if space.on_validation:
        columns += [f"{space.objective.metric.removeprefix('val_')} (test, final)", "gap (test − val)"]
    lines = []
    for i, row in enumerate(rows):
        cells = [f"{row.mean:.4f} ± {row.std:.4f}"]
        if space.on_validation:
            cells += [f"{row.test_mean:.4f} ± {row.test_std:.4f}", f"{row.gap:+.4f}"]
        cells.append("winner" if i == 0 else "≈ within seed noise" if row.within_noise else "")
        lines.append((row.params, cells))
    return config_table(f"confirmed: top {len(rows)} over {spec.seeds} seed(s), winner by the mean", space.params,
                        [*columns, ""], lines)
