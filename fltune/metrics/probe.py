"""Round probes: what a federation measures after each round, and when.

Why: every figure beyond the round's training loss — an evaluation protocol's accuracy, the Hessian, the
cost, the global update's norm — is a probe. A probe declares the metric names it reports (a study's
objective and a reproduced table's cells are checked against them, :func:`metric_names`,
:func:`unmet_need`), whether the configuration turns it on, and on which rounds it measures. The
``Federation`` runs the probes its configuration turns on after every round, in ``order``, and knows none
of them by name. Adding a metric is one module in this package holding a ``@register``-ed
:class:`Probe` subclass, plus its test.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.federation import Federation
    from fltune.engine.local import RoundInput
    from fltune.methods.base import State

LOOP_METRICS: Mapping[str, str] = {
    "train_loss": "sample-weighted mean training loss of the round's clients (the round loop's own figure)",
}
"""Metrics the round loop reports itself, without a probe."""


@dataclass(frozen=True)
class RoundView:
    """One finished round as probes see it, beside the federation's own state (``Federation``)."""

    round: int
    clients: tuple[int, ...]
    """The clients sampled this round."""
    running: bool
    """False once this round diverged: the global model was not updated, evaluations are skipped."""
    inputs: RoundInput
    """What the round broadcast: learning rate, global model, the method's server payload."""
    previous_state: State
    """The global model the round started from (``Federation.global_state`` is the one it ended with)."""
    local_models: Mapping[int, State]
    """The round's clients' trained models (only when a probe ``keeps_local_models``)."""
    client_metrics: Mapping[int, Mapping[str, float]]
    upload_bits: int
    """Bits one client uploads."""
    metrics: Mapping[str, float]
    """This round's metrics so far: the loop's and those of the probes that ran before."""


T_co = TypeVar("T_co", covariant=True)


class ProbeTask(Protocol[T_co]):
    """A piece of a probe's computation that runs on a client worker (``Federation.compute``): picklable,
    and given the run's config, its data and the worker's device there (the GPU a Tune trial's own
    process lacks)."""

    def __call__(self, cfg: ExperimentConfig, data: FederatedData, device: torch.device) -> T_co: ...


class ClientMeter(Protocol):
    """A context manager the workers open around one client's local training (see ``Probe.client_meter``)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def client_metrics(self) -> dict[str, float]:
        """What it measured; joins the client's metrics (``RoundView.client_metrics``)."""
        ...


class Probe(ABC):
    """A figure measured after rounds. Subclasses set the class attributes and override ``measure``.

    ``clock`` names the timing metric (seconds) the probe's time is added to; ``constants`` declares run
    constants, reported once (``run_constants``) rather than per round. ``name`` keys the probe's
    ``state_dict`` in a federation's checkpoint when it keeps state across rounds.
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 50
    metrics: ClassVar[Mapping[str, str]] = {}
    constants: ClassVar[Mapping[str, str]] = {}
    protocol: ClassVar[str | None] = None
    """The evaluation protocol (``metrics.protocols``) the metrics are measured under, if any."""
    clock: ClassVar[str | None] = None
    keeps_local_models: bool = False
    """Whether the workers must return the round's local models (``RoundView.local_models``)."""

    def __init__(self, fed: Federation) -> None:
        """Built once per federation, after its data and evaluation model."""

    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        """Whether ``cfg`` turns this probe on (what its data can't give it, ``check_data`` refuses)."""
        return True

    @classmethod
    def check(cls, cfg: ExperimentConfig) -> None:
        """Raise ``FLTuneError`` when ``cfg`` asks this probe for something it can't measure (default: never)."""

    @classmethod
    def check_data(cls, cfg: ExperimentConfig, data: FederatedData) -> None:
        """Raise ``FLTuneError`` when the data ``cfg`` partitioned can't serve this probe, which ``cfg`` turns
        on (default: never). Jobs of Tune trials run it before Ray starts, on each distinct setting."""

    @classmethod
    def client_meter(cls, round_: int) -> Callable[[], ClientMeter] | None:
        """What builds a meter the workers open around each client's training in round ``round_``, for what
        only the training itself can show (the FLOPs its passes spend); None (the default): nothing to
        measure there. A builder, not a meter: each client gets a fresh one, and what a meter needs is imported
        only by a worker that meters."""
        return None

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        """What ``cfg`` lacks for ``metric`` (one of this probe's) to be measured, as ``needs …``; else None."""
        return None

    def start_round(self) -> None:
        """Called as each round starts."""

    def due(self, fed: Federation, view: RoundView) -> bool:
        """Whether to measure after this round (default: every round that did not diverge)."""
        return view.running

    @abstractmethod
    def measure(self, fed: Federation, view: RoundView) -> dict[str, float]:
        """This round's figures (names among ``metrics``)."""

    def run_constants(self, fed: Federation) -> dict[str, float]:
        """The values of ``constants``."""
        return {}

    def state_dict(self) -> Any:
        """State carried across rounds (checkpointed with the federation); None: none."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore what ``state_dict`` returned."""


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


def _load_all() -> None:
    """Import every public module of this package once, so their ``@register`` decorators run. A private
    one (``_flops``) registers no probe and is imported only where it is used (a worker's FLOP meter)."""
    package = importlib.import_module("fltune.metrics")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"fltune.metrics.{info.name}")


def all_probes() -> list[type[Probe]]:
    """Every registered probe, in the order they run after a round."""
    _load_all()
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


def client_meters(cfg: ExperimentConfig, round_: int) -> list[Callable[[], ClientMeter]]:
    """The builders of the meters the probes ``cfg`` turns on want around one client's training in round
    ``round_`` (empty: the round is not metered)."""
    builders = (cls.client_meter(round_) for cls in all_probes() if cls.enabled(cfg))
    return [build for build in builders if build is not None]


def probes_for(fed: Federation) -> list[Probe]:
    """The probes ``fed``'s configuration turns on, built for it, in run order."""
    check_probes(fed.cfg, fed.data)
    return [cls(fed) for cls in all_probes() if cls.enabled(fed.cfg)]
