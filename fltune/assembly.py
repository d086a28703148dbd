"""A run's parts put together: a ``Federation`` of a config's data, model, method and executor, on client workers,
with the probes its config turns on. The one place that knows all parts: the engine knows no probe, executor by name,
nor Ray."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import ray

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.batched import unbatchable
from fltune.engine.builders import build_method, build_model_for, load_data
from fltune.engine.cluster import ensure_ray
from fltune.engine.dispatch import Pool
from fltune.engine.executors import Batched, Executor, OneByOne
from fltune.engine.federation import Federation
from fltune.engine.pool import WorkerPool, plan_workers
from fltune.metrics.probe import probes_for

LOG = logging.getLogger(__name__)


def build_federation(cfg: ExperimentConfig, data: FederatedData | None = None, pool: Pool | None = None,
                     folder: Path | None = None) -> Federation:
    """The run ``cfg`` describes, on ``data`` (default: loaded as ``cfg`` says), with its probes
    (``check_probes``). ``pool``: the caller's workers, left up after; without one the run starts and stops
    its own (``resources.*``). ``folder``: where client states go (default a temporary folder)."""
    data = data if data is not None else load_data(cfg)
    return Federation(cfg, data, partial(build_method, cfg), partial(build_model_for, cfg), executor_for(cfg, data),
                      pool or partial(ray_pool, cfg), probes=partial(probes_for, data), folder=folder)


def executor_for(cfg: ExperimentConfig, data: FederatedData) -> Executor:
    """``resources.executor``'s executor; one line when ``batched`` trains this run on the exact path instead."""
    res = cfg.resources
    if res.executor != "batched":
        return OneByOne(reference=res.executor == "reference")
    if reason := unbatchable(cfg, build_method(cfg), build_model_for(cfg, data)):
        LOG.warning("resources.executor: batched trains every client on the exact path: %s", reason)
    return Batched(group=res.batch_clients, compiled=res.compile)


def ray_pool(cfg: ExperimentConfig) -> WorkerPool:
    ensure_ray(cfg.resources.address)
    return WorkerPool(plan_workers(cfg, ray.cluster_resources()))
