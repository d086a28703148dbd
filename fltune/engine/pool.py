"""A fixed pool of client workers: ClientWorker actors with Ray's fault tolerance, and optionally one worker's share
trained in the driver's own process. Ray restarts a worker that dies mid-round (``max_restarts``) and retries its call
(``max_task_retries``); a call carries everything a client needs and its randomness is keyed by (seed, round, client
id), so the retried round has the same bits.

The driver's share (``WorkerPlan.in_driver``, an :class:`InProcessPool`): the driver only waits while its actors train,
and every torch process holds its own copy of torch's memory, so a local CPU run trains one shard in the driver instead
of one more actor (issue 12's CPU memory goal). It reads and returns what an actor would (the same bits), FLOP count
included: counting loads no compiler stack (``metrics._flops.TrainingFlops``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.builders import torch_threads
from fltune.engine.worker import ClientWorker, RunSpec
from fltune.errors import FLTuneError

MAX_RESTARTS = 3


@dataclass(frozen=True)
class WorkerPlan:
    """Client workers and what each reserves (the Tune trial's bundles); ``in_driver``: one is the driver's process."""

    workers: int
    cpus: float
    gpus: float
    in_driver: bool = False

    @property
    def actors(self) -> int:
        return self.workers - self.in_driver

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
        return [dict(bundle) for _ in range(self.actors)]


def plan_workers(cfg: ExperimentConfig, cluster: dict[str, float], own_ray: bool = False) -> WorkerPlan:
    """Resolve ``resources.*`` against the cluster's totals; refuse what can never be placed. ``own_ray``: the caller
    started this Ray for itself on this machine, so the driver's CPU is the cluster's: ``resources.driver_worker``'s
    default then trains one share in the driver on a CPU-only plan of ≥ 2."""
    res = cfg.resources
    cpus_total, gpus_total = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    workers = res.workers or max(1, min(cfg.federation.clients_per_round, int(cpus_total // res.cpus_per_worker)))
    gpus = res.gpus_per_worker
    if gpus is None:
        gpus = min(1.0, gpus_total / workers) if gpus_total else 0.0
    if workers * res.cpus_per_worker > cpus_total + 1e-9:
        raise FLTuneError(
            f"resources.workers: {workers} workers × {res.cpus_per_worker:g} CPU need "
            f"{workers * res.cpus_per_worker:g} CPUs but Ray has {cpus_total:g}; allowed: "
            f"workers × cpus_per_worker ≤ {cpus_total:g}"
        )
    if workers * gpus > gpus_total + 1e-9:
        raise FLTuneError(
            f"resources.gpus_per_worker: {workers} × {gpus:g} GPU need {workers * gpus:g} GPUs but Ray has "
            f"{gpus_total:g}; allowed: " + (f"workers × gpus_per_worker ≤ {gpus_total:g}" if gpus_total else
                                           "0 or unset (this Ray has no GPU: the workers train on CPUs)")
        )
    in_driver = res.driver_worker if res.driver_worker is not None else own_ray and not gpus and workers >= 2
    if in_driver and gpus:
        raise FLTuneError(
            f"resources.driver_worker: true trains on the driver's CPU, but the workers get {gpus:g} GPU each; "
            "allowed: false or null (the default) when the workers have GPUs"
        )
    return WorkerPlan(workers=workers, cpus=res.cpus_per_worker, gpus=gpus, in_driver=in_driver)


class InProcessPool:
    """One client worker in this process (a pool of width 1, alone or the driver's share of a :class:`WorkerPool`) that
    reads and returns what an actor would: arguments come through Ray's object store (read-only zero-copy arrays, its
    own copy of client states); results are deep copies on the driver's heap, neither views of the model its next call
    overwrites nor store objects (a store page once used stays resident for the run; a copy is freed once summed). It
    trains with the plan's thread count, as torch's CPU kernels may round differently per thread count."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        with torch_threads(threads):  # ClientWorker sets its process's thread count
            self.worker = ClientWorker(threads, in_driver=True)

    def width(self) -> int:
        return 1

    def bind(self, spec: RunSpec) -> tuple[Any, FederatedData]:
        """As :meth:`WorkerPool.bind`."""
        ref = ray.put(spec)
        self.call("ready", [ref])
        return ref, ray.get(ref).data

    def map(self, run: ray.ObjectRef, method: str, shards: list[list[Any]], *args: Any,
            per_shard: Callable[[list[Any]], Any] | None = None) -> list[Any]:
        (shard,) = shards
        return [self.call(method, [run], *args, *_call_tail(shard, per_shard))] if shard else []

    def call(self, method: str, *args: Any) -> Any:
        """``ClientWorker.method(*args)``, each argument read from Ray's object store as an actor would."""
        resolved = [ray.get(arg if isinstance(arg, ray.ObjectRef) else ray.put(arg)) for arg in args]
        with torch_threads(self.threads):
            result = getattr(self.worker, method)(*resolved)
        return copy.deepcopy(result)

    def shutdown(self) -> None:
        """Nothing to stop: the worker is this process."""


class WorkerPool:
    """``plan.workers`` client workers (actors, plus the driver's share when ``plan.in_driver``); ``map`` runs one call
    per non-empty shard. Every call names its run (``bind``), so one pool serves many runs with the same processes."""

    def __init__(self, plan: WorkerPlan) -> None:
        remote = ray.remote(ClientWorker).options(
            num_cpus=plan.cpus, num_gpus=plan.gpus, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
        )
        self.plan = plan
        threads = max(1, int(plan.cpus))
        self.actors = [remote.remote(threads) for _ in range(plan.actors)]
        self.driver = InProcessPool(threads) if plan.in_driver else None
        self.in_flight: set[ray.ObjectRef] = set()
        """The actors' calls of the ``map`` calls in progress, from any thread (MLflow's writer counts FLOPs while a
        round trains); a stop leaves them running: ``shutdown`` cancels them."""

    def width(self) -> int:
        """Shards a call is split into: one per worker, the driver's share included."""
        return self.plan.workers

    def bind(self, spec: RunSpec) -> tuple[Any, FederatedData]:
        """The run's config, dataset and parts in the object store once per run; the caller holds the handle for the run's
        life, so restarted actors can fetch it. Actors fetch at once (``ClientWorker.ready``), as the driver starts."""
        ref = ray.put(spec)
        for actor in self.actors:
            actor.ready.remote([ref])
        if self.driver is not None:
            self.driver.call("ready", [ref])
        return ref, ray.get(ref).data

    def map(self, run: ray.ObjectRef, method: str, shards: list[list[Any]], *args: Any,
            per_shard: Callable[[list[Any]], Any] | None = None) -> list[Any]:
        """Worker 0 is the driver's share, if any, trained after the actors' calls are sent. Arguments go to the object
        store once; the run's reference is nested (``[run]``) so Ray does not copy the dataset per call."""
        assert len(shards) == self.width(), (len(shards), self.width())
        shared = [ray.put(arg) for arg in args]
        driver_shard, actor_shards = (shards[0], shards[1:]) if self.driver is not None else ([], shards)
        refs = [getattr(actor, method).remote([run], *shared, *_call_tail(shard, per_shard))
                for actor, shard in zip(self.actors, actor_shards) if shard]
        self.in_flight.update(refs)
        own = self.driver.map(run, method, [driver_shard], *shared, per_shard=per_shard) if self.driver else []
        results = own + ray.get(refs)
        self.in_flight.difference_update(refs)
        return results

    def shutdown(self) -> None:
        """Cancel the calls in flight, then kill the actors: a call cut by ``ray.kill`` would count as a failure
        to retry (``max_task_retries``), and Ray would print it and try to recover its results after the stop."""
        for ref in list(self.in_flight):
            ray.cancel(ref)
        self.in_flight.clear()
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def _call_tail(shard: list[Any], per_shard: Callable[[list[Any]], Any] | None) -> tuple[Any, ...]:
    """A worker call's last arguments: its shard, and what ``per_shard`` gives it."""
    return (shard, *((per_shard(shard),) if per_shard else ()))
