"""``python cli.py tune``: a Ray Tune + Optuna study of one method, tracked in MLflow. Exit status: 0 with a best
configuration, 1 when no trial scored or one failed (its last line names them), 2 for bad input (one line, before any
MLflow run exists), 130 when interrupted or 143 on SIGTERM (rerun with ``--resume``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from fltune.cli_args import RAY_ADDRESS, check_data_here, every_flag, flag, path_text, seconds_flag, set_flag
from fltune.errors import FLTuneError
from fltune.jobs.scaffold import JobOptions, TuneJob
from fltune.process import say_resume
from fltune.text import invoked_as

if TYPE_CHECKING:  # the command's heavy imports (Ray Tune, MLflow) wait until it runs
    from fltune.estimate import Plan
    from ray.tune import PlacementGroupFactory, Tuner

    from fltune.tune.confirm import Confirmed
    from fltune.tune.results import TrialRow
    from fltune.tune.spec import StudySpec

BEST_CONFIG = "best_config.yaml"
"""The best configuration's file in the study folder: the last thing a concluding study writes."""


def confirm_flag(text: dict[str, int] | str | None) -> dict[str, int] | str | None:
    """``--confirm 3x3`` as the space's ``confirm: {top: 3, seeds: 3}``; ``none`` (or such a mapping) as itself."""
    if text is None or text == "none" or isinstance(text, dict):
        return text
    top, _, seeds = text.partition("x")
    if not (top.isdigit() and seeds.isdigit() and int(top) >= 1 and int(seeds) >= 1):
        raise FLTuneError(f"--confirm: {text}; allowed: none, or TOPxSEEDS with both ≥ 1, e.g. 3x3")
    return {"top": int(top), "seeds": int(seeds)}


@dataclass(frozen=True, kw_only=True)
class StudyRequest(JobOptions):
    """A study as ``fltune tune``'s flags or ``fltune.tune``'s keywords ask for it; None: as the space file (or the
    saved study) says."""

    shortcuts: ClassVar[tuple[str, ...]] = ("rounds", "clients")
    space: str | None = flag("search-space YAML, or a shipped one by name, e.g. fedprox or search_spaces/fedprox.yaml "
                             "(default: --method's shipped space)", read=path_text, honoured=True)
    method: str | None = flag("method to tune (default: the space file's `method`)")
    overrides: tuple[str, ...] = set_flag("override a field of the base experiment, e.g. --set "
                                          "federation.rounds=20 (repeatable)")
    num_samples: int | None = flag("configurations to try (default: the file's num_samples)")
    max_concurrent: int | None = flag("trials at once (default: the file's max_concurrent)")
    seeds: int | None = flag("seeds per configuration; its score is their mean")
    confirm: dict[str, int] | str | None = flag(
        "after the search, re-run the top TOP configurations on SEEDS fresh seeds each, e.g. 3x3, or none (default: "
        "the file's confirm)", metavar="TOPxSEEDS", read=confirm_flag)
    checkpoint_every: int | None = every_flag("the file's checkpoint_every, else 1")
    checkpoint_seconds: float | None = seconds_flag("the file's checkpoint_seconds, else none")
    warm_start: str | None = flag("start the searcher from a finished study's evaluated configurations (its folder, "
                                  "e.g. studies/fedprox-quick); only new trials run", metavar="STUDY_FOLDER",
                                  read=path_text)
    name: str | None = flag("study name (default: <space stem>-<date>-<time>; with --resume: the newest study, of "
                            "--space's file when given)", honoured=True)
    storage: str | None = flag("study folder root, local or a URI like s3://bucket/studies (default: ./studies)",
                               read=path_text, honoured=True)
    address: str | None = flag(RAY_ADDRESS, honoured=True)
    resume: bool = flag("continue an interrupted study with its saved settings", False, honoured=True)
    best_out: str | None = flag("write the best configuration here (default: <study folder>/best_config.yaml)",
                                read=path_text, honoured=True)
    plan: bool = flag("print the trials, their settings, client-samples and an estimated wall time; run nothing",
                      False, honoured=True)

    def checked(self) -> StudyRequest:
        """The options with the space file found (by name, or the method's shipped one); a bad space file or a
        missing dataset is one line before Ray, torch or the methods load."""
        from fltune.config import apply_overrides, read_yaml
        from fltune.search_spaces import space_path

        options = self if self.resume else replace(self, space=space_path(self.space, self.method))
        base = read_yaml(options.space).get("base") if options.space else None
        if not options.resume and isinstance(base, dict) and isinstance(base.get("data", {}), dict):  # inline data
            check_data_here(apply_overrides({"data": dict(base.get("data", {}))},
                                            [text for text in options.overrides if text.startswith("data.")]))
        return options

    def job(self) -> Study:
        return Study(self)

    def planned(self) -> Plan:
        """``--plan``: the trials at their base settings and their cost (an upper bound under ASHA); writes
        nothing."""
        from fltune.config import build_config, set_fields
        from fltune.estimate import Plan
        from fltune.tune.confirm import plan
        from fltune.tune.space import without_test
        from fltune.tune.search import resolve_space, warm_start

        space, method, tree = resolve_space(self)
        warm_start(self.warm_start)  # a plan refuses what the job would
        notes = [f"searched: {', '.join(space.params)} ({space.sampler.name}); scheduler {space.scheduler.name}"]
        label = f"{method}: {space.num_samples} trial(s) × {space.seeds} seed(s)"
        trials = [(label, without_test(tree) if space.on_validation else tree, space.num_samples * space.seeds)]
        if (confirm := plan(space, build_config(tree).metrics.test)) is not None:  # on the seeds after the search's
            fresh = set_fields(tree, {"federation.seed": build_config(tree).federation.seed + space.seeds})
            trials.append((f"{method}: confirm top {confirm.top} × {confirm.seeds} seed(s)", fresh,
                           confirm.top * confirm.seeds))
        return Plan.of(f"plan: tune {method}", trials, self.address or tree.get("resources", {}).get("address"),
                       space.max_concurrent, notes)


class Study(TuneJob["StudySpec"]):
    """A Ray Tune + Optuna study."""

    what = "study"
    command = "tune"
    options: StudyRequest
    model_run: str | None = None
    """The MLflow run holding the winner's model (its confirmation run), once confirmed with tracking on."""
    confirmed: Sequence[Confirmed] = ()
    """The confirmed configurations, the winner first (``confirm.confirmed``)."""

    def new_spec(self, storage: str) -> StudySpec:
        from fltune.tune.search import new_spec

        return new_spec(replace(self.options, storage=storage))

    def saved_spec(self, storage: str) -> StudySpec:
        """``--name``, else the newest study (of ``--space``'s file when given)."""
        from fltune.tune.spec import StudySpec

        space, name = self.options.space, self.options.name
        stem = Path(space).stem if space else None
        return StudySpec.resumed(storage, name, f"study of {space}" if stem else "study",
                                 lambda saved: stem is None or Path(saved.space_file).stem == stem)

    def experiment(self, spec: StudySpec) -> dict[str, Any]:
        return spec.base

    def planned(self, spec: StudySpec) -> list[tuple[str, dict[str, Any], int]]:
        return [(spec.method, spec.base, spec.space.num_samples * spec.space.seeds)]

    def entry(self) -> Callable[[dict[str, Any], StudySpec], None]:
        from fltune.tune.trainable import run_trial

        return run_trial

    def new_tuner(self, spec: StudySpec, resources: PlacementGroupFactory) -> Tuner:
        """Optuna's searcher and ASHA or FIFO (Optuna is imported here: grid jobs skip it)."""
        from fltune.jobs.tuner import job_tuner
        from fltune.tune.search import make_searcher, scheduler

        return job_tuner(self.entry(), spec, resources, self.callbacks(spec), search_alg=make_searcher(spec),
                         scheduler=scheduler(spec), num_samples=spec.space.num_samples)

    def describe(self, spec: StudySpec, nodes: int) -> str:
        space, res = spec.space, spec.config.resources
        sched = space.scheduler.name
        if sched == "asha":
            sched += f" (grace {space.scheduler.grace_period} rounds)"
        return (
            f"[bold]fltune tune[/] {'resuming ' if self.options.resume else ''}study [bold]{spec.name}[/] · "
            f"{spec.method} · {space.num_samples} samples × {space.seeds} seed(s), ≤{space.max_concurrent} at "
            f"once · {space.objective.metric} ({space.objective.reduce}, {space.objective.direction}) · "
            f"{space.sampler.name} · {sched}\n  per trial: {spec.workers} client worker(s) × "
            f"{res.cpus_per_worker:g} CPU{f' + {spec.gpus_per_worker:g} GPU' if spec.gpus_per_worker else ''} on a "
            f"{nodes}-node cluster · folder {spec.path}" + warm_line(spec) + ("" if space.on_validation else
            f"\n  [yellow]selects on test data[/] ({space.objective.metric}, {space.objective.reduce}): its best "
            "score is optimistic; a val_* objective (partition.val_fraction > 0) keeps the test data out")
        )

    def conclude(self, spec: StudySpec, rows: list[TrialRow]) -> int:
        """The ranking, the confirmation and the winner's file; the exit status says how the study ended."""
        from fltune.jobs.storage import write_whole
        from fltune.tracking.progress import console
        from fltune.tune.board import trials_table
        from fltune.tune.importance import explain, show_front
        from fltune.tune.results import best, said_failed, trial_config, unfinished

        console.print(trials_table(rows, spec, f"study {spec.name}: trials ranked", ranked=True))
        if unfinished(rows, spec.space.num_samples):
            say_resume("study interrupted", self.resume_command(spec))
            return 130
        top = best(rows, spec.space.objective.direction)
        if top is None:
            console.print("fltune: no trial produced a score (all diverged or failed)")
            return 1
        if (line := explain(spec)) is not None:
            console.print(line, highlight=False)
        if spec.space.trade_off:
            show_front(spec)
        confirm = self.confirm(spec, rows)
        if confirm is None:
            return 130
        params, line = confirm if confirm else (top.params, best_line(spec, top))
        note = model_note(spec, self.model_run)
        path = self.options.best_out or f"{spec.path}/{BEST_CONFIG}"  # a concluded study is one that holds it
        write_whole(path, (note + trial_config(spec, params).to_yaml()).encode())
        console.print(f"{line}\n  config: {path}  ({invoked_as()} run --config {path})")
        console.print(f"  {note[2:].rstrip()}", highlight=False)
        return said_failed(rows, "trials")

    def confirm(self, spec: StudySpec, rows: list[TrialRow]) -> tuple[dict[str, Any], str] | tuple[()] | None:
        """The confirmation's winner and its line; () when the study confirms nothing; None when stopped."""
        from fltune.tracking.progress import console
        from fltune.tune.board import params_text
        from fltune.tune.confirm import Confirmation, confirmed_table, plan

        stage = plan(spec.space, spec.config.metrics.test)
        if stage is None:
            return ()
        job = Confirmation(spec, rows, stage, self.options.address, self.resume_command(spec))
        if job.run() == 130:
            say_resume("study interrupted", self.resume_command(spec))
            return None
        if not job.confirmed:  # every confirmation run diverged or failed: the search's best stands
            return ()
        console.print(confirmed_table(job.spec, job.confirmed))
        self.confirmed = job.confirmed
        if spec.tracking.enabled:
            from fltune.tune.mlflow_runs import log_confirmed

            self.model_run = log_confirmed(spec, job.confirmed, job.spec.first_seed)
        win = job.confirmed[0]
        test = "" if win.test_mean is None else (f"; on test {win.test_mean:.4f} ± {win.test_std:.4f} "
                                                 f"(gap {win.gap:+.4f})")
        return win.params, (f"[bold green]best[/] {spec.space.objective.metric} = {win.mean:.4f} ± {win.std:.4f} "
                            f"over {job.spec.seeds} seed(s){test} with {params_text(win.params)}")


def model_note(spec: StudySpec, run_id: str | None) -> str:
    """best_config.yaml's first line: the MLflow run holding the winner's model, or how to train it."""
    from fltune.tracking.paths import default_uri

    if run_id is None:
        return "# model: not saved by the study; fltune.run(<this file>).model() trains and returns it\n"
    uri = spec.tracking.uri or default_uri()
    return f"# model: runs:/{run_id}/model in {uri}; fltune.load_model({run_id!r}, uri={uri!r}) returns it\n"


def warm_line(spec: StudySpec) -> str:
    """The header's line on ``--warm-start``: how many evaluated configurations the searcher starts from."""
    from fltune.tune.search import finished_trials

    if not spec.warm_start:
        return ""
    return (f"\n  warm start: {len(finished_trials(spec.warm_start))} evaluated configuration(s) carried over "
            f"from {spec.warm_start}; {spec.space.num_samples} new trial(s) run")


def best_line(spec: StudySpec, top: TrialRow) -> str:
    """The search's best trial, as the study names it when it confirms nothing."""
    from fltune.tune.board import params_text

    return (f"[bold green]best[/] {top.trial_id}: {spec.space.objective.metric} = {top.objective:.4f}"
            + (f" ± {top.objective_std:.4f}" if spec.space.seeds > 1 else "") + f" with {params_text(top.params)}")
