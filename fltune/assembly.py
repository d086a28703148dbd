"""A run's parts put together: a ``Federation`` of a config's data, model and method, on client workers, with
the probes its config turns on. The one place that knows all parts: the engine knows no probe nor Ray."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import ray

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.builders import load_data
from fltune.engine.cluster import ensure_ray
from fltune.engine.dispatch import Pool
from fltune.engine.federation import Federation
from fltune.engine.pool import WorkerPool, plan_workers
from fltune.metrics.probe import probes_for


def build_federation(cfg: ExperimentConfig, data: FederatedData | None = None, pool: Pool | None = None,
                     folder: Path | None = None) -> Federation:
    """The run ``cfg`` describes, on ``data`` (default: loaded as ``cfg`` says), with its probes
    (``check_probes``). ``pool``: the caller's workers, left up after; without one the run starts and stops
    its own (``resources.*``). ``folder``: where client states go (default a temporary folder)."""
    return Federation(cfg, data if data is not None else load_data(cfg), pool or partial(ray_pool, cfg),
                      probes=probes_for, folder=folder)


def ray_pool(cfg: ExperimentConfig) -> WorkerPool:
    ensure_ray(cfg.resources.address)
    return WorkerPool(plan_workers(cfg, ray.cluster_resources()))
