"""Checks of a job's data before it starts Ray: the commands that run Tune jobs (``jobs.scaffold.TuneJob``,
``compare``) and ``--plan`` (``estimate``) call them, so that bad data is one line, not failed trials."""

from __future__ import annotations

from collections.abc import Iterable

from fltune.config import ExperimentConfig
from fltune.data.datasets import load_dataset, release_loaded
from fltune.engine.builders import load_data
from fltune.metrics.probe import check_probes


def check_data(configs: Iterable[ExperimentConfig]) -> None:
    """Before a job starts Ray: every dataset its trials load is here and every distinct setting partitions
    into data that serves its run (``check_probes``), so a bad one is one line, not every trial failing.
    ``data.download`` fetches now, once, not by every trial into the same folder. Partitions land in the
    trials' disk cache; nothing stays loaded in the driver."""
    configs = list(configs)
    try:
        for name, root, download in dict.fromkeys((c.data.dataset, c.data.root, c.data.download) for c in configs):
            load_dataset(name, root, download)
        for cfg in {split_setting(c): c for c in configs}.values():
            check_probes(cfg, load_data(cfg))
    finally:
        release_loaded()


def split_setting(cfg: ExperimentConfig) -> str:
    """What a run's partitioned data and its probes' needs depend on: runs that agree are checked once."""
    return cfg.model_dump_json(include={"data", "partition", "federation", "metrics"})

