"""Executors: how a worker runs the one local loop over its share of a round's clients. Why a protocol: assembly picks
one per run (``resources.executor``) and hands it to the ``Federation``, which ships it to the workers with the run; the
loop, the pool and the workers call it and name none, so a new executor plugs in where the run is assembled."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from fltune.config import TrainingConfig
from fltune.data.federated import FederatedData
from fltune.engine.batched import client_groups, train_group, unbatchable
from fltune.engine.local import Trainer, final_model, final_round, final_training, train_client
from fltune.engine.probes import ClientMeter
from fltune.engine.transfer import RoundInput
from fltune.methods.base import ClientResult, Method

if TYPE_CHECKING:
    from fltune.engine.worker import ClientWorker

States = dict[int, dict[str, Any]]
"""Client id → its stored state (``ClientStore``'s rows for a shard)."""
Meters = Sequence[Callable[[], ClientMeter]]
Trained = Iterator[tuple[int, ClientResult]]
"""Clients trained together, each yielded with its result while the worker's model holds its local model."""


class Executor(Protocol):
    """How workers train clients: one after another, or several at once."""

    group: int
    """Clients trained together: a round's sorted ids go to the workers in whole groups of this many."""

    def trainer(self, method: Method, model: nn.Module, data: FederatedData, training: TrainingConfig,
                device: torch.device, augment: str) -> Trainer:
        """A worker's parts for the one local loop of a run (once per run and worker: ``ClientWorker._attach``)."""

    def train(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor], meters: Meters) -> Iterator[Trained]:
        """A shard's clients, unit by unit (a client, or a group), with ``worker``'s parts (the worker stops after a
        unit in which one diverged). ``meters``: probes' meters of each client's training (``Probe.client_meter``)."""

    def final(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor]) -> Iterator[int]:
        """Each client after its final personal round, the worker's model holding the model scored."""


@dataclass(frozen=True)
class OneByOne:
    """Clients one after another through ``local.train_client``: ``exact`` (data on the device, metrics read once per
    client), or with ``reference`` the plain per-batch host loop; both give the same bits."""

    reference: bool = False
    group: int = 1

    def trainer(self, method: Method, model: nn.Module, data: FederatedData, training: TrainingConfig,
                device: torch.device, augment: str) -> Trainer:
        return Trainer.of(method, model, data, training, device, augment, exact=not self.reference)

    def train(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor], meters: Meters) -> Iterator[Trained]:
        """Each client inside a fresh meter of each builder; their figures join its metrics."""
        for cid in clients:
            opened = [build() for build in meters]
            with ExitStack() as stack:
                for meter in opened:
                    stack.enter_context(meter)
                out = train_client(worker.trainer, cid, inputs, states.get(cid, {}), global_tensors)
            for meter in opened:
                out.metrics.update(meter.client_metrics())
            yield iter([(cid, out)])

    def final(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor]) -> Iterator[int]:
        for cid in clients:
            final_round(worker.trainer, cid, inputs, states.get(cid, {}), global_tensors)
            yield cid


@dataclass(frozen=True)
class Batched(OneByOne):
    """``group`` clients at a time in one vmapped step (``batched.train_group``); a run whose method or model has no
    batched form, or a round that probes meter client by client, trains on the exact path."""

    compiled: bool = False

    def train(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor], meters: Meters) -> Iterator[Trained]:
        if meters or not self._batches(worker, worker.trainer):
            yield from super().train(worker, clients, inputs, states, global_tensors, meters)
            return
        for group in client_groups(clients, self.group):
            yield train_group(worker.trainer, group, inputs, states, global_tensors, self.compiled)

    def final(self, worker: ClientWorker, clients: list[int], inputs: RoundInput, states: States,
              global_tensors: dict[str, torch.Tensor]) -> Iterator[int]:
        """In groups (eager) where the run's method and its final round's both batch, else client by client."""
        final = final_training(worker.trainer)
        if not (self._batches(worker, worker.trainer) and self._batches(worker, final)):
            yield from super().final(worker, clients, inputs, states, global_tensors)
            return
        for group in client_groups(clients, self.group):
            for cid, result in train_group(final, group, inputs, states, global_tensors):
                final_model(worker.trainer, inputs, result, global_tensors)
                yield cid

    @staticmethod
    def _batches(worker: ClientWorker, trainer: Trainer) -> bool:
        return unbatchable(worker.spec.cfg, trainer.method, trainer.model) is None
