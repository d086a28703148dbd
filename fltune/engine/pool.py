"""A fixed pool of ClientWorker actors, using Ray's own fault tolerance.

A worker process that dies mid-round is restarted by Ray (``max_restarts``) and its in-flight call is
retried (``max_task_retries``); since a call carries everything a client needs and every client's
randomness is keyed by (seed, round, client id), the retried round gives the same bits as an unbroken one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.batched import client_groups
from fltune.engine.worker import ClientWorker, RunSpec
from fltune.errors import FLTuneError

MAX_RESTARTS = 3


@dataclass(frozen=True)
class WorkerPlan:
    """How many client actors and what each reserves (the Tune trial reserves the same bundles)."""

    workers: int
    cpus: float
    gpus: float

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
        return [dict(bundle) for _ in range(self.workers)]


def plan_workers(cfg: ExperimentConfig, cluster: dict[str, float]) -> WorkerPlan:
    """Resolve ``resources.*`` against the cluster's totals; refuse what can never be placed."""
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
            f"{gpus_total:g}; allowed: workers × gpus_per_worker ≤ {gpus_total:g}"
        )
    return WorkerPlan(workers=workers, cpus=res.cpus_per_worker, gpus=gpus)


class WorkerPool:
    """``plan.workers`` ClientWorker actors; ``map`` runs one call per non-empty shard and gathers results.

    The actors are bound to no run: every call names its run (``bind``), so one pool can serve many runs
    (a test's many methods, a caller's sweep) without paying for new worker processes each time.
    """

    def __init__(self, plan: WorkerPlan) -> None:
        remote = ray.remote(ClientWorker).options(
            num_cpus=plan.cpus, num_gpus=plan.gpus, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
        )
        self.plan = plan
        self.actors = [remote.remote(max(1, int(plan.cpus))) for _ in range(plan.workers)]

    def bind(self, cfg: ExperimentConfig, data: FederatedData, keep_latest: bool) -> ray.ObjectRef:
        """A run's handle for ``map``: its config and dataset in the object store, once per run. The caller
        holds it for the run's life, so restarted actors can fetch them again. Every actor starts fetching
        it at once (``ClientWorker.ready``, not waited for): the first round then finds them warm, and
        their start-up overlaps the driver's (tracking, the header)."""
        ref = ray.put(RunSpec(cfg, data, keep_latest))
        for actor in self.actors:
            actor.ready.remote([ref])
        return ref

    def map(self, run: ray.ObjectRef, method: str, shards: list[list[int]], *args: Any,
            per_shard: Any = None) -> list[Any]:
        """Call ``actor.method(run, *args, shard, per_shard(shard))`` on actor i for shard i, in shard order.

        The run's reference goes nested (``[run]``) so Ray does not copy the dataset into every call; runs
        that share the pool interleave freely, each call naming its own.
        """
        refs = []
        for actor, shard in zip(self.actors, shards):
            if shard:
                extra = (per_shard(shard),) if per_shard else ()
                refs.append(getattr(actor, method).remote([run], *args, shard, *extra))
        return ray.get(refs)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def balance(clients: list[int], sizes: list[int], workers: int, group: int = 1) -> list[list[int]]:
    """Longest-processing-time-first assignment of clients to workers (deterministic, size-balanced), in
    units of the batched executor's client groups (``batched.client_groups``; ``group = 1``: single clients)."""
    shards: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    units = client_groups(clients, group)
    for unit in sorted(units, key=lambda u: (-sum(sizes[c] for c in u), u[0])):
        slot = min(range(workers), key=lambda i: (loads[i], i))
        shards[slot].extend(unit)
        loads[slot] += sum(sizes[c] for c in unit)
    return [sorted(s) for s in shards]
