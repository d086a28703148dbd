"""The scaffold of an fltune Tune job (a study, a paper-table reproduction, a comparison's cells): ``TuneJob.run``
validates, starts Ray, fits the trials and concludes from the job folder, also after a stop (``--resume``). A job
takes typed options (``JobOptions`` and a command's own), which the CLI fills from its flags and the Python API
from its keywords."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fltune.errors import FLTuneError
from fltune.folders import failed_write, make_out, said
from fltune.process import (
    ending_if_ray_dies, library_write_failure, signal_handlers_kept, stop_arrived, terminated,
)
from fltune.text import invoked_as

if TYPE_CHECKING:  # Ray Tune and MLflow load only when a command runs
    from ray.tune import PlacementGroupFactory, Tuner
    from ray.tune.experiment import Trial

    from fltune.config import ExperimentConfig
    from fltune.tune.board import TrialBoard
    from fltune.tune.mlflow_runs import RunTree
    from fltune.tune.results import TrialRow
    from fltune.tune.spec import JobSpec

JOB_ENV = {
    # with verbose=0 and the old output engine Tune prints nothing: the board is the job's output
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune snapshots its state every `num_to_keep` checkpoints and warns when that is frequent: by design here
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # fltune says each restart in a line (board's on_trial_recover) and each failure reason once (say_failures)
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
}

CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS = 25, 60.0
"""A job cell's default checkpoint cadence: a personalised method's checkpoint costs more than its round."""


Spec = TypeVar("Spec", bound="JobSpec")


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """What every Tune job is asked, its command's flags (``cli_args.flag``): its folder (``name`` under ``storage``),
    the cluster, whether it continues a stopped job, its trials' concurrency and checkpoint cadence."""

    name: str | None = None
    storage: str | None = None
    address: str | None = None
    resume: bool = False
    max_concurrent: int | None = None
    checkpoint_every: int | None = None
    checkpoint_seconds: float | None = None
    ignored: tuple[str, ...] = ()
    """The setting flags given with ``resume``, which the job ignores for its saved ones (``note_ignored``)."""

    def __post_init__(self) -> None:
        """Each field as its flag's ``read`` makes it, whether given as a flag's text or a keyword's value."""
        for option in fields(self):
            if (read := option.metadata.get("read")) is not None:
                object.__setattr__(self, option.name, read(getattr(self, option.name)))


def note_ignored(options: JobOptions, what: str) -> None:
    """One note naming the setting flags a resumed job ignores (``JobOptions.ignored``)."""
    from fltune.tracking.progress import console

    if options.ignored:
        console.print(f"note: a resumed {what} keeps the settings it started with; ignored: "
                      f"{', '.join(options.ignored)}")


def check_counts(options: JobOptions) -> None:
    """A job's counts ≥ 1 and ``checkpoint_seconds`` > 0, where given."""
    for flag, hint in (("seeds", ""), ("tune_budget", " (trials per method), or leave it out"),
                       ("max_concurrent", " (or leave it out: as many as fit)"), ("checkpoint_every", "")):
        value = getattr(options, flag, None)
        if value is not None and value < 1:
            raise FLTuneError(f"--{flag.replace('_', '-')}: {value}; allowed: ≥ 1{hint}")
    if options.checkpoint_seconds is not None and not options.checkpoint_seconds > 0:
        raise FLTuneError(f"--checkpoint-seconds: {options.checkpoint_seconds:g}; allowed: > 0")


def listed(names: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Names given as ``"a,b"`` (a flag's text) or as a sequence, as a tuple; None stays None."""
    if names is None:
        return None
    return tuple(names.split(",") if isinstance(names, str) else names)


def with_gpu_share(spec: Spec, cluster: dict[str, float], cpus_per_worker: float) -> Spec:
    """Pin ``gpus_per_worker`` once (kept on resume): the GPUs shared by the workers of the trials that run at
    once, as many as ``max_concurrent`` allows *and* the CPUs fit (either bound alone can starve the GPU)."""
    if spec.gpus_per_worker is not None:
        return spec
    gpus = cluster.get("GPU", 0.0)
    fit = max(1, int(cluster.get("CPU", 0.0) // (spec.workers * cpus_per_worker)))
    at_once = min(fit, spec.max_concurrent or fit)
    return spec.model_copy(update={"gpus_per_worker": min(1.0, gpus / (spec.workers * at_once)) if gpus else 0.0})


def unfinished_if_stopped(rows: list[TrialRow]) -> list[TrialRow]:
    """After a stop signal, errored trials are "pending": a process-group signal (``timeout``, Slurm) kills
    trials Tune may record as failed before pausing them; ``--resume`` reruns them (``resume_errored``)."""
    if not terminated():
        return rows
    return [replace(row, status="pending") if row.status == "failed" else row for row in rows]


def say_failures(trials: list[Trial]) -> None:
    """Why trials failed, one line per reason; nothing after a stop signal (``unfinished_if_stopped``)."""
    from ray.tune.experiment import Trial

    from fltune.tracking.progress import console
    from fltune.tune.results import failure_lines, latest_trace

    if terminated():
        return
    traces = [(trial.path, latest_trace(trial)) for trial in trials if trial.status == Trial.ERROR]
    refused = [str(trial.last_result["error"]) for trial in trials
               if trial.status != Trial.ERROR and (trial.last_result or {}).get("status") == "failed"]
    for line in failure_lines(traces, refused):
        console.print(line, markup=False, soft_wrap=True)


def start(spec: JobSpec, out: str | None, configs: list[ExperimentConfig], address: str | None) -> None:
    """A job's checks before Ray (its tracking, its storage, its ``out`` folder, its trials' data), then Ray."""
    from fltune.engine.cluster import start_ray
    from fltune.preflight import check_data
    from fltune.tracking.paths import check_tracking

    check_tracking(spec.tracking)
    if "://" not in spec.storage:  # a URI is checked as it is found (``storage.storage_root``)
        make_out(spec.storage, "--storage")
    if out is not None:
        make_out(out)
    check_data(configs)
    start_ray(address)


def resume_line(command: str, spec: JobSpec) -> str:
    """``cli.py <command> --name … --storage … --resume``: what continues the job ``spec``."""
    return f"{invoked_as()} {command} --name {spec.name} --storage {spec.storage} --resume"


class TuneJob(ABC, Generic[Spec]):
    """One kind of fltune Tune job (a study, a paper-table reproduction, a comparison's cells), run by ``run``."""

    what = "job"
    """How messages name the job."""
    command: str
    """The ``cli.py`` command (with its arguments) that continues the job with ``--resume``."""

    def __init__(self, options: JobOptions) -> None:
        self.options = options

    @abstractmethod
    def new_spec(self, storage: str) -> Spec:
        """A fresh job from the command line, validated before Ray starts."""

    @abstractmethod
    def saved_spec(self, storage: str) -> Spec:
        """The job ``--resume`` continues (``--name``, else the newest of its kind)."""

    @abstractmethod
    def experiment(self, spec: Spec) -> dict[str, Any]:
        """An experiment tree of the job's trials (their resources are the same)."""

    def trial_configs(self, spec: Spec) -> list[ExperimentConfig]:
        """The settings of the job's trials (cells: each; studies: their base), for ``check_data`` before Ray."""
        from fltune.config import build_config

        return [build_config(self.experiment(spec))]

    @abstractmethod
    def entry(self) -> Callable[[dict[str, Any], Spec], None]:
        """The trials' Tune entry point, ``entry(config, spec)`` (a module-level function)."""

    @abstractmethod
    def new_tuner(self, spec: Spec, resources: PlacementGroupFactory) -> Tuner:
        """A new Tuner of the job, with ``callbacks``: a study's sampled trials, or a grid's cells (:class:`GridJob`)."""

    def callbacks(self, spec: Spec) -> list[Any]:
        """The terminal board always; MLflow only when tracking is on (off, MLflow is never imported)."""
        board = self.board(spec)
        if not spec.tracking.enabled:
            return [board]
        return [board, self.run_tree()(spec)]

    def board(self, spec: Spec) -> TrialBoard:
        """The live board: the trials ranked (jobs of cells draw their cells instead)."""
        from fltune.tune.board import TrialBoard

        return TrialBoard(spec, planned_s=self.planned_s(spec))

    def planned(self, spec: Spec) -> list[tuple[str, dict[str, Any], int]]:
        """The job's trials for ``fltune.estimate`` (label, experiment, runs); none: no ETA until a trial ends."""
        return []

    def planned_s(self, spec: Spec) -> float | None:
        """The plan's wall time on Ray's cluster (None: no estimate), the board's ETA until a trial ends."""
        import ray

        from fltune.estimate import estimate

        items = self.planned(spec)
        try:
            return estimate(items, ray.cluster_resources(), spec.max_concurrent).wall_s if items else None
        except FLTuneError:
            return None

    def run_tree(self) -> type[RunTree]:
        """The MLflow runs the job keeps: a parent and a child per trial (jobs of cells: per cell)."""
        from fltune.tune.mlflow_runs import StudyLog

        return StudyLog

    def out(self, spec: Spec) -> str | None:
        """The folder of the job's result files besides its job folder (``--out``); None: it has none."""
        return None

    @abstractmethod
    def describe(self, spec: Spec, nodes: int) -> str:
        """The job's first line(s) on the terminal."""

    def resume_command(self, spec: Spec) -> str:
        """The command line that continues the job."""
        return resume_line(self.command, spec)

    @abstractmethod
    def conclude(self, spec: Spec, rows: list[TrialRow]) -> int:
        """Results, files and the exit status (130 when trials are left to resume)."""

    def prepare(self) -> tuple[Spec, Tuner, int]:
        """Validate, start Ray, size the trials and create or restore the Tuner; also the number of Ray nodes."""
        from ray.tune import Tuner

        from fltune.jobs.storage import job_filesystem, storage_root, tune_started, tuner_whole
        from fltune.jobs.tuner import bound_trainable, cluster_shape, placement
        from fltune.tune.spec import exists

        storage, resuming = storage_root(self.options.storage), self.options.resume
        spec = self.saved_spec(storage) if resuming else self.new_spec(storage)
        note_ignored(self.options, self.what)
        if not resuming and exists(spec.path):
            raise FLTuneError(f"--name {spec.name}: {self.what} {spec.path} already exists; "
                              "add --resume to continue it")
        tree = self.experiment(spec)
        start(spec, self.out(spec), self.trial_configs(spec), self.options.address or spec.config.resources.address)
        cluster, node_cpus = cluster_shape()
        spec = with_gpu_share(spec, cluster, spec.config.resources.cpus_per_worker)
        resources = placement(tree, spec.workers, spec.gpus_per_worker, cluster, node_cpus)
        if resuming and tune_started(spec.path):
            if not tuner_whole(spec.path):  # a new Tuner of the saved spec writes it again, as it was
                self.new_tuner(spec, resources)
            # unfinished and errored trials continue (``unfinished_if_stopped``)
            tuner = Tuner.restore(spec.path, bound_trainable(self.entry(), spec, resources), resume_unfinished=True,
                                  resume_errored=True, storage_filesystem=job_filesystem(spec.storage))
        else:
            if not resuming:
                spec.save()
            tuner = self.new_tuner(spec, resources)
        return spec, tuner, len(node_cpus)

    def close_runs(self, spec: Spec) -> None:
        """End the job's MLflow runs still RUNNING as KILLED (the command is going down; Tune ends them otherwise)."""
        from fltune.tracking.mlflow_log import Tracker
        from fltune.tune.mlflow_runs import STUDY_TAG

        if spec.tracking.enabled:
            tracker = Tracker(spec.tracking)
            for run in tracker.find({STUDY_TAG: spec.path}):
                if run.info.status == "RUNNING":
                    tracker.end(run.info.run_id, "killed")

    def stop(self, spec: Spec, err: BaseException) -> None:
        """The job ended by ``err``: its MLflow runs end KILLED; a failed write is raised again as a line
        naming the file (else the job folder), the room left, and the resume command."""
        from fltune.tracking.paths import default_uri, sqlite_path

        tracking = spec.tracking
        failed = failed_write(err, str(sqlite_path(tracking.uri or default_uri()) or tracking.uri or ""))
        try:
            self.close_runs(spec)
        except Exception:  # a full disk under the MLflow store fails this too; the line says so
            if failed is None:
                raise
        if failed is not None:
            raise said(failed, spec.path, self.resume_command(spec)) from None

    def run(self) -> int:
        """Prepare, fit, and conclude from the job folder's final state (also after a stop). An exception ends
        the MLflow runs KILLED; a failed write ends with ``WriteFailed`` (``stop``)."""
        from ray.tune import ExperimentAnalysis

        from fltune.tracking.progress import console
        from fltune.tune.results import trial_row
        from fltune.workarounds import PRUNES

        for key, value in JOB_ENV.items():
            os.environ.setdefault(key, value)
        spec, tuner, nodes = self.prepare()
        console.print(self.describe(spec, nodes))
        with ending_if_ray_dies(lambda: self.close_runs(spec), self.resume_command(spec)):
            try:
                with signal_handlers_kept():
                    tuner.fit()
                if (failed := library_write_failure()) is not None:  # Tune's last save of its state
                    raise failed
                PRUNES.release()
            except BaseException as err:
                self.stop(spec, err)
                raise
        trials = ExperimentAnalysis(spec.path).trials
        say_failures(trials)
        self.spec, self.rows = spec, unfinished_if_stopped([trial_row(trial) for trial in trials])  # fltune.api's
        code = self.conclude(spec, self.rows)
        if code != 130 and stop_arrived():  # a stop the job took after its last trial: the command ends here
            raise KeyboardInterrupt
        return code


class GridJob(TuneJob[Spec], ABC):
    """A job of fixed cells (a comparison's, a table's, a study's confirmation), each a trial run once."""

    def cells(self, spec: Spec) -> list[str]:
        """The grid's cells, each a trial's ``config["cell"]``."""
        return spec.cells

    def new_tuner(self, spec: Spec, resources: PlacementGroupFactory) -> Tuner:
        """A grid over ``cells``, each run once."""
        from ray import tune

        from fltune.jobs.tuner import job_tuner

        return job_tuner(self.entry(), spec, resources, self.callbacks(spec),
                         {"cell": tune.grid_search(self.cells(spec))}, num_samples=1)
