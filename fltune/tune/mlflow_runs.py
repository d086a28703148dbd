"""The study in MLflow: one parent run per study, one child run per trial, written by the driver only. Not Ray's
``MLflowLoggerCallback``: flat runs per ``training_iteration``, mapped to trials only in memory (a resume opens a second
run). Here runs are tagged with the study's path and trial id, so ``--resume`` (even after SIGKILL) reopens them,
continues each curve and deletes children the restored state never saw: every trial appears exactly once."""

from __future__ import annotations

import json
import math
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial
from ray.tune.logger import LoggerCallback
from ray.tune.result import AUTO_RESULT_KEYS

from fltune.config import ExperimentConfig, TrackingConfig
from fltune.metrics.figures import save_png
from fltune.tracking.backlog import keep_in
from fltune.tracking.mlflow_log import Tracker, run_tags
from fltune.tune.board import params_text
from fltune.tune.results import (
    ENDED, TrialRow, any_unscored, best, error_line, latest_trace, sensitivity_figure, trial_config, trial_row,
    trials_figure, unfinished, write_csv,
)
from fltune.tune.spec import JobSpec, StudySpec

if TYPE_CHECKING:
    from fltune.engine.federation import Federation
    from fltune.tune.confirm import ConfirmSpec

STUDY_TAG = "fltune.study"
TRIAL_TAG = "fltune.trial_id"
KIND_TAG = "fltune.kind"
CELL_TAG = "fltune.cell"  # a confirmation run's tuned parameters, as JSON (``ConfirmSpec.cells``)
EVERY_ROUND = "round_s"
"""A metric every round logs: its last step is the round a resumed trial's curves go on after."""


def loggable(metrics: dict[str, Any]) -> dict[str, float]:
    """fltune's finite numeric (not bool) round metrics, without Tune's bookkeeping (``AUTO_RESULT_KEYS``)."""
    return {k: v for k, v in metrics.items() if k not in AUTO_RESULT_KEYS and k != "done"
            and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class RunTree(LoggerCallback, ABC):
    """Tune → a parent run and one child run per trial, found again by tags when the job resumes. Pickles only the
    spec (for ``Tuner.restore``); MLflow is (re)opened in ``setup``."""

    kind = "study"

    spec: JobSpec

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def setup(self, **info: Any) -> None:
        keep_in(self.spec.path)  # what the server does not take waits in the job's folder
        self.tracker = Tracker(self.spec.tracking)
        found = self.tracker.find({STUDY_TAG: self.spec.path, KIND_TAG: self.kind})
        if found:
            self.parent = found[0].info.run_id
            self.tracker.reopen(self.parent)
        else:
            tags = {**self.parent_tags(), STUDY_TAG: self.spec.path, KIND_TAG: self.kind}
            self.parent = self.tracker.start(self.spec.name, tags)
            self.describe_parent()
        self.children: dict[str, str] = {}
        self.logged: dict[str, int] = {}
        self.nodes: dict[str, str] = {}
        self.reconciled = False
        for run in self.tracker.find({"mlflow.parentRunId": self.parent}):
            trial_id = run.data.tags.get(TRIAL_TAG)
            self.children[trial_id] = run.info.run_id
            self.logged[trial_id] = max(self.tracker.history(run.info.run_id, EVERY_ROUND), default=0)

    def parent_tags(self) -> dict[str, Any]:
        """What the job is, as the filterable tags of its parent run (one method's: ``run_tags``)."""
        return run_tags(self.spec.config)

    @abstractmethod
    def expected_trials(self) -> int:
        """How many trials the job runs when nothing stops it."""

    def describe_parent(self) -> None:
        """Log what the job is to its new parent run."""

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Delete children of trials Tune's restored state does not have (started after its last save): the first
        step sees exactly the trials restored from the job folder."""
        if self.reconciled:
            return
        for trial_id in set(self.children) - {t.trial_id for t in trials}:
            self.tracker.delete(self.children.pop(trial_id))
            self.logged.pop(trial_id, None)
        self.reconciled = True

    @abstractmethod
    def child(self, trial_id: str, params: dict[str, Any]) -> tuple[str, ExperimentConfig, dict[str, Any]]:
        """A trial's run name, its experiment and the extra params to log."""

    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self.children:
            self.tracker.reopen(self.children[trial.trial_id])
            return
        name, cfg, extra = self.child(trial.trial_id, trial.config)
        tags = {**run_tags(cfg), TRIAL_TAG: trial.trial_id, STUDY_TAG: self.spec.path, KIND_TAG: "trial"}
        child = self.tracker.start(name, tags, parent=self.parent)
        self.tracker.log_config(child, cfg)
        self.tracker.log_params(child, extra)
        self.children[trial.trial_id] = child
        self.logged[trial.trial_id] = 0

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """Per-round metrics at step=round; rounds already logged (replayed after a restore) are skipped."""
        trial_id, round_ = trial.trial_id, int(result.get("round", 0))
        if trial_id not in self.children or round_ <= self.logged.get(trial_id, 0):
            return
        nodes = result.get("worker_nodes", "")
        if self.nodes.get(trial_id) != nodes:  # a restarted trial may be placed elsewhere
            self.tracker.set_tags(self.children[trial_id], {"fltune.worker_nodes": nodes})
            self.nodes[trial_id] = nodes
        self.tracker.log_round(self.children[trial_id], loggable(result))
        self.logged[trial_id] = round_

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        trace = latest_trace(trial) if failed else ""
        self.end_trial(trial_row(trial, failed), error_line(trace) if trace else None)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        rows = [trial_row(t) for t in trials]
        for row in rows:
            if row.status not in ENDED:
                self.end_trial(row)
        self.finish(rows, unfinished(rows, self.expected_trials()))

    def end_trial(self, row: TrialRow, error: str | None = None) -> None:
        """End a trial's run; a failed one carries its error line (``results.error_line``) as MLflow shows it."""
        if row.trial_id in self.children:
            status = row.status if row.status in ENDED else "killed"
            self.tracker.end(self.children[row.trial_id], status, error)

    @abstractmethod
    def finish(self, rows: list[TrialRow], interrupted: bool) -> None:
        """Job-level results on the parent (also after an interruption: they show progress so far)."""

    def tag_counts(self, what: str, statuses: list[str]) -> None:
        """How many of the job's ``what`` (trials, cells) are in each state, as tags of its parent."""
        counts = {s: statuses.count(s) for s in (*ENDED, "killed", "running", "pending", "no data")}
        self.tracker.set_tags(self.parent, {f"fltune.{what}_{s.replace(' ', '_')}": n for s, n in counts.items() if n})

    def end_cells(self, statuses: list[str], outputs: Callable[[Path], list[Path]], interrupted: bool) -> None:
        """Cell states, files (``outputs(folder)``) and the parent's end, FAILED when a cell was lost."""
        self.tag_counts("cells", statuses)
        with tempfile.TemporaryDirectory() as tmp:
            for path in outputs(Path(tmp)):
                self.tracker.log_artifact(self.parent, path, "configs" if path.suffix == ".yaml" else None)
        self.end_job(interrupted, failed=any_unscored(statuses))

    def end_job(self, interrupted: bool, failed: bool) -> None:
        """The parent ends as the command does: KILLED when stopped (130/143), FAILED when it exits 1."""
        self.tracker.end(self.parent, "killed" if interrupted else "failed" if failed else "finished")


class StudyLog(RunTree):
    """A Tune study: the parent holds the space, the search settings and the best configuration."""

    spec: StudySpec

    def expected_trials(self) -> int:
        return self.spec.space.num_samples

    def describe_parent(self) -> None:
        spec, space, parent = self.spec, self.spec.space, self.parent
        self.tracker.log_params(parent, {
            "space": spec.space_file, "num_samples": space.num_samples, "max_concurrent": space.max_concurrent,
            "seeds": space.seeds, "objective": space.objective.metric, "mode": space.objective.direction,
            "reduce": space.objective.reduce, "sampler": space.sampler.name, "sampler_seed": space.sampler.seed,
            "scheduler": space.scheduler.model_dump_json(), "params": ",".join(space.params),
            "workers_per_trial": spec.workers, "rounds": spec.rounds,
        })
        self.tracker.log_text(parent, spec.space_text, f"space/{Path(spec.space_file).name}")
        self.tracker.log_text(parent, spec.config.to_yaml(), "base_config.yaml")

    def child(self, trial_id: str, params: dict[str, Any]) -> tuple[str, ExperimentConfig, dict[str, Any]]:
        # the tuned values are in the trial's config (``method.mu`` …); the parent's ``params`` names them
        return f"{self.spec.name}/{trial_id}", trial_config(self.spec, params), {}

    def finish(self, rows: list[TrialRow], interrupted: bool) -> None:
        spec = self.spec
        self.tag_counts("trials", [r.status for r in rows])
        top = best(rows, spec.space.objective.direction)
        with tempfile.TemporaryDirectory() as tmp:
            self.tracker.log_artifact(self.parent, write_csv(rows, spec.space, Path(tmp) / "trials.csv"))
            if any(r.scored for r in rows):
                figure = sensitivity_figure(rows, spec.space, spec.name)
                self.tracker.log_artifact(self.parent, save_png(figure, Path(tmp) / "sensitivity.png", dpi=100))
            curves = {trial: self.tracker.history(run, "objective") for trial, run in self.children.items()}
            if any(curves.values()):
                figure = trials_figure(curves, top and top.trial_id, spec.space, spec.name)
                self.tracker.log_artifact(self.parent, save_png(figure, Path(tmp) / "trials_curves.png", dpi=100))
        if top is not None:
            self.tracker.log_metrics(self.parent, {"best_objective": top.objective,
                                                   "best_objective_std": top.objective_std})
            self.tracker.set_tags(self.parent, {"fltune.best_trial": top.trial_id,
                                                **{f"best.{k}": v for k, v in top.params.items()}})
            self.tracker.log_text(self.parent, trial_config(spec, top.params).to_yaml(), "best_config.yaml")
        self.end_job(interrupted, failed=top is None or any(r.status == "failed" for r in rows))  # as it exits 1


def study_parent(study: StudySpec, tracking: TrackingConfig | None = None) -> tuple[Tracker, str | None]:
    """The study's MLflow parent run (after its trials: results logged to it once it ended; None if it has none),
    in ``tracking``'s store (default: the study's)."""
    tracker = Tracker(tracking or study.tracking)
    found = tracker.find({STUDY_TAG: study.path, KIND_TAG: StudyLog.kind})
    return tracker, found[0].info.run_id if found else None


def log_seed_runs(spec: ConfirmSpec, cell: str, feds: list[Federation]) -> None:
    """A confirmation trial's seeds, each logged as ``fltune run`` logs a run (``MLflowCallback``, ``model/``
    included), as children of the study's parent tagged with their cell, so the winner's model loads."""
    from fltune.tracking.callback import MLflowCallback

    cfgs = [trial_config(spec.study, {**json.loads(cell), "federation.seed": fed.cfg.federation.seed,
                                      "tracking.uri": spec.uri}) for fed in feds]
    tracker, parent = study_parent(spec.study, cfgs[0].tracking)
    tags = {STUDY_TAG: spec.study.path, KIND_TAG: "confirmation", CELL_TAG: cell,
            **({"mlflow.parentRunId": parent} if parent else {})}
    for fed, cfg in zip(feds, cfgs):
        log = MLflowCallback(cfg, tracker)
        log.on_start(fed)
        for row in fed.history:
            log.on_round(fed, row)
        log.on_end(fed, summary := fed.summary())
        name = f"{spec.study.name}/confirm {params_text(json.loads(cell))} · seed {fed.cfg.federation.seed}"
        tracker.set_tags(summary["mlflow_run_id"], {**tags, "mlflow.runName": name})


def log_confirmed(study: StudySpec, rows: list[Any], seed: int) -> str | None:
    """The confirmation on the study's parent run: its table, the winner's scores, parameters and configuration,
    and ``fltune.best_run``, the winner's run at ``seed`` (``log_seed_runs``), which this returns."""
    tracker, parent = study_parent(study)
    if parent is None:
        return None
    win = rows[0]
    lines = ["| " + " | ".join([*study.space.params, "mean", "std", "test_mean", "test_std", "within_noise"]) + " |",
             "|" + " --- |" * (len(study.space.params) + 5)]
    lines += ["| " + " | ".join(str(v) for v in [*(r.params.get(n, "") for n in study.space.params), r.mean, r.std,
                                                  r.test_mean, r.test_std, r.within_noise]) + " |" for r in rows]
    tracker.log_text(parent, "\n".join(lines) + "\n", "confirmed.md")
    tracker.log_metrics(parent, {"confirmed_objective": win.mean, "confirmed_objective_std": win.std,
                                 "confirmed_test": win.test_mean, "confirmed_gap": win.gap})
    tracker.set_tags(parent, {f"best.{k}": v for k, v in win.params.items()})
    tracker.log_text(parent, trial_config(study, win.params).to_yaml(), "best_config.yaml")
    runs = tracker.find({STUDY_TAG: study.path, CELL_TAG: json.dumps(win.params, sort_keys=True), "seed": seed})
    tracker.set_tags(parent, {"fltune.best_run": runs[0].info.run_id} if runs else {})  # the newest, if logged twice
    return runs[0].info.run_id if runs else None
