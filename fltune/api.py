"""fltune's Python API (``run``, ``tune``, ``compare``, ``reproduce``), which the command line is a layer over.

A job function's keywords are its command's flags (``tune(num_samples=2)`` is ``--num-samples 2``): both are the
fields of the command's typed options (``StudyRequest``, ``CompareOptions``, ``ReproduceOptions``), run by the same
code. Bad input raises :class:`fltune.FLTuneError` with the CLI's line; ``progress=False`` keeps them quiet.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fltune.cli_args import SHORTCUTS, JobCommand, flag_fields, spelling
from fltune.compare.command import CompareOptions
from fltune.errors import FLTuneError
from fltune.reproduce.command import ReproduceOptions
from fltune.tune.command import StudyRequest

if TYPE_CHECKING:  # torch, Ray and pydantic wait until a function runs: ``import fltune`` stays cheap
    import pandas
    from torch import nn

    from fltune.compare.command import Comparison
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.federation import Federation
    from fltune.estimate import Plan
    from fltune.engine.pool import WorkerPool
    from fltune.reproduce.command import Reproduction
    from fltune.tune.command import Study
    from fltune.tune.confirm import Confirmed
    from fltune.tune.results import TrialRow

Result = TypeVar("Result")


@dataclass
class RunResult:
    """One federation's outcome: ``metrics`` (the final summary, ``status`` included), ``history`` (each
    round's metrics, a list of dicts), and the MLflow run's id (None with tracking off)."""

    config: ExperimentConfig
    metrics: dict[str, Any]
    history: list[dict[str, float]]
    run_id: str | None

    @property
    def status(self) -> str:
        """finished or diverged."""
        return self.metrics["status"]

    def model(self, client: int | None = None) -> nn.Module:
        """The run's final model as MLflow saved it (:func:`load_model`): the global one, or ``client``'s own."""
        if self.run_id is None:
            raise FLTuneError("RunResult.model: this run was not tracked (tracking.enabled: false), so no model "
                              "was saved; allowed: a run with tracking on")
        return load_model(self.run_id, client=client, uri=self.config.tracking.uri)

    def to_pandas(self) -> pandas.DataFrame:
        """The history as a DataFrame, one row per round, ``round`` its first column, an int (needs pandas)."""
        import pandas  # MLflow's own dependency

        frame = pandas.DataFrame(self.history)
        if "round" in frame:  # the engine's rows hold it as a float, like every figure
            frame.insert(0, "round", frame.pop("round").astype(int))
        return frame


def run(cfg: ExperimentConfig | str | Path, *, plan: bool = False, progress: bool = True) -> RunResult | Plan:
    """One federated run of ``cfg`` (a config or a YAML file) on Ray, tracked in MLflow unless
    ``tracking.enabled`` is false. Checks everything before Ray starts; leaves no Ray it started running.
    ``plan=True``: the :class:`fltune.estimate.Plan` instead (``str()`` is what ``fltune run --plan`` prints)."""
    from fltune.config import ExperimentConfig
    from fltune.data.locations import check_here

    cfg = cfg if isinstance(cfg, ExperimentConfig) else ExperimentConfig.from_yaml(cfg)
    check_here(cfg.data.dataset, cfg.data.root, cfg.data.download)  # before torch and Ray: one line at once
    cfg = ExperimentConfig(**cfg.model_dump())  # whole again: a rule between fields an edit of one can break
    from fltune.metrics.probe import check_probes, omitted_figures, unmeasured_protocols
    from fltune.text import counted
    from fltune.tracking.paths import check_tracking
    from fltune.tracking.progress import ProgressCallback, console, summary_table

    if plan:
        from fltune.estimate import Plan

        return Plan.of(f"plan: run {cfg.method.name}", [(cfg.method.name, cfg.model_dump(mode="json"), 1)],
                       cfg.resources.address, None, [f"not measured: {idle}" for idle in unmeasured_protocols(cfg)])
    check_probes(cfg)
    check_tracking(cfg.tracking)
    with _console_quiet(not progress):
        fed, pool = start_federation(cfg)
        console.print(f"[bold]fltune run[/] {cfg.method.name} on {cfg.data.dataset} ({cfg.partition.kind}), "
                      f"{cfg.federation.clients} clients × {cfg.federation.fraction}"
                      f"{' (each drawn alone)' if cfg.federation.sampling == 'bernoulli' else ''}, "
                      f"{counted(cfg.federation.rounds, 'round')}")
        for line in omitted_figures(cfg):
            console.print(f"not measured: {line}", markup=False)
        callbacks: list[Any] = [ProgressCallback(cfg.method.name)]
        try:
            if cfg.tracking.enabled:
                from fltune.tracking.callback import MLflowCallback

                callbacks.append(MLflowCallback(cfg))
            summary = fed.run(callbacks)
        finally:
            fed.close()
            pool.shutdown()
        console.print(summary_table(summary, f"{cfg.method.name} · {cfg.data.dataset} · {summary['status']}"))
    return RunResult(cfg, summary, [dict(row) for row in fed.history], summary.get("mlflow_run_id"))


def load_model(run_id: str, *, client: int | None = None, uri: str | None = None) -> nn.Module:
    """The final model that the MLflow run ``run_id`` of ``fltune run`` saved (its ``model/`` artifact), rebuilt
    from the run's ``config.yaml`` in eval mode: the global model, or ``client``'s own where the method keeps
    personal weights. ``uri``: the tracking store, by default the one ``run`` logs to. A study's winner:
    ``load_model(result.model_run, uri=…)``, the run named in the first line of its ``best_config.yaml``."""
    import os
    import tempfile

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from fltune.config import ExperimentConfig
    from fltune.engine.builders import saved_model
    from fltune.tracking.callback import MODEL
    from fltune.tracking.paths import default_uri

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a model loads without download bars
    store = MlflowClient(uri or default_uri())
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = Path(store.download_artifacts(run_id, MODEL, tmp))
            cfg = ExperimentConfig.from_yaml(store.download_artifacts(run_id, "config.yaml", tmp))
        except (MlflowException, OSError) as err:
            raise FLTuneError(f"load_model: run {run_id!r} holds no saved model in {store.tracking_uri} "
                              f"({str(err).splitlines()[0]}); allowed: a finished run of fltune run") from None
        return saved_model(cfg, folder, client)


def start_federation(cfg: ExperimentConfig) -> tuple[Federation, WorkerPool]:
    """The run's federation on its own workers; the dataset loads on a thread while Ray starts. Workers are
    placed first (an unplaceable plan fails before anything is logged); a failed load leaves nothing running."""
    from concurrent.futures import ThreadPoolExecutor

    import ray

    from fltune.engine.cluster import start_ray

    started_here = not ray.is_initialized()
    with ThreadPoolExecutor(1, thread_name_prefix="fltune-data") as loader:
        data = loader.submit(_load_data, cfg)
        try:
            own_ray = start_ray(cfg.resources.address)
            from fltune.assembly import build_federation
            from fltune.engine.federation import open_all
            from fltune.engine.pool import WorkerPool, plan_workers

            pool = WorkerPool(plan_workers(cfg, ray.cluster_resources(), own_ray))
        except BaseException:
            data.cancel()
            raise
        try:
            fed = build_federation(cfg, data.result(), pool)
            open_all([fed])  # the run reads the workers' shared copy from here on
        except BaseException:
            pool.shutdown()
            if started_here:
                ray.shutdown()
            raise
    return fed, pool


def _load_data(cfg: ExperimentConfig) -> FederatedData:
    from fltune.engine.builders import load_data

    return load_data(cfg)


# ------------------------------------------------------------------------------------------ the jobs
@dataclass
class JobResult:
    """A Tune job's outcome: ``code`` the exit status (0 done, 1 nothing scored or a trial failed, 130
    interrupted: rerun with ``resume=True``), the job's ``name`` and ``folder``, every trial, a study's ``best``
    configuration and ``model_run``, the MLflow run holding its model, if any (:func:`load_model`), and its
    ``confirmed`` configurations, the winner first: each its objective's and test score's mean and std over the
    fresh seeds, and whether it is within seed noise of the winner."""

    code: int
    name: str
    folder: str
    trials: list[TrialRow] = field(default_factory=list)
    best: ExperimentConfig | None = None
    model_run: str | None = None
    confirmed: list[Confirmed] = field(default_factory=list)


@dataclass
class CompareResult(JobResult):
    """A comparison's outcome: a :class:`JobResult` and ``out``, the folder holding compare.csv, .md and .png."""

    out: str = ""

    def to_pandas(self) -> pandas.DataFrame:
        """compare.csv: a row per method and figure, mean ± std over the seeds (needs pandas)."""
        import pandas

        table = Path(self.out) / "compare.csv"
        if not table.is_file():
            raise FLTuneError(f"CompareResult.to_pandas: {table} was not written (exit status {self.code}); "
                              "allowed: a comparison whose cells ran")
        return pandas.read_csv(table)


def _job_function(kind: type[JobCommand], result: Callable[[Any, int], Result]) -> Callable[..., Result | Plan]:
    """A job function made of ``result`` (what it returns of a job that ran): its keywords are its command's options
    ``kind``, then ``progress``; it runs them as ``fltune <command>`` does (``cli.cmd_job``), or with ``plan=True``
    returns the plan. Its docstring lists the keywords with their flags' help."""
    # the flags, each of its name (``set`` for ``--set``; the first one positional), then the fields a shortcut fills
    keywords = {spelling(option): option for option in flag_fields(kind)}
    keywords |= {option.name: option for option in fields(kind) if option.name in kind.shortcuts}

    @functools.wraps(result)
    def function(*args: Any, **given: Any) -> Result | Plan:
        arguments = function.__signature__.bind(*args, **given).arguments
        quiet = not arguments.pop("progress", True)
        options = kind(**{keywords[key].name: value for key, value in arguments.items()}).checked()
        if options.plan:
            return options.planned()
        job = options.job()
        with _console_quiet(quiet):
            return result(job, job.run())

    function.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY if index else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            annotation=_takes(option),
                            default=inspect.Parameter.empty if option.default is MISSING else option.default)
          for index, (name, option) in enumerate(keywords.items())),
        inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=True, annotation="bool"),
    ], return_annotation=f"{inspect.signature(result).return_annotation} | Plan")
    intro = ("Keywords, each the flag of that name (``set``: ``--set``); with ``plan=True`` it returns the "
             ":class:`fltune.estimate.Plan` (``str()`` is what ``--plan`` prints) and runs nothing; "
             "``progress=False`` prints nothing.")
    helps = [f"{name}: {option.metadata.get('help') or f'= --set {SHORTCUTS[name][0]}=…'}"
             for name, option in keywords.items()]
    function.__doc__ = "\n\n".join([
        result.__doc__ or "", textwrap.fill(intro, 116, initial_indent="    ", subsequent_indent="    "),
        "\n".join(textwrap.fill(text, 116, initial_indent="    ", subsequent_indent="        ") for text in helps)])
    return function


def _takes(option: Field) -> Any:
    """What a keyword takes: what the field's ``read`` takes, else the field's type."""
    read = option.metadata.get("read")
    return next(iter(inspect.signature(read).parameters.values())).annotation if read else option.type


@functools.partial(_job_function, StudyRequest)
def tune(job: Study, code: int) -> JobResult:
    """A Ray Tune + Optuna study of one method, as ``fltune tune``: a :class:`JobResult` whose ``best`` is the best
    configuration."""
    from fltune.config import ExperimentConfig
    from fltune.tune.command import BEST_CONFIG

    best_file = Path(job.spec.path) / BEST_CONFIG
    best = ExperimentConfig.from_yaml(best_file) if code == 0 and best_file.is_file() else None
    return JobResult(code, job.spec.name, job.spec.path, job.rows, best, job.model_run if best else None,
                     list(job.confirmed) if best else [])


@functools.partial(_job_function, CompareOptions)
def compare(job: Comparison, code: int) -> CompareResult:
    """Methods compared on one setting over seeds, as ``fltune compare``, e.g. ``compare(["fedavg", "./mine.py:Mine"],
    set={"federation.rounds": 2})``: a :class:`CompareResult`, ``to_pandas()`` its compare.csv."""
    cells = getattr(job, "cells", None)  # None: a method's tuning study ended the job first
    if cells is None or not hasattr(cells, "spec"):
        return CompareResult(code, job.options.name or "", "")
    return CompareResult(code, cells.spec.name, cells.spec.path, cells.rows, out=cells.spec.out)


@functools.partial(_job_function, ReproduceOptions)
def reproduce(job: Reproduction, code: int) -> JobResult:
    """A paper table's cells, as ``fltune reproduce``, e.g. ``reproduce("fedsol-table2", datasets=["fmnist"])``: a
    :class:`JobResult`."""
    return JobResult(code, job.spec.name, job.spec.path, job.rows)


@contextmanager
def _console_quiet(quiet: bool) -> Iterator[None]:
    from fltune.tracking.progress import console

    was = console.quiet
    console.quiet = quiet or was
    try:
        yield
    finally:
        console.quiet = was
