"""The probe registry: which probes exist, what metric names they declare, which a configuration turns on.

Why: a study's objective and a reproduced table's cells are checked against the declared names
(:func:`metric_names`, :func:`unmet_need`), and a run gets the probes its configuration turns on
(:func:`probes_for`), handed to its ``Federation`` by ``fltune.assembly``. The interface a probe implements
(``Probe``, ``RoundView``) is the engine's (``fltune.engine.probes``). Adding a metric is one module in this
package holding a ``@register``-ed ``Probe`` subclass, plus its test.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from fltune.engine.probes import LOOP_METRICS, Probe

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.federation import Federation

PROBES: list[type[Probe]] = []


def register(cls: type[Probe]) -> type[Probe]:
    """Class decorator: add a probe; its metric names must be new."""
    taken = set(metric_names(loaded=False))
    clash = sorted(taken & {*cls.metrics, *cls.constants})
    if clash:
        raise ValueError(f"probe {cls.__name__}: metric {', '.join(clash)} is declared twice")
    PROBES.append(cls)
    PROBES.sort(key=lambda probe: probe.order)
    return cls


def all_probes() -> list[type[Probe]]:
    """Every registered probe, in the order they run after a round: every public module of this package is
    imported, so their ``@register`` decorators run. A private one (``_flops``) registers no probe and is
    imported only where it is used (a worker's FLOP meter)."""
    package = importlib.import_module("fltune.metrics")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"fltune.metrics.{info.name}")
    return list(PROBES)


def metric_names(loaded: bool = True) -> tuple[str, ...]:
    """Every metric a study can optimise or a reproduced cell compare: the loop's and every probe's."""
    probes = all_probes() if loaded else PROBES
    return (*LOOP_METRICS, *(name for probe in probes for name in (*probe.metrics, *probe.constants)))


def probe_of(metric: str) -> type[Probe] | None:
    """The probe declaring ``metric`` (None for the loop's own metrics)."""
    return next((p for p in all_probes() if metric in p.metrics or metric in p.constants), None)


def unmet_need(metric: str, reduce: str, cfg: ExperimentConfig) -> str | None:
    """What ``cfg`` lacks for ``metric`` (with ``reduce``) to be measured at all, or None.

    At-target values need what ``rounds_to_target`` needs; everything else is the declaring probe's ``unmet``.
    """
    if reduce == "at_target" and (need := unmet_need("rounds_to_target", "final", cfg)):
        return need
    probe = probe_of(metric)
    return probe.unmet(metric, cfg) if probe is not None else None


def check_probes(cfg: ExperimentConfig, data: FederatedData | None = None) -> None:
    """Refuse, in one line naming the field, a configuration that asks a probe for a figure it never
    measures (each probe's ``check``), and with ``data`` partitioned data that can't serve a probe the
    configuration turns on (``check_data``): without this a run or study would end with the figure blank,
    or fail in its trials."""
    for probe in all_probes():
        probe.check(cfg)
        if data is not None and probe.enabled(cfg):
            probe.check_data(cfg, data)


def unmeasured_protocols(cfg: ExperimentConfig) -> list[str]:
    """Each protocol ``metrics.protocols`` lists that ``cfg`` does not turn on, with what it needs
    (``personalized: needs partition.eval_fraction > 0 …``): the default lists all three, and a run without
    held-out data would otherwise drop one without a word."""
    idle = [cls for cls in all_probes() if cls.protocol in cfg.metrics.protocols and not cls.enabled(cfg)]
    return [f"{cls.protocol}: {cls.unmet(next(iter(cls.metrics)), cfg) or 'not measured'}" for cls in idle]


def probes_for(fed: Federation) -> list[Probe]:
    """The probes ``fed``'s configuration turns on, built for it, in run order."""
    check_probes(fed.cfg, fed.data)
    return [cls(fed) for cls in all_probes() if cls.enabled(fed.cfg)]
