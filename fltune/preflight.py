"""Checks of a job's data before it starts Ray: the commands that run Tune jobs (``tune.job.TuneJob``,
``compare``) and ``--plan`` (``estimate``) call them, so that bad data is one line, not failed trials."""

from __future__ import annotations

from collections.abc import Iterable

from fltune.config import ExperimentConfig
from fltune.data.datasets import load_dataset, release_loaded
from fltune.engine.builders import load_data
from fltune.metrics.probe import check_probes


def check_data(configs: Iterable[ExperimentConfig]) -> None:
    """Before a job starts Ray: every dataset its trials load is here, and every distinct setting of them
    partitions into data that serves its run. Each trial would otherwise fail on a missing dataset, a client
    left without training samples or a split too small for its probes (``check_probes``), after Ray and the
    job had started, and the job end with nothing run; here it is one line (``data.dataset: … not found
    in …; pass --set data.root=…``, ``partition.eval_fraction: …``). With ``data.download`` the files are
    fetched now, once, rather than by every trial at once into the same folder. The partitions land in the
    trials' disk cache; nothing stays loaded in the driver (its data are the trials')."""
    configs = list(configs)
    try:
        for name, root, download in dict.fromkeys((c.data.dataset, c.data.root, c.data.download) for c in configs):
            load_dataset(name, root, download)
        for cfg in {split_setting(c): c for c in configs}.values():
            check_probes(cfg, load_data(cfg))
    finally:
        release_loaded()


def split_setting(cfg: ExperimentConfig) -> str:
    """What a run's partitioned data, and what its probes need of them, depend on: runs that agree here
    (methods, learning rates) are checked once."""
    return cfg.model_dump_json(include={"data", "partition", "federation", "metrics"})

