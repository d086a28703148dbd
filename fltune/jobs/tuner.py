"""The Tune side of every fltune job: a trial's placement group (an empty head bundle, its process working only
while its workers wait, plus one per client actor: ``plan_workers``), the trainable bound to its job's spec, and the
Tuner's run settings (all-or-nothing folder, crash restarts, a stop on a failed write)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray import tune

from fltune import folders
from fltune.config import build_config, set_fields
from fltune.engine.pool import plan_workers
from fltune.errors import FLTuneError
from fltune.jobs.storage import job_filesystem
from fltune.process import library_write_failure
from fltune.tune.results import failed_result
from fltune.tune.spec import SavedSpec

MAX_FAILURES = 2
"""Restarts of a crashed trial from its last checkpoint; a failed write is no crash (``StopOnFailedWrite``)."""


class StopOnFailedWrite(tune.Callback):
    """Stop the job at once, in the driver, when a write failed (a trial's, or one Tune only logs:
    ``process.library_write_failure``). A restart fails the same way on a full disk and ``fail_fast`` would end
    the other trials as if done; raising ends ``fit`` with every unfinished trial resumable."""

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Raise the failed write that ended ``trial``'s attempt, if any (pickled by ``Trial.handle_error``)."""
        path = trial.pickled_error_file
        if path is None or not Path(path).is_file():
            return
        with open(path, "rb") as saved:
            error = pickle.load(saved)
        if (failed := folders.failed_write(error)) is not None:
            raise failed

    on_trial_error = on_trial_recover

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if (failed := library_write_failure()) is not None:
            raise failed


def placement(
    tree: dict, workers: int, gpus_per_worker: float | None, cluster: dict[str, float], node_cpus: list[float],
) -> tune.PlacementGroupFactory:
    """Head bundle (empty) + one bundle per client actor; refuse what the cluster can never place."""
    pinned = {"resources.workers": workers, "resources.gpus_per_worker": gpus_per_worker}
    plan = plan_workers(build_config(set_fields(tree, pinned)), cluster)
    if plan.in_driver:
        raise FLTuneError(
            "resources.driver_worker: a Tune trial's own process reserves no CPU to train on; "
            "allowed: false or null (the default)"
        )
    largest = max(node_cpus, default=0.0)
    if plan.cpus > largest + 1e-9:
        raise FLTuneError(
            f"resources.cpus_per_worker: {plan.cpus:g} CPUs per worker but the largest Ray node has "
            f"{largest:g}; allowed: ≤ {largest:g}"
        )
    return tune.PlacementGroupFactory([{"CPU": 0}, *plan.bundles()])


def cluster_shape() -> tuple[dict[str, float], list[float]]:
    """The cluster's total resources and each live node's CPUs."""
    nodes = [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return ray.cluster_resources(), nodes


def bound_trainable(entry: Callable[[dict[str, Any], Any], None], spec: Any,
                    resources: tune.PlacementGroupFactory) -> Callable[[dict[str, Any]], None]:
    """A job's Tune trainable: ``entry(config, spec)`` under ``entry``'s name, in the trial's placement group. Not
    ``tune.with_parameters``: a driver owning object-store data exits 1, with no clean-up, when the local Ray dies under
    it (a process-group SIGTERM); the few-KB spec travels in the trainable. A refused trial (``FLTuneError``) ends with
    a ``failed`` result, not an exception that each restart would repeat."""
    def trainable(config: dict[str, Any]) -> None:
        try:
            entry(config, spec)
        except FLTuneError as err:
            tune.report(failed_result(err))

    trainable.__name__ = trainable.__qualname__ = entry.__name__  # names the trials' folders
    return tune.with_resources(trainable, resources)


def job_tuner(entry: Callable[[dict[str, Any], Any], None], spec: SavedSpec, resources: tune.PlacementGroupFactory,
              callbacks: list[tune.Callback], param_space: dict[str, Any] | None = None, **settings: Any) -> tune.Tuner:
    """Every fltune job's Tuner: ``entry``'s trials (``settings``: the rest of their ``TuneConfig``), at most
    ``max_concurrent`` at once. A finished trial's process is reused for the next (``reuse_actors``): torch and
    fltune stay imported, and a trial's numbers depend only on its configuration (randomness keyed by seed, round
    and client)."""
    settings = {"max_concurrent_trials": spec.max_concurrent, "reuse_actors": True, **settings}
    return tune.Tuner(bound_trainable(entry, spec, resources), param_space=param_space,
                      tune_config=tune.TuneConfig(**settings), run_config=run_config(spec, callbacks))


def run_config(spec: SavedSpec, callbacks: list[tune.Callback]) -> tune.RunConfig:
    """Every fltune Tune job's: all-or-nothing folder (``storage.job_filesystem``), crash restarts, and
    ``StopOnFailedWrite`` first (before the board says a trial restarts)."""
    return tune.RunConfig(
        name=spec.name, storage_path=spec.storage, storage_filesystem=job_filesystem(spec.storage),
        callbacks=[StopOnFailedWrite(), *callbacks], verbose=0,
        failure_config=tune.FailureConfig(max_failures=MAX_FAILURES),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
