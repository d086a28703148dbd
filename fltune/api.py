"""fltune's Python API (``run``, ``tune``, ``compare``, ``reproduce``), which the command line is a layer over.

Jobs take their command's flags as keyword arguments (``tune(num_samples=2)`` is ``--num-samples 2``). Bad
input raises :class:`fltune.FLTuneError` with the CLI's line; ``progress=False`` keeps them quiet.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fltune.errors import FLTuneError

if TYPE_CHECKING:  # torch, Ray and pydantic wait until a function runs: ``import fltune`` stays cheap
    import pandas
    from torch import nn

    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.federation import Federation
    from fltune.engine.pool import WorkerPool
    from fltune.tune.results import TrialRow


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
        try:
            import pandas
        except ImportError:
            raise FLTuneError("RunResult.to_pandas: pandas is not installed; RunResult.history is the same "
                              "rounds as a list of dicts") from None
        frame = pandas.DataFrame(self.history)
        if "round" in frame:  # the engine's rows hold it as a float, like every figure
            frame.insert(0, "round", frame.pop("round").astype(int))
        return frame


def run(cfg: ExperimentConfig | str | Path, *, progress: bool = True) -> RunResult:
    """One federated run of ``cfg`` (a config or a YAML file) on Ray, tracked in MLflow unless
    ``tracking.enabled`` is false. Checks everything before Ray starts; leaves no Ray it started running."""
    from fltune.config import ExperimentConfig
    from fltune.engine.callbacks import Callback
    from fltune.metrics.probe import check_probes
    from fltune.text import counted
    from fltune.tracking.paths import check_tracking
    from fltune.tracking.progress import ProgressCallback, console, summary_table

    class History(Callback):
        """Keeps every round's metrics."""

        def __init__(self) -> None:
            self.rounds: list[dict[str, float]] = []

        def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
            self.rounds.append(dict(metrics))

    cfg = cfg if isinstance(cfg, ExperimentConfig) else ExperimentConfig.from_yaml(cfg)
    check_probes(cfg)
    check_tracking(cfg.tracking)
    with _console_quiet(not progress):
        fed, pool = start_federation(cfg)
        console.print(f"[bold]fltune run[/] {cfg.method.name} on {cfg.data.dataset} ({cfg.partition.kind}), "
                      f"{cfg.federation.clients} clients × {cfg.federation.fraction}"
                      f"{' (each drawn alone)' if cfg.federation.sampling == 'bernoulli' else ''}, "
                      f"{counted(cfg.federation.rounds, 'round')}")
        history = History()
        callbacks: list[Any] = [history, ProgressCallback(cfg.method.name)]
        try:
            if cfg.tracking.enabled:
                from fltune.tracking.callback import MLflowCallback

                callbacks.append(MLflowCallback(cfg))
            summary = fed.run(callbacks)
        finally:
            fed.close()
            pool.shutdown()
        console.print(summary_table(summary, f"{cfg.method.name} · {cfg.data.dataset} · {summary['status']}"))
    return RunResult(cfg, summary, history.rounds, summary.get("mlflow_run_id"))


def load_model(run_id: str, *, client: int | None = None, uri: str | None = None) -> nn.Module:
    """The final model that the MLflow run ``run_id`` of ``fltune run`` saved (its ``model/`` artifact), rebuilt
    from the run's ``config.yaml`` in eval mode: the global model, or ``client``'s own where the method keeps
    personal weights. ``uri``: the tracking store, by default the one ``run`` logs to. The best configuration
    of a study is retrained, with the same bits, by ``run("…/best_config.yaml")``."""
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
    interrupted: rerun with ``resume=True``), the job's ``name`` and ``folder``, every trial, and a study's ``best``
    configuration."""

    code: int
    name: str
    folder: str
    trials: list[TrialRow] = field(default_factory=list)
    best: ExperimentConfig | None = None


def tune(space: str | Path | None = None, *, progress: bool = True, **flags: Any) -> JobResult:
    """A Ray Tune + Optuna study of one method (``fltune tune``); ``flags`` as the command's, e.g.
    ``method="./mine.py:Mine"``, ``num_samples=2``, ``overrides=["federation.rounds=2"]``."""
    from fltune.config import ExperimentConfig
    from fltune.tune.command import BEST_CONFIG, Study, add_parser

    job = Study(_args(add_parser, "tune", space=None if space is None else str(space), **flags))
    with _console_quiet(not progress):
        code = job.run()
    best_file = Path(job.spec.path) / BEST_CONFIG
    best = ExperimentConfig.from_yaml(best_file) if code == 0 and best_file.is_file() else None
    return JobResult(code, job.spec.name, job.spec.path, job.rows, best)


def compare(methods: str | list[str] | None = None, *, progress: bool = True, **flags: Any) -> JobResult:
    """Methods compared on one setting over seeds, tuned first if ``tune_budget`` (``fltune compare``):
    ``compare(["./mine.py:Mine", "fedavg"], seeds=2, overrides=[...])``; the tables land in ``out``."""
    from fltune.compare.command import Comparison, add_parser

    names = ",".join(methods) if isinstance(methods, list) else methods
    job = Comparison(_args(add_parser, "compare", methods=names, **flags))
    with _console_quiet(not progress):
        code = job.run()
    cells = getattr(job, "cells", None)  # None: a method's tuning study ended the job first
    if cells is None or not hasattr(cells, "spec"):
        return JobResult(code, flags.get("name") or "", "")
    return JobResult(code, cells.spec.name, cells.spec.path, cells.rows)


def reproduce(table: str, *, progress: bool = True, **flags: Any) -> JobResult:
    """A paper table's cells (``fltune reproduce``), e.g. ``reproduce("fedsol-table2", scale="smoke")``."""
    from fltune.reproduce.command import Reproduction, add_parsers

    job = Reproduction(_args(add_parsers, "reproduce", table=table, **flags))
    with _console_quiet(not progress):
        code = job.run()
    return JobResult(code, job.spec.name, job.spec.path, job.rows)


def _args(add: Callable[[argparse._SubParsersAction], None], command: str, **flags: Any) -> argparse.Namespace:
    """The command's flags at their defaults, then ``flags``: one definition of the options for both."""
    parser = argparse.ArgumentParser(prog="fltune")
    add(parser.add_subparsers(dest="command"))
    args = parser.parse_args([command, *([str(flags["table"])] if command == "reproduce" else [])])
    unknown = sorted(set(flags) - set(vars(args)))
    if unknown:
        raise FLTuneError(f"{command}: no option {unknown[0]!r}; allowed: {', '.join(sorted(vars(args)))}")
    for key, value in flags.items():
        setattr(args, key, value)
    return args


@contextmanager
def _console_quiet(quiet: bool) -> Iterator[None]:
    from fltune.tracking.progress import console

    was = console.quiet
    console.quiet = quiet or was
    try:
        yield
    finally:
        console.quiet = was


class CommandModule(ModuleType):
    """A command's package that is also its API function: ``fltune.tune`` called is :func:`tune` (importing
    a subpackage sets the parent's attribute of that name, so a plain function could not live beside it)."""

    def __call__(self, *args: Any, **kwargs: Any) -> JobResult:
        return globals()[self.__name__.rpartition(".")[2]](*args, **kwargs)
