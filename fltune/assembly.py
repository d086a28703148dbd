"""A run's parts put together: a ``Federation`` of a config's data, model and method, on a pool of client
workers, measured by the probes of the metrics package its config turns on.

Why a layer of its own: the engine's loop knows no probe and imports no Ray, and the commands (``run``, a
Tune trial) should not wire the parts themselves; this is the one place that knows all of them.
"""

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
    """The run ``cfg`` describes, on ``data`` (default: loaded and split as ``cfg`` says), with the probes
    ``cfg`` turns on (refused in one line when the data can't serve one, ``check_probes``). ``pool``: the
    caller's workers, left up after the run; without one the run starts Ray actors of its own as it opens
    (``resources.*``, on the Ray at ``resources.address``, started when none runs) and stops them as it closes.
    ``folder``: where the client states go (``Federation``; default a temporary folder)."""
    return Federation(cfg, data if data is not None else load_data(cfg), pool or partial(ray_pool, cfg),
                      probes=probes_for, folder=folder)


def ray_pool(cfg: ExperimentConfig) -> WorkerPool:
    ensure_ray(cfg.resources.address)
    return WorkerPool(plan_workers(cfg, ray.cluster_resources()))
