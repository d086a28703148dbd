"""MLflow tracking, written by one process (the driver) through an explicit client (:func:`open_store`): a study's
driver keeps many runs open, so every call names its run id (no fluent ``mlflow.start_run``).

Many processes may share a sqlite store: MLflow creates its schema without a lock (``table … already exists``), so
:func:`open_store` holds a ``flock`` meanwhile; and sqlite answers "database is locked" at once, busy timeout or not,
when a reader must become a writer while another process writes, which MLflow rolls back, so :class:`RetryingClient`
repeats it. A server's client keeps on disk what the server does not take (``backlog.keeping``).
"""

from __future__ import annotations

import fcntl
import logging
import random
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from functools import wraps
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE, ErrorCode
from mlflow.tracking import MlflowClient

from fltune.config import ExperimentConfig, TrackingConfig, flatten
from fltune.tracking.backlog import keeping
from fltune.tracking.paths import REPO, default_uri, sqlite_path

STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "killed": "KILLED",
          "stopped": "FINISHED"}
"""fltune run status → MLflow run status (a diverged run is FAILED with tag fltune.status=diverged)."""
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
"""The tag early MLflow 3 UIs read to open an experiment on its training runs, not the GenAI overview; 3.17's
has a GenAI / Model training switch and reads the page's URL instead (``?workflowType=machine_learning``)."""
GROUPS = ("acc", "loss", "cost", "hessian")
"""Metric-name prefixes that MLflow's UI sections charts by once written ``<group>/<rest>`` (``mlflow_key``)."""
RENAMED = {"loss": "loss/global", "train_loss": "train/loss", "lr": "train/lr", "samples": "train/samples",
           "round_s": "time/round_s", "eval_s": "time/eval_s"}
"""Round metrics outside ``GROUPS`` given a section of their own."""
ERROR = "fltune.error"
"""The tag holding a failed run's error (also the run's description)."""
NOTE = "mlflow.note.content"
"""The experiment tag MLflow's UI shows as its description (markdown; the first line shows folded)."""
DESCRIPTION = "\n\n".join(" ".join(paragraph.split("\n")) for paragraph in """Runs logged by fltune: federated learning methods run, tuned and compared.

**Runs.** `fltune run`: one run per federation, named *method · dataset · partition · seed*.
`fltune tune`: a parent run per study (tag `fltune.kind = study`) and a child per trial.
`fltune compare`: a parent per comparison (`fltune.kind = compare`, tag `methods`) and a child per
method × seed cell; `fltune reproduce`: a parent per table job. Filter by the tags `method`, `dataset`,
`partition`, `seed`; expand a parent to see its children.

**Metrics** are logged once per federated round, the round as the chart's step, in sections: the runs
table shows each metric's last round, i.e. its final value. `acc/…`: accuracy in [0, 1] per evaluation
protocol (`acc/global`: the global model on the pooled test set; `acc/personalized`: each client's own
model on its own held-out split, with its spread over clients `_std`, `_worst10`, `_best10`;
`acc/all_model`: the average of the clients' local models); `loss/…`: test cross-entropy per protocol;
`val/…`: the same on the validation split; `train/loss`: the clients' local objective; `cost/…`:
training TFLOPs and communication (`cost/cum_*` since round 1); `time/…`: seconds. Logged once, at the
last round: `best_acc`, `rounds_to_target`, `wall_s`, `round_s_mean`, `samples_per_s`. A failed run
holds its error in the tag `fltune.error` and its description. A trial's `objective` (± `objective_std`
over its seeds) is what its study optimises; a study's parent logs `best_objective`, a comparison's
parent each method's mean final accuracy (`final_<acc>.<method>`).

**Artifacts.** A run: `config.yaml`, `curves.png`, `model/` (the final weights; `fltune.load_model`).
A study's parent: `trials.csv`, `trials_curves.png`, `sensitivity.png`, `best_config.yaml`. A
comparison's parent: `compare.md`, `compare.csv`, `compare.png`, `configs/`.""".split("\n\n"))

for _noisy in ("mlflow.store.db.utils", "alembic.runtime.migration"):  # schema-creation chatter on a new db
    logging.getLogger(_noisy).setLevel(logging.WARNING)


RETRY_FOR_S = 120.0
"""How long a write keeps retrying "database is locked" before the error reaches the user."""

_LOCKED = "database is locked"


# MLflow logs a full traceback for every "database is locked" before raising it: ``RetryingClient`` retries those
logging.getLogger("mlflow.store.db.utils").addFilter(lambda record: _LOCKED not in record.getMessage())


@contextmanager
def store_lock(db: Path) -> Iterator[None]:
    """Exclusive lock on ``<db>.lock`` for a sqlite store: one creator at a time."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RetryingClient:
    """An ``MlflowClient`` whose every method retries "database is locked" (rolled back, hence safe to repeat) with
    jittered backoff, up to :data:`RETRY_FOR_S`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)
        if not callable(call):
            return call

        @wraps(call)
        def retried(*args: Any, **kwargs: Any) -> Any:
            deadline, pause = time.monotonic() + RETRY_FOR_S, 0.05
            while True:
                try:
                    return call(*args, **kwargs)
                except MlflowException as err:
                    locked = err.error_code == ErrorCode.Name(TEMPORARILY_UNAVAILABLE) and _LOCKED in str(err)
                    if not locked or time.monotonic() > deadline:
                        raise
                time.sleep(pause * (0.5 + random.random()))  # jitter: processes that collided don't collide again
                pause = min(2 * pause, 2.0)

        return retried


def open_store(uri: str, experiment: str) -> tuple[Any, str]:
    """A client of the store at ``uri`` and the id of ``experiment``, created if new (under :func:`store_lock`), its
    artifacts beside a sqlite database; its UI kind always set, its description where it has none (one edited in the
    UI stays). A server's client is a ``backlog.KeepingClient``."""
    db = sqlite_path(uri)
    artifacts = None if db is None else (db.parent / "artifacts" / experiment).as_uri()
    with store_lock(db) if db is not None else nullcontext():
        client = keeping(MlflowClient(uri), uri) if db is None else RetryingClient(MlflowClient(uri))
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return client, client.create_experiment(experiment, artifact_location=artifacts,
                                                    tags={NOTE: DESCRIPTION, **dict([EXPERIMENT_KIND])})
        for key, value in {NOTE: found.tags.get(NOTE, DESCRIPTION), **dict([EXPERIMENT_KIND])}.items():
            if found.tags.get(key) != value:
                client.set_experiment_tag(found.experiment_id, key, value)
        return client, found.experiment_id


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


class Tracker:
    """A thin, explicit wrapper over an MLflow client for fltune's runs (opened by :func:`open_store`)."""

    def __init__(self, tracking: TrackingConfig) -> None:
        self.client, self.experiment_id = open_store(tracking.uri or default_uri(), tracking.experiment)

    def start(self, name: str | None, tags: Mapping[str, Any], parent: str | None = None) -> str:
        """Create a run (a child when ``parent`` is given) and return its id."""
        all_tags = {"fltune.git_commit": git_commit(), **{k: str(v) for k, v in tags.items()}}
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def log_config(self, run_id: str, cfg: ExperimentConfig) -> None:
        """Flattened config as params (dotted keys) plus the YAML as an artifact."""
        self.log_params(run_id, flatten(cfg.model_dump(mode="json")))
        self.log_text(run_id, cfg.to_yaml(), "config.yaml")

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Values cut at MLflow's 6000 characters; MLflow's client splits the batch into requests of its limit."""
        self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Numeric ``metrics`` at ``step`` under their MLflow names (``mlflow_key``), accuracies first: MLflow's
        compare view plots the tuned parameters against the metric a run logged first."""
        now = int(time.time() * 1000)
        rows = sorted((Metric(mlflow_key(k), float(v), now, step or 0) for k, v in metrics.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)), key=lambda m: m.key[:4] != "acc/")
        if rows:
            self.client.log_batch(run_id, metrics=rows)

    def log_round(self, run_id: str, metrics: Mapping[str, float | None]) -> None:
        """One round's metrics at ``step = round`` (the round is the step, not a metric of its own)."""
        self.log_metrics(run_id, {k: v for k, v in metrics.items() if k != "round"}, step=int(metrics["round"]))

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: str | Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def log_text(self, run_id: str, text: str, file: str) -> None:
        self.client.log_text(run_id, text, file)

    def find(self, tags: Mapping[str, Any]) -> list[Run]:
        """The experiment's runs carrying all ``tags`` (a resumed job's). MLflow's filter has no escapes: a
        value holding a quote is matched here only."""
        wanted = {k: str(v) for k, v in tags.items()}
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in wanted.items() if "'" not in v)
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=50_000)
        return [run for run in runs if all(run.data.tags.get(k) == v for k, v in wanted.items())]

    def reopen(self, run_id: str) -> None:
        """Mark a killed or interrupted run RUNNING again because its job goes on."""
        self.client.update_run(run_id, status="RUNNING")

    def history(self, run_id: str, key: str) -> dict[int, float]:
        """``key``'s curve as logged: step → value (the last value logged at a step)."""
        logged = sorted(self.client.get_metric_history(run_id, mlflow_key(key)), key=lambda m: m.timestamp)
        return {m.step: m.value for m in logged}

    def last_step(self, run_id: str, key: str) -> int | None:
        """The highest step logged for ``key``, None if never: where a resumed run's curve continues."""
        return max(self.history(run_id, key), default=None)

    def delete(self, run_id: str) -> None:
        self.client.delete_run(run_id)

    def end(self, run_id: str, status: str, error: str | None = None) -> None:
        """Close a run: fltune status → MLflow status, never left RUNNING; a failed run's ``error`` as its tag
        and its description, which the run's page shows first."""
        self.set_tags(run_id, {"fltune.status": status, **({ERROR: error, NOTE: error} if error else {})})
        self.client.set_terminated(run_id, STATUS.get(status, "FAILED"))


def mlflow_key(name: str) -> str:
    """fltune's metric ``name`` as MLflow holds it, sectioned by its prefix (``val_acc_global`` →
    ``val/acc_global``, ``cost_cum_tflops`` → ``cost/cum_tflops``, ``train_loss`` → ``train/loss``): only at
    this boundary, so objectives, JSON and ``RunResult`` keep fltune's own names."""
    if name.startswith("val_"):
        return "val/" + name.removeprefix("val_")
    group, _, rest = name.partition("_")
    return RENAMED.get(name) or (f"{group}/{rest}" if group in GROUPS and rest else name)


def run_name(cfg: ExperimentConfig) -> str:
    """A run's name in the MLflow UI: ``tracking.run_name``, else what the run is (the tags' values), the method as
    its author calls it (its class's ``name``, else the class's), not the file path a user's method is named by."""
    if cfg.tracking.run_name:
        return cfg.tracking.run_name
    from fltune.methods import get_method

    method = get_method(cfg.method.name)
    return " · ".join([method.name or method.__name__, cfg.data.dataset, cfg.partition.kind,
                       f"seed {cfg.federation.seed}"])


def run_tags(cfg: ExperimentConfig) -> dict[str, Any]:
    """Tags that make runs filterable in ``mlflow ui`` (method, dataset, partition, seed)."""
    return {
        "method": cfg.method.name, "dataset": cfg.data.dataset, "partition": cfg.partition.kind,
        "seed": cfg.federation.seed,
    }
