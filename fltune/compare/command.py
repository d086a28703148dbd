"""``python cli.py compare --methods a,b,c``: a fair, multi-seed comparison of methods on one setting. Two Ray Tune
stages: with ``--tune-budget N`` one study per method (``fltune.compare.tuning``, beside the job as
``<name>-tune-<method>``), then the cells, method × seed (``CompareSpec.trial``); ``--resume`` continues either. Exit
status: 0 every cell finished; 1 some cell diverged or failed, or a study produced no score; 2 bad input (one line,
nothing written); 130 interrupted, 143 on SIGTERM (continue with ``--resume``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from fltune.cli_args import (
    JOB_STORAGE, SHORTCUTS, ExperimentOptions, check_data_here, every_flag, flag, path_text, seconds_flag,
)
from fltune.errors import FLTuneError
from fltune.jobs.scaffold import (
    CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS, GridJob, JobOptions, check_counts, listed, note_ignored, resume_line,
    start,
)
from fltune.process import ending_if_ray_dies, interrupted, say_resume, stop_status

if TYPE_CHECKING:  # Ray Tune and MLflow load only when the command runs
    from fltune.compare.spec import CompareSpec
    from fltune.config import ExperimentConfig
    from fltune.estimate import Plan
    from fltune.tune.board import TrialBoard
    from fltune.tune.mlflow_runs import RunTree
    from fltune.tune.results import TrialRow


@dataclass(frozen=True, kw_only=True)
class CompareOptions(JobOptions, ExperimentOptions):
    """A comparison as ``fltune compare``'s flags or ``fltune.compare``'s keywords ask for it: its own, then the
    experiment's as ``run`` takes them (but ``--method``)."""

    shortcuts: ClassVar[tuple[str, ...]] = tuple(name for name in SHORTCUTS if name != "method")
    methods: tuple[str, ...] | None = flag("comma-separated methods, at least two, e.g. fedavg,fedprox,scaffold",
                                           read=listed)
    seeds: int = flag("seeds per method (base seed + 0, 1, …); rows show mean ± std", 3)
    tune_budget: int | None = flag("first tune each method with this many trials (search_spaces/<method>.yaml, or "
                                   "mine.yaml beside mine.py; validation split)")
    max_concurrent: int | None = flag("trials at once (default: as many as the cluster fits)")
    checkpoint_every: int | None = every_flag(f"{CELL_CHECKPOINT_EVERY}")
    checkpoint_seconds: float | None = seconds_flag(f"{CELL_CHECKPOINT_SECONDS:g}")
    storage: str | None = flag(JOB_STORAGE, read=path_text, honoured=True)
    name: str | None = flag("job name (default: compare-<date>-<time>)", honoured=True)
    out: str | None = flag("folder for compare.csv/.md/.png and configs/ (default: compare/<name> beside the sqlite "
                           "store of tracking.uri: mlruns/compare/<name>)", read=path_text, honoured=True)
    resume: bool = flag("continue an interrupted comparison (--name, else the newest)", False, honoured=True)
    plan: bool = flag("print the studies and cells that would run and their estimated cost; run nothing", False,
                      honoured=True)

    def checked(self) -> CompareOptions:
        """The options; a dataset that is nowhere is one line before torch or Ray load."""
        if not self.resume:
            check_data_here(self.tree())
        return self

    def job(self) -> Comparison:
        return Comparison(self)

    def planned(self) -> Plan:
        """``--plan``: each method's study and cells at the base settings, with their cost; writes nothing."""
        from fltune.compare.report import notes
        from fltune.compare.spec import method_tree
        from fltune.compare.tuning import study_spec
        from fltune.estimate import Plan
        from fltune.jobs.storage import storage_root

        if self.resume:
            raise FLTuneError("--plan: plans a new comparison; allowed: --plan without --resume")
        spec = Comparison(self).spec(storage_root(self.storage))
        items = []
        for method in spec.methods:
            if spec.tune_budget:
                items.append((f"{method}: tuning, {spec.tune_budget} trial(s)", study_spec(spec, method).base,
                              spec.tune_budget))
            items.append((f"{method}: {spec.seeds} seed(s)", method_tree(spec.base, method), spec.seeds))
        return Plan.of(f"plan: compare {', '.join(spec.methods)}", items,
                       self.address or spec.config.resources.address, spec.max_concurrent, notes(spec)[:2])


def job_configs(spec: CompareSpec) -> list[ExperimentConfig]:
    """Every trial's settings at base values (tuning never moves the data): each method's cells and study."""
    from fltune.compare.spec import method_tree
    from fltune.compare.tuning import tuning_tree
    from fltune.config import build_config, set_fields

    cells = [set_fields(method_tree(spec.base, method), {"federation.seed": spec.base_seed + index})
             for method in spec.methods for index in range(spec.seeds)]
    studies = [tuning_tree(spec, method) for method in spec.methods] if spec.tune_budget else []
    return [build_config(tree) for tree in (*cells, *studies)]


class Comparison:
    """The whole command: validate, tune (when asked), run the cells, report."""

    def __init__(self, options: CompareOptions) -> None:
        self.options = options

    def spec(self, storage: str) -> CompareSpec:
        """A new comparison (every study validated too), or with ``--resume`` the saved one."""
        from fltune.compare import spec as compare_spec
        from fltune.compare.tuning import study_spec
        from fltune.tune.spec import exists

        options = self.options
        if options.resume:
            saved = compare_spec.CompareSpec.resumed(storage, options.name, "comparison")
            note_ignored(options, "comparison")
            return saved.model_copy(update={"out": options.out}) if options.out else saved
        if not options.methods:
            raise FLTuneError("--methods is required: at least two comma-separated methods, e.g. fedavg,fedprox")
        check_counts(options)
        spec = compare_spec.new_spec(
            methods=compare_spec.parse_methods(options.methods), base=options.tree(), seeds=options.seeds,
            tune_budget=options.tune_budget, storage=storage, name=options.name, out=options.out,
            max_concurrent=options.max_concurrent, checkpoint_every=options.checkpoint_every,
            checkpoint_seconds=options.checkpoint_seconds)
        if exists(spec.path):
            raise FLTuneError(f"--name {spec.name}: comparison {spec.path} already exists; add --resume to continue it")
        for method in spec.methods if spec.tune_budget else ():
            study = study_spec(spec, method)
            if exists(study.path):
                raise FLTuneError(f"--name {spec.name}: its study {study.path} already exists; choose another name")
        return spec

    def run(self) -> int:
        from fltune.compare.report import notes
        from fltune.jobs.storage import storage_root
        from fltune.tracking.progress import console

        spec = self.spec(storage_root(self.options.storage))
        start(spec, spec.out, job_configs(spec), self.options.address or spec.config.resources.address)
        if not self.options.resume:
            spec.save()
        console.print(f"[bold]fltune compare[/] {'resuming ' if self.options.resume else ''}{spec.name}: "
                      f"{', '.join(spec.methods)} × {spec.seeds} seed(s)"
                      + (f", each tuned with {spec.tune_budget} trials first" if spec.tune_budget else "")
                      + "".join(f"\n  {line}" for line in notes(spec)[:2]))
        hint = resume_line("compare", spec)
        with ending_if_ray_dies(lambda: None, hint):  # also between its Tune jobs
            try:
                return self.stages(spec, hint)
            except KeyboardInterrupt:  # a stop between its Tune jobs
                say_resume(interrupted(), hint)
                return stop_status()

    def stages(self, spec: CompareSpec, hint: str) -> int:
        """Tuning (when asked and not done yet), then the cells: the exit status."""
        if spec.tune_budget and not spec.trees:
            tuned = self.tune(spec, hint)
            if isinstance(tuned, int):
                return tuned
            spec = spec.model_copy(update={"trees": tuned})
            spec.save()
        self.cells = Cells(self.options, spec)  # its spec and trials: fltune.api.compare's result
        return self.cells.run()

    def tune(self, spec: CompareSpec, hint: str) -> dict[str, dict[str, Any]] | int:
        """Every method's study in turn (concluded ones are kept): the tuned trees, or the exit status."""
        from fltune.compare.tuning import TuningStudy, concluded, saved, study_spec, tuned_tree
        from fltune.tracking.progress import console

        trees = {}
        for method in spec.methods:
            study = saved(study_spec(spec, method))
            if not concluded(study):
                code = TuningStudy(self.options, study, hint).run()
                if code == 130:
                    say_resume("comparison interrupted", hint)
                if code:
                    return code
            tree = tuned_tree(spec, study)
            if tree is None:
                console.print(f"fltune: no trial of {method}'s study produced a score (all diverged or failed)")
                return 1
            trees[method] = tree
        return trees


class Cells(GridJob["CompareSpec"]):
    """The cells as one Tune job of the comparison's saved spec, so it always "resumes"."""

    what = "comparison"
    command = "compare"

    def __init__(self, options: CompareOptions, spec: CompareSpec) -> None:
        super().__init__(replace(options, resume=True, ignored=()))  # the comparison noted them
        self.spec = spec

    def new_spec(self, storage: str) -> CompareSpec:
        return self.spec

    def saved_spec(self, storage: str) -> CompareSpec:
        return self.spec

    def experiment(self, spec: CompareSpec) -> dict[str, Any]:
        return spec.trees[spec.methods[0]]

    def entry(self) -> Callable[[dict[str, Any], CompareSpec], None]:
        from fltune.jobs.cells import run_cell

        return run_cell

    def board(self, spec: CompareSpec) -> TrialBoard:
        from fltune.compare.report import live_board
        from fltune.tune.board import TrialBoard

        return TrialBoard(spec, live_board, self.planned_s(spec))

    def planned(self, spec: CompareSpec) -> list[tuple[str, dict[str, Any], int]]:
        return [(method, spec.trees[method], spec.seeds) for method in spec.methods]

    def run_tree(self) -> type[RunTree]:
        from fltune.compare.mlflow_runs import CompareLog

        return CompareLog

    def describe(self, spec: CompareSpec, nodes: int) -> str:
        return (f"  cells: {len(spec.cells)} ({len(spec.methods)} methods × {spec.seeds} seeds), {spec.workers} "
                f"client worker(s) each on a {nodes}-node cluster · folder {spec.path}")

    def conclude(self, spec: CompareSpec, rows: list[TrialRow]) -> int:
        """The table, the files, and the exit status."""
        from fltune.compare.report import results, rich_table, write_outputs
        from fltune.tracking.progress import console
        from fltune.tune.results import any_unscored, said_failed, unfinished

        res = results(spec, rows)
        console.print(rich_table(spec, res, f"compare {spec.name}: final accuracies, mean ± std over seeds"))
        write_outputs(spec, res, Path(spec.out))
        console.print(f"written: {spec.out}/: compare.md and .csv (every figure), compare.png, configs/<method>.yaml")
        if unfinished(rows, len(spec.cells)):
            say_resume("comparison interrupted", self.resume_command(spec))
            return 130
        return said_failed(rows, "cells") or (1 if any_unscored(r.status for r in rows) else 0)
