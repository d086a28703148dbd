"""The probe registry: objectives and reproduced cells are checked against the metric names probes declare, and a run
gets the probes its config turns on. A new metric is one module here with a ``@register``-ed ``Probe``
(the interface: ``fltune.engine.probes``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from fltune.engine.probes import LOOP_METRICS, Probe, RunView

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData

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
    """Every registered probe, in run order, after importing this package's public modules (private ones
    register none and are imported only where used)."""
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
    """What ``cfg`` lacks for ``metric`` (with ``reduce``) to be measured at all, or None. At-target values need what
    ``rounds_to_target`` needs; everything else is the declaring probe's ``unmet``."""
    if reduce == "at_target" and (need := unmet_need("rounds_to_target", "final", cfg)):
        return need
    probe = probe_of(metric)
    return probe.unmet(metric, cfg) if probe is not None else None


def check_probes(cfg: ExperimentConfig, data: FederatedData | None = None) -> None:
    """Refuse, in one line naming the field, a config that asks a probe for a figure it never measures, and
    with ``data``, data that can't serve an enabled probe; else the figure would end blank or trials fail."""
    for probe in all_probes():
        probe.check(cfg)
        if data is not None and probe.enabled(cfg):
            probe.check_data(cfg, data)


def unmeasured_protocols(cfg: ExperimentConfig) -> list[str]:
    """Each protocol listed in ``metrics.protocols`` that ``cfg`` does not turn on, with what it needs, and
    what an enabled probe leaves out, so none is dropped without a word."""
    idle = [cls for cls in all_probes() if cls.protocol in cfg.metrics.protocols and not cls.enabled(cfg)]
    return [*(f"{cls.protocol}: {cls.unmet(next(iter(cls.metrics)), cfg) or 'not measured'}" for cls in idle),
            *omitted_figures(cfg)]


def omitted_figures(cfg: ExperimentConfig) -> list[str]:
    """What the probes ``cfg`` turns on leave out (a method's undeclared cost), each as ``name/metric: why``."""
    return [line for cls in all_probes() if cls.enabled(cfg) for line in cls.omitted(cfg)]


def probes_for(data: FederatedData, run: RunView) -> list[Probe]:
    """The probes ``run``'s configuration turns on, built for it, in run order (``data``: checked first)."""
    check_probes(run.cfg, data)
    return [cls(run) for cls in all_probes() if cls.enabled(run.cfg)]
