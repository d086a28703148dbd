"""The local training loop every method runs, with its optimisers and step metrics: pure functions of (model, data,
weights, state, seeds); a client's shuffling, augmentation and dropout are seeded from (seed, round, client id) only."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from typing import Any

import torch
from torch import nn

from fltune.config import TrainingConfig
from fltune.data.federated import FederatedData
from fltune.engine.batches import DeviceBatches, HostBatches, epoch_samples
from fltune.engine.functional import client_backward
from fltune.engine.rng import derive_seed
from fltune.engine.transfer import RoundInput, device_states, state_on_device
from fltune.methods.base import ClientContext, ClientResult, Method, Phase, client_model
from fltune.methods.finetune import tuner_for
from fltune.methods.objective import clipped, sgd_step


class HostMeter:
    """Reference step metrics, read every step (two host syncs): a non-finite loss stops the client before its step."""

    deferred = False

    def __init__(self, device: torch.device) -> None:
        self.loss_sum, self.correct, self.seen, self.diverged = 0.0, 0, 0, False

    def finite(self, loss: torch.Tensor) -> bool:
        self.diverged = not math.isfinite(loss.item())
        return not self.diverged

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        self.loss_sum += loss.item() * len(y)
        self.correct += int((logits.argmax(1) == y).sum())
        self.seen += len(y)

    def totals(self) -> tuple[float, int, int, bool]:
        """(summed loss, correct, seen, diverged) of the steps taken."""
        return self.loss_sum, self.correct, self.seen, self.diverged


class DeviceMeter(HostMeter):
    """Fast-path step metrics, accumulated on the device and read once per client; the float64 loss sum has
    ``HostMeter``'s bits. A non-finite loss cannot stop the step here: it leaves the sum non-finite (float32 losses ×
    batch sizes cannot overflow float64), and the caller re-runs the client on the reference path (``deferred``)."""

    deferred = True

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
        self.loss_total, self.correct_total = self.sums.unbind()

    def finite(self, loss: torch.Tensor) -> bool:
        return True

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        self.loss_total.add_(loss.detach().double() * len(y))
        self.correct_total.add_((logits.argmax(1) == y).sum())
        self.seen += len(y)

    def totals(self) -> tuple[float, int, int, bool]:
        loss_sum, correct = self.sums.tolist()  # the client's one host sync
        return loss_sum, int(correct), self.seen, not math.isfinite(loss_sum)


def make_optimizer(params: list[nn.Parameter], training: TrainingConfig, lr: float) -> torch.optim.Adam | KeptSGD:
    """A fresh optimiser per client and phase (no momentum carried across clients, as in the papers' code)."""
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=training.weight_decay)
    return KeptSGD(params, training, lr)


class KeptSGD:
    """``torch.optim.SGD``'s step without an ``Optimizer``: ``objective.sgd_step``, SGD's bits. Why: any
    ``torch.optim.Optimizer`` imports ``torch._dynamo``, memory wasted in a process that never compiles. Keeps an
    Optimizer's ``state`` (momentum buffers) and ``param_groups``."""

    def __init__(self, params: list[nn.Parameter], training: TrainingConfig, lr: float) -> None:
        self.params, self.training = params, training
        self.param_groups = [{"lr": lr}]
        self.state: dict[int, torch.Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """As ``SGD.step``: only params with a gradient move; buffers kept only with momentum."""
        live = {i: p for i, p in enumerate(self.params) if p.grad is not None}
        t = self.training
        stepped, buffers = sgd_step(live, {i: p.grad for i, p in live.items()}, self.param_groups[0]["lr"],
                                    self.state, t.momentum, t.nesterov, t.weight_decay)
        for i, param in live.items():
            param.copy_(stepped[i])
        self.state.update(buffers)


@dataclass(frozen=True)
class Trainer:
    """What a worker trains a run's clients with, built once per run and worker (``Executor.trainer``): the method,
    the model that holds each client's weights in turn, the data and settings, and how the loop runs (batch source,
    step metrics)."""

    method: Method
    model: nn.Module
    data: FederatedData
    training: TrainingConfig
    device: torch.device
    augment: str
    source: HostBatches | DeviceBatches
    meter: type[HostMeter]

    @classmethod
    def of(cls, method: Method, model: nn.Module, data: FederatedData, training: TrainingConfig,
           device: torch.device, augment: str = "none", exact: bool = False) -> Trainer:
        """``exact``: the run's data moves to ``device`` here and step metrics are read once per client; else the
        plain per-batch host loop. Both give the same bits (tests/engine/test_executor_exact.py)."""
        if exact:
            return cls(method, model, data, training, device, augment, DeviceBatches(data, device), DeviceMeter)
        return cls(method, model, data, training, device, augment, HostBatches(data, device), HostMeter)


def _trainable(model: nn.Module, phase: Phase) -> list[nn.Parameter]:
    """Select a phase's parameters; freeze the rest so no gradient is computed for them."""
    chosen = []
    for name, param in model.named_parameters():
        param.requires_grad_(phase.prefixes is None or name.startswith(phase.prefixes))
        if param.requires_grad:
            chosen.append(param)
    return chosen


def client_contexts(
    trainer: Trainer, client_ids: list[int], inputs: RoundInput, states: dict[int, dict[str, Any]],
    global_tensors: dict[str, torch.Tensor],
) -> Iterator[tuple[ClientContext, torch.Generator]]:
    """Each client's context after ``setup_client``, ``trainer.model`` holding its start, with the generator its
    batches draw from (seeded by (seed, round, client id)). Both executors' clients start here; the clients' starts
    go to the device in one copy."""
    method, model, data, training, device = trainer.method, trainer.model, trainer.data, trainer.training, trainer.device
    starts = [client_model(inputs.global_state, states.get(cid, {})) for cid in client_ids]
    for cid, start in zip(client_ids, device_states(starts, device, inputs.global_state, global_tensors)):
        generator = torch.Generator().manual_seed(derive_seed(inputs.seed, inputs.round, cid))
        model.load_state_dict(start)
        kept = epoch_samples(len(data.client_train[cid]), training)
        batches = partial(trainer.source.epoch, data.client_train[cid], training.batch_size, generator,
                          trainer.augment, kept)
        ctx = ClientContext(
            client_id=cid, model=model, global_state=global_tensors,
            state=dict(states.get(cid, {})), server_tensors=inputs.server_on(device),
            num_samples=kept, epochs=training.local_epochs, lr=inputs.lr, device=device, batches=batches,
            momentum=training.momentum if training.optimizer == "sgd" else 0.0, nesterov=training.nesterov,
            batch_size=training.batch_size, initial_lr=training.lr, grad_clip=training.grad_clip,
        )
        method.setup_client(ctx)
        yield ctx, generator


def train_client(
    trainer: Trainer, client_id: int, inputs: RoundInput, client_state: dict[str, Any],
    global_tensors: dict[str, torch.Tensor] | None = None,
) -> ClientResult:
    """One client's local update: the engine's loop around the method's hooks (methods/base.py). A client whose loss
    turned non-finite on a ``deferred`` path is re-run on the reference path (its seed replays it), so every result,
    diverged or not, is the reference's. ``global_tensors``: ``state_on_device`` of ``inputs.global_state``, shared
    by a worker's clients."""
    if global_tensors is None:
        global_tensors = state_on_device(inputs.global_state, trainer.device)
    torch.manual_seed(derive_seed(inputs.seed, inputs.round, client_id))
    (ctx, _), = client_contexts(trainer, [client_id], inputs, {client_id: client_state}, global_tensors)
    trainer.model.train()
    meter = trainer.meter(trainer.device)
    _local_steps(trainer.method, ctx, trainer.training, inputs.lr, meter)
    for param in trainer.model.parameters():
        param.requires_grad_(True)
    loss_sum, correct, seen, diverged = meter.totals()
    if diverged and meter.deferred:
        reference = replace(trainer, source=HostBatches(trainer.data, trainer.device), meter=HostMeter)
        return train_client(reference, client_id, inputs, client_state, global_tensors)
    result = trainer.method.client_result(ctx)
    result.metrics.update(train_metrics(loss_sum, correct, seen, ctx.steps, diverged))
    return result


def train_metrics(loss_sum: float, correct: float, seen: int, steps: int, diverged: bool) -> dict[str, float]:
    """A client's metrics from the steps it took: mean loss (NaN once diverged) and accuracy."""
    return {"train_loss": loss_sum / max(seen, 1) if not diverged else math.nan,
            "train_acc": correct / max(seen, 1), "samples": float(seen), "steps": float(steps),
            "diverged": float(diverged)}


def final_training(trainer: Trainer) -> Trainer:
    """``trainer`` for a client's final personal round (``training.finetune_epochs`` epochs): its method's personal
    part tuned on CE (``final_round = "tune"``, ``finetune.tuner_for``), or one more of its own local updates
    (``"own"``: Ditto's personal model, as FedCR's last round updates it)."""
    method, training = trainer.method, trainer.training
    if method.final_round == "tune":
        whole = training.finetune_params == "all"
        return replace(trainer, method=tuner_for(method, training.finetune_epochs, training.finetune_lr, whole))
    return replace(trainer, training=training.model_copy(update={"local_epochs": training.finetune_epochs}))


def final_model(
    trainer: Trainer, inputs: RoundInput, result: ClientResult, global_tensors: dict[str, torch.Tensor],
) -> None:
    """Leave in the model the one scored: the final round's weights (``tune``) or the new client model (``own``)."""
    if trainer.method.final_round == "own":
        end = client_model(inputs.global_state, result.state)
        trainer.model.load_state_dict(device_states([end], trainer.device, inputs.global_state, global_tensors)[0])


def final_round(
    trainer: Trainer, client_id: int, inputs: RoundInput, client_state: dict[str, Any],
    global_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """One client's final personal round, leaving in the model the model scored (:func:`final_model`)."""
    if global_tensors is None:
        global_tensors = state_on_device(inputs.global_state, trainer.device)
    result = train_client(final_training(trainer), client_id, inputs, client_state, global_tensors)
    final_model(trainer, inputs, result, global_tensors)


def _local_steps(method: Method, ctx: ClientContext, training: TrainingConfig, lr: float, meter: HostMeter) -> None:
    """Every phase's steps (capped at ``Phase.steps``); stops at the first one ``meter`` finds non-finite."""
    backward = client_backward(method)
    for phase in method.phases(ctx):
        params = _trainable(ctx.model, phase)
        phase_lr = phase.lr if phase.lr is not None else lr
        optimizer = make_optimizer(params, training, phase_lr)
        # the phase's epochs, capped at ``phase.steps``: an epoch past the cap is never begun (draws nothing)
        for x, y in islice((batch for _ in range(phase.epochs) for batch in ctx.batches()), phase.steps):
            optimizer.zero_grad(set_to_none=True)
            loss, logits = backward(ctx, x, y)
            if not meter.finite(loss):
                return
            add_correction(method, ctx)
            if training.grad_clip is not None:
                clip_grads(params, training.grad_clip)
            for group in optimizer.param_groups:  # ``ctx.step_lr``: set by ``backward`` for this step alone
                group["lr"] = phase_lr if ctx.step_lr is None else ctx.step_lr
            optimizer.step()
            ctx.step_lr = None
            ctx.steps += 1
            meter.add(loss, logits, y)


@torch.no_grad()
def add_correction(method: Method, ctx: ClientContext) -> None:
    """Add the method's ``gradient_correction`` to each parameter's ``.grad`` (one with a gradient)."""
    params = ctx.forward.own
    correction = method.gradient_correction(params, ctx.inputs)
    for name in correction:
        if params[name].grad is not None:
            params[name].grad.add_(correction[name])


@torch.no_grad()
def clip_grads(params: list[nn.Parameter], max_norm: float) -> None:
    """``clip_grad_norm_`` on the parameters' ``.grad`` by the one clip, ``objective.clipped``."""
    live = [p for p in params if p.grad is not None]
    for param, grad in zip(live, clipped({i: p.grad for i, p in enumerate(live)}, max_norm).values()):
        param.grad = grad

