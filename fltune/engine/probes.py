"""The probe interface: what a federation measures after its rounds, seen from the round loop. Why here: every
figure beyond the training loss is a :class:`Probe`, which the loop runs knowing none by name: it gives each a
read-only :class:`RoundView` (and :class:`RunView`), never the federation, runs its :class:`ProbeTask` s on the
workers and asks for its summary entries; probes live in the metrics package, never imported by the engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.transfer import RoundInput
    from fltune.methods.base import Method, State

LOOP_METRICS: Mapping[str, str] = {
    "train_loss": "sample-weighted mean training loss of the round's clients (the round loop's own figure)",
}
"""Metrics the round loop reports itself, without a probe."""


@dataclass(frozen=True)
class RunView:
    """A run as its probes read it: its settings and parts (``model``: the driver's evaluation model), what it has
    kept so far (the federation's own, live: ``history`` of the rounds before the one measured, each client's
    training ``sizes`` and ``latest`` local model while a probe ``keeps_local_models``), the files the probes wrote
    (``artifacts``, the one thing a probe adds to: end-of-run figures for the tracking callbacks), and the
    federation's services that evaluate on the workers (``evaluate_state``, ``evaluate_personalized``,
    ``compute``)."""

    cfg: ExperimentConfig
    method: Method
    model: nn.Module
    initial_state: State
    sizes: Sequence[int]
    history: Sequence[Mapping[str, float]]
    latest: Mapping[int, State]
    artifacts: list[Path]
    evaluate: Callable[[State, str], tuple[float, float]]
    evaluate_clients: Callable[[bool, str], tuple[list[float], list[float]]]
    compute: Callable[[Sequence[ProbeTask[Any]]], list[Any]]


@dataclass(frozen=True)
class RoundView:
    """One finished round as probes see it, with its run."""

    run: RunView

    round: int
    clients: tuple[int, ...]
    """The clients sampled this round."""
    running: bool
    """False once this round diverged: the global model was not updated, evaluations are skipped."""
    inputs: RoundInput
    """What the round broadcast: learning rate, global model, the method's server payload."""
    global_state: State
    """The global model the round ended with (it started from ``inputs.global_state``)."""
    local_models: Mapping[int, State]
    """The round's clients' trained models (only when a probe ``keeps_local_models``)."""
    client_metrics: Mapping[int, Mapping[str, float]]
    upload_bits: int
    """Bits one client uploads."""
    metrics: Mapping[str, float]
    """This round's metrics so far: the loop's and those of the probes that ran before."""


T_co = TypeVar("T_co", covariant=True)


class ProbeTask(Protocol[T_co]):
    """A picklable piece of a probe's computation run on a client worker (``Federation.compute``), with its
    device (the GPU a Tune trial's own process lacks)."""

    def __call__(self, cfg: ExperimentConfig, data: FederatedData, device: torch.device) -> T_co: ...


class ClientMeter(Protocol):
    """A context manager the workers open around one client's local training (see ``Probe.client_meter``)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def client_metrics(self) -> dict[str, float]:
        """What it measured; joins the client's metrics (``RoundView.client_metrics``)."""
        ...


class Probe(ABC):
    """A figure measured after rounds; subclasses set the class attributes and override ``measure``. ``clock``:
    the timing metric (seconds) the probe's time is added to; ``constants``: run constants, reported once
    (``run_constants``); ``name`` keys the probe's ``state_dict`` in a federation's checkpoint."""

    name: ClassVar[str] = ""
    order: ClassVar[int] = 50
    metrics: ClassVar[Mapping[str, str]] = {}
    constants: ClassVar[Mapping[str, str]] = {}
    protocol: ClassVar[str | None] = None
    """The evaluation protocol (``metrics.protocols``) the metrics are measured under, if any."""
    clock: ClassVar[str | None] = None
    in_wall: ClassVar[bool] = True
    """Whether the ``clock``'s seconds count in the run's ``wall_s`` (a diagnostic's may stay out)."""
    keeps_local_models: bool = False
    """Whether the workers must return the round's local models (``RoundView.local_models``)."""

    def __init__(self, run: RunView) -> None:
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
        """Raise ``FLTuneError`` when the partitioned data can't serve this enabled probe (default: never); Tune
        jobs run it before Ray starts, on each distinct setting."""

    @classmethod
    def client_meter(cls, round_: int) -> Callable[[], ClientMeter] | None:
        """A picklable builder of the meter workers open around each client's training in ``round_`` (e.g. its
        FLOPs); None: nothing to measure. A builder, not a meter: each client gets a fresh one, and only a
        worker that meters imports what it needs."""
        return None

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        """What ``cfg`` lacks for ``metric`` (one of this probe's) to be measured, as ``needs …``; else None."""
        return None

    @classmethod
    def omitted(cls, cfg: ExperimentConfig) -> list[str]:
        """The figures this enabled probe leaves out under ``cfg``, each as ``name/metric…: why`` (default none)."""
        return []

    def start_round(self) -> None:
        """Called as each round starts."""

    def due(self, view: RoundView) -> bool:
        """Whether to measure after this round (default: every round that did not diverge)."""
        return view.running

    @abstractmethod
    def measure(self, view: RoundView) -> dict[str, float]:
        """This round's figures (names among ``metrics``)."""

    def run_constants(self, run: RunView) -> dict[str, float]:
        """The values of ``constants``."""
        return {}

    def summary(self, run: RunView) -> dict[str, Any]:
        """This probe's run-summary entries (``--json-out``, MLflow ``final_*``) from ``run.history``."""
        return {}

    def state_dict(self) -> Any:
        """State carried across rounds (checkpointed with the federation); None: none."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore what ``state_dict`` returned."""


def last_value(history: Sequence[Mapping[str, float]], key: str) -> float | None:
    """``key``'s value in the last round that reported it (None: none did), for ``Probe.summary``."""
    return next((row[key] for row in reversed(history) if key in row), None)
