"""The one local training loop every method runs, and plain evaluation.

Pure functions of (model, data, weights, state, seeds): they run inside Ray worker actors in a
federation and in-process in tests and benchmarks. Each client's randomness (shuffling, augmentation,
dropout) is seeded from (seed, round, client id) only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.sgd import sgd

from fltune.config import TrainingConfig
from fltune.data.augment import augment, lookup_float, normalise_table, to_float
from fltune.data.federated import FederatedData
from fltune.engine.rng import derive_seed
from fltune.methods.base import ClientContext, ClientResult, Method, Phase
from fltune.methods.finetune import tuner_for
from fltune.methods.wire import State, to_device


Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class RoundInput:
    """What every client of a round starts from (shared by all clients a worker trains)."""

    round: int
    seed: int
    lr: float
    global_state: State
    server: dict[str, Any]
    copies: dict[str, DeviceServer] = field(default_factory=dict, init=False, repr=False, compare=False)
    """``server`` on each device this process trains the round on (:meth:`server_on`)."""

    def server_on(self, device: torch.device) -> DeviceServer:
        """``server``'s arrays as tensors on ``device``, each copied once for every client of the round that
        this process trains (``ClientContext.server_tensors``)."""
        return self.copies.setdefault(str(device), DeviceServer(self.server, device))

    def __getstate__(self) -> dict[str, Any]:
        """Ray ships a round without its device copies: they stay in the process that made them."""
        return {**self.__dict__, "copies": {}}


def load_state(model: nn.Module, state: State) -> None:
    """Copy numpy weights into the model (copying: arrays from Ray's object store are read-only), all of a
    dtype in one copy to the model's device (``to_device``)."""
    model.load_state_dict(state_on_device(state, next(iter(model.state_dict().values())).device))


class DeviceServer(Mapping[str, Any]):
    """A round's server payload read as tensors on one device: an array becomes a tensor, a dict of arrays
    a dict of tensors (one copy per dtype, ``to_device``), each entry copied at its first read and kept.
    Every client a worker trains reads the same payload, and where each copied it (FedCR's class Gaussians,
    SCAFFOLD's c) every copy from pageable memory waited for the GPU. The tensors are shared: read only."""

    def __init__(self, server: dict[str, Any], device: torch.device) -> None:
        self.server, self.device = server, device
        self.copied: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self.copied:
            value = self.server[key]
            arrays = value if isinstance(value, dict) else {key: value}
            tensors = dict(zip(arrays, to_device(list(arrays.values()), self.device)))
            self.copied[key] = tensors if isinstance(value, dict) else tensors[key]
        return self.copied[key]

    def __contains__(self, key: object) -> bool:
        return key in self.server  # no copy

    def __iter__(self) -> Iterator[str]:
        return iter(self.server)

    def __len__(self) -> int:
        return len(self.server)


def state_on_device(state: State, device: torch.device) -> dict[str, torch.Tensor]:
    """``state`` on ``device`` in one copy per dtype (``to_device``). Of the round's global weights: what
    methods read as ``ClientContext.global_state``, and what clients' loads copy the weights they share
    with it from (``device_states``)."""
    return dict(zip(state, to_device(list(state.values()), device)))


def device_states(
    states: Sequence[State], device: torch.device, host_global: State, device_global: dict[str, torch.Tensor],
) -> list[dict[str, torch.Tensor]]:
    """Each of ``states`` as tensors on ``device``, for ``model.load_state_dict``: an entry that is the very
    array of the round's global weights (``host_global``) is its twin already there (``device_global``), and
    every other distinct array goes over in one copy with the rest (``to_device``). Clients start from the
    global weights overridden by their personal parts (``Method.client_model_state``), so a client's
    load copies its personal part alone, and a shard's personal parts go over together."""
    others: dict[int, np.ndarray] = {}
    for state in states:
        others.update((id(v), v) for k, v in state.items() if host_global.get(k) is not v)
    moved = dict(zip(others, to_device(list(others.values()), device)))
    return [
        {k: device_global[k] if host_global.get(k) is v else moved[id(v)] for k, v in state.items()}
        for state in states
    ]


def load_changed(model: nn.Module, state: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> None:
    """Load the entries of ``state`` that are not the very tensors loaded last (``loaded``, which this
    updates), while nothing else writes the model: clients evaluated one after another share the global
    weights, and a load of every key checks them all (strict)."""
    changed = {k: v for k, v in state.items() if loaded.get(k) is not v}
    if changed:
        model.load_state_dict(changed, strict=len(changed) == len(state))
    loaded.update(state)


@lru_cache(maxsize=8)
def device_table(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """:func:`normalise_table` on ``device``, made once per dataset and device (read only): a personalised
    evaluation scores 100 clients in 100 calls, each of which made and copied it over again."""
    return normalise_table(mean, std).to(device)


def batches(
    data: FederatedData, indices: np.ndarray, batch_size: int, generator: torch.Generator, device: torch.device,
    *, shuffle: bool = True, augment_kind: str = "none", keep: int | None = None,
) -> Iterator[Batch]:
    """Mini-batches of a client's samples: uint8 → float, augmented, normalised, on ``device``; the first
    ``keep`` of the epoch's order (:func:`epoch_samples`)."""
    index = epoch_order(indices, generator, shuffle, keep)
    black = None if augment_kind == "none" else normalise_table(data.mean, data.std)[:, 0]  # a crop's padding
    for start in range(0, len(index), batch_size):
        chunk = index[start:start + batch_size]
        x = to_float(data.x[chunk], data.mean, data.std)
        if augment_kind != "none":
            x = augment(x, augment_kind, generator, black)
        yield x.to(device, non_blocking=True), data.y[chunk].to(device, non_blocking=True)


def epoch_order(indices: np.ndarray, generator: torch.Generator, shuffle: bool,
                keep: int | None = None) -> torch.Tensor:
    """An epoch's sample order: the one ``randperm`` draw per epoch every batch source shares (the
    batched executor's too), cut to its first ``keep`` (None: all) after the draw, as a DataLoader's
    ``drop_last`` cuts its shuffled sampler's order: each epoch drops other samples."""
    index = torch.tensor(indices, dtype=torch.long)  # a copy: arrays from Ray's object store are read-only
    return (index[torch.randperm(len(index), generator=generator)] if shuffle else index)[:keep]


def epoch_samples(n: int, training: TrainingConfig) -> int:
    """The samples a client of ``n`` trains an epoch: all, or with ``training.drop_last`` its full batches'
    floor(n/B)·B. That is also its n_k in the server's weighted average, as FedAlign's code weighs a client by
    ``len(loader) * batch_size`` of a ``drop_last`` loader (``mmendiet/FedAlign:methods/base.py``)."""
    return n - n % training.batch_size if training.drop_last else n


class HostBatches:
    """The reference batch source: each batch gathered and normalised on the host, then copied over."""

    def __init__(self, data: FederatedData, device: torch.device) -> None:
        self.data, self.device = data, device

    def epoch(self, indices: np.ndarray, batch_size: int, generator: torch.Generator,
              augment_kind: str, keep: int | None = None) -> Iterator[Batch]:
        return batches(self.data, indices, batch_size, generator, self.device, augment_kind=augment_kind, keep=keep)


class DeviceBatches:
    """The fast path's batch source: the run's uint8 pool on the device once (not per client), each batch
    gathered there by index and normalised by table lookup (bit-identical to ``to_float``), augmented
    with the same generator draws in the same order as :class:`HostBatches`, so the batches are equal."""

    def __init__(self, data: FederatedData, device: torch.device) -> None:
        self.x, self.y = data.x.to(device), data.y.to(device)  # no copy when the device is the CPU
        self.table = device_table(data.mean, data.std, device)
        self.black = self.table[:, 0]  # a black pixel, normalised: a crop's padding (``augment``)
        self.device = device

    def epoch(self, indices: np.ndarray, batch_size: int, generator: torch.Generator,
              augment_kind: str, keep: int | None = None) -> Iterator[Batch]:
        index = epoch_order(indices, generator, True, keep).to(self.device, non_blocking=True)
        for start in range(0, len(index), batch_size):
            chunk = index[start:start + batch_size]
            x = lookup_float(self.x[chunk], self.table)
            yield (augment(x, augment_kind, generator, self.black) if augment_kind != "none" else x), self.y[chunk]


class HostMeter:
    """Reference step metrics: read every step (two host syncs), so a non-finite loss stops the client
    before its optimiser step."""

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
    """Fast-path step metrics: accumulated on the device and read once per client. The loss sum is kept in
    float64 as ``HostMeter``'s Python float is (float32 loss × batch size, summed in order), so the figures
    are the same bits. A non-finite loss cannot stop the step here; the sum then turns non-finite for good
    (NaN stays NaN, ±inf stays ±inf or becomes NaN, and finite float32 losses × batch sizes cannot overflow
    float64), which flags the client (``deferred``) and the caller re-runs it on the reference path.
    Each step adds to views of one buffer made once: no indexing, reads or checks per step, whose every op
    is a kernel launch on a GPU."""

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


def make_optimizer(params: list[nn.Parameter], training: TrainingConfig, lr: float) -> torch.optim.Optimizer:
    """A fresh optimiser per client and phase (no momentum carried across clients, as in the papers' code)."""
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=training.weight_decay)
    return torch.optim.SGD(
        params, lr=lr, momentum=training.momentum, weight_decay=training.weight_decay, nesterov=training.nesterov
    )


class KeptSGD:
    """``torch.optim.SGD``'s step for the exact path, without an ``Optimizer`` object: each step calls
    ``torch.optim.sgd.sgd``, the public functional form ``SGD.step`` itself calls, with the arguments
    ``SGD.step`` passes (same params, grads and momentum buffers, foreach/fused left to torch), so the
    bits are SGD's. Why: building or stepping any ``torch.optim.Optimizer`` imports ``torch._dynamo``
    (``add_param_group`` and ``zero_grad`` are dynamo-disabled, ``step`` graph-breaks): memory in every
    training process that never compiles. Its state is the momentum
    buffers alone; ``reset`` empties them, as a fresh SGD starts (buffer = first gradient)."""

    def __init__(self, params: list[nn.Parameter], training: TrainingConfig, lr: float) -> None:
        self.params = params
        self.settings = dict(weight_decay=training.weight_decay, momentum=training.momentum, dampening=0,
                             nesterov=training.nesterov, maximize=False)
        self.reset(lr)

    def reset(self, lr: float) -> None:
        self.lr = lr
        self.buffers: dict[int, torch.Tensor | None] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """SGD._init_group then SGD.step: only params with a gradient; buffers listed only with momentum."""
        live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        momentum = self.settings["momentum"] != 0
        buffers = [self.buffers.get(i) for i, _ in live] if momentum else []
        grads = [p.grad for _, p in live]
        sgd(
            [p for _, p in live], grads, buffers, lr=self.lr, has_sparse_grad=any(g.is_sparse for g in grads),
            foreach=None, fused=None, grad_scale=None, found_inf=None, **self.settings,
        )
        if momentum:
            self.buffers.update((i, b) for (i, _), b in zip(live, buffers, strict=True))


class Optimizers:
    """Optimisers for each client and phase: built fresh (``reuse=False``, the reference), or one kept per
    parameter set and optimiser setting and emptied of its state before each use. SGD and Adam build their
    per-parameter state (momentum buffer; step and moments) lazily on the first step, so an emptied one
    takes exactly a fresh one's steps; only the construction is saved. Kept SGD is :class:`KeptSGD` (the
    same bits, no ``torch._dynamo`` import); Adam stays ``torch.optim.Adam``. The kept ones hold their
    parameters, so an ``id`` in a key is never reused by another parameter."""

    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse
        self.kept: dict[tuple, torch.optim.Optimizer | KeptSGD] = {}

    def get(
        self, params: list[nn.Parameter], training: TrainingConfig, lr: float,
    ) -> torch.optim.Optimizer | KeptSGD:
        if not self.reuse:
            return make_optimizer(params, training, lr)
        key = (training.optimizer, training.momentum, training.weight_decay, training.nesterov, *map(id, params))
        optimizer = self.kept.get(key)
        if optimizer is None:
            optimizer = self.kept[key] = (
                KeptSGD(params, training, lr) if training.optimizer == "sgd" else make_optimizer(params, training, lr)
            )
        if isinstance(optimizer, KeptSGD):
            optimizer.reset(lr)
            return optimizer
        optimizer.state.clear()
        for group in optimizer.param_groups:
            group["lr"] = lr
        return optimizer


@dataclass(frozen=True)
class Executor:
    """How ``train_client`` runs the one local loop (``resources.executor``): where batches come from,
    how step metrics are kept, whether optimisers are reused. ``exact`` and ``reference`` give the same
    bits (tests/engine/test_executor_exact.py); ``exact`` spends fewer host syncs and copies per step."""

    kind: str
    source: HostBatches | DeviceBatches
    meter: type[HostMeter]
    optimizers: Optimizers

    @classmethod
    def build(cls, kind: str, data: FederatedData, device: torch.device) -> Executor:
        """Once per run and worker: ``exact`` moves the run's data to ``device`` here."""
        if kind == "exact":
            return cls(kind, DeviceBatches(data, device), DeviceMeter, Optimizers(reuse=True))
        return cls("reference", HostBatches(data, device), HostMeter, Optimizers(reuse=False))


def _trainable(model: nn.Module, phase: Phase) -> list[nn.Parameter]:
    """Select a phase's parameters; freeze the rest so no gradient is computed for them."""
    chosen = []
    for name, param in model.named_parameters():
        param.requires_grad_(phase.prefixes is None or name.startswith(phase.prefixes))
        if param.requires_grad:
            chosen.append(param)
    return chosen


def train_client(
    method: Method, model: nn.Module, data: FederatedData, client_id: int, inputs: RoundInput,
    client_state: dict[str, Any], training: TrainingConfig, augment_kind: str, device: torch.device,
    global_tensors: dict[str, torch.Tensor] | None = None, executor: Executor | None = None,
) -> ClientResult:
    """One client's local update: the engine's loop around the method's hooks (see methods/base.py).

    ``executor``: the run's (``Executor.build``, kept by the worker); None = the reference path. A client
    whose loss turned non-finite on a path that reads its metrics once (``HostMeter.deferred``) is trained
    again on the reference path, which stops at the first such step: every result, diverged or not, is
    then the reference's (a client's randomness is all from its seed, so the re-run replays it).
    """
    executor = executor if executor is not None else Executor.build("reference", data, device)
    client_seed = derive_seed(inputs.seed, inputs.round, client_id)
    torch.manual_seed(client_seed)
    generator = torch.Generator().manual_seed(client_seed)
    if global_tensors is None:
        global_tensors = state_on_device(inputs.global_state, device)
    start = method.client_model_state(inputs.global_state, client_state)
    model.load_state_dict(device_states([start], device, inputs.global_state, global_tensors)[0])
    indices = data.client_train[client_id]
    kept = epoch_samples(len(indices), training)

    def epoch() -> Iterator[Batch]:
        return executor.source.epoch(indices, training.batch_size, generator, augment_kind, kept)

    ctx = ClientContext(
        client_id=client_id, round=inputs.round, model=model, global_state=global_tensors,
        state=dict(client_state), server=inputs.server, server_tensors=inputs.server_on(device),
        num_samples=kept, epochs=training.local_epochs, lr=inputs.lr, device=device, batches=epoch,
        momentum=training.momentum if training.optimizer == "sgd" else 0.0, nesterov=training.nesterov,
        batch_size=training.batch_size, initial_lr=training.lr, grad_clip=training.grad_clip,
    )
    method.setup_client(ctx)
    model.train()
    meter = executor.meter(device)
    _local_steps(method, ctx, training, inputs.lr, executor.optimizers, meter)
    for param in model.parameters():
        param.requires_grad_(True)
    loss_sum, correct, seen, diverged = meter.totals()
    if diverged and meter.deferred:
        return train_client(method, model, data, client_id, inputs, client_state, training, augment_kind, device,
                            global_tensors)
    result = method.client_result(ctx)
    result.metrics.update(
        train_loss=loss_sum / max(seen, 1) if not diverged else math.nan,
        train_acc=correct / max(seen, 1), samples=float(seen), steps=float(ctx.steps), diverged=float(diverged),
    )
    return result


def final_training(method: Method, training: TrainingConfig) -> tuple[Method, TrainingConfig]:
    """What a client's final personal round trains (``training.finetune_epochs`` epochs at the round's lr):
    the method's personal part tuned on CE from its client model (``final_round = "tune"``, its tuner:
    ``finetune.tuner_for``), or one more of its own local updates (``"own"``: Ditto's personal model, as FedCR's
    last round updates it), with the training settings to run it under."""
    if method.final_round == "tune":
        whole = training.finetune_params == "all"
        return tuner_for(method, training.finetune_epochs, training.finetune_lr, whole), training
    return method, training.model_copy(update={"local_epochs": training.finetune_epochs})


def final_model(
    method: Method, model: nn.Module, inputs: RoundInput, result: ClientResult, device: torch.device,
    global_tensors: dict[str, torch.Tensor],
) -> None:
    """Leave in ``model``, which holds a client's trained weights after its final round, the model its
    personalised evaluation scores: those weights (``tune``), or its new client model (``own``)."""
    if method.final_round == "own":
        end = method.client_model_state(inputs.global_state, result.state)
        model.load_state_dict(device_states([end], device, inputs.global_state, global_tensors)[0])


def final_round(
    method: Method, model: nn.Module, data: FederatedData, client_id: int, inputs: RoundInput,
    client_state: dict[str, Any], training: TrainingConfig, augment_kind: str, device: torch.device,
    executor: Executor | None = None, global_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """One client's final personal round (:func:`final_training`), leaving in ``model`` the model its
    personalised evaluation scores (:func:`final_model`). ``global_tensors``: ``state_on_device`` of
    ``inputs.global_state``, made once for all a worker's clients."""
    global_tensors = global_tensors if global_tensors is not None else state_on_device(inputs.global_state, device)
    final, settings = final_training(method, training)
    result = train_client(final, model, data, client_id, inputs, client_state, settings, augment_kind, device,
                          global_tensors, executor)
    final_model(method, model, inputs, result, device, global_tensors)


def _local_steps(
    method: Method, ctx: ClientContext, training: TrainingConfig, lr: float, optimizers: Optimizers,
    meter: HostMeter,
) -> None:
    """Every phase's epochs of steps (its first ``Phase.steps`` of them when it caps them); stops at the first
    step ``meter`` finds non-finite."""
    for phase in method.phases(ctx):
        params = _trainable(ctx.model, phase)
        phase_lr = phase.lr if phase.lr is not None else lr
        optimizer = optimizers.get(params, training, phase_lr)
        for x, y in _phase_batches(ctx, phase):
            optimizer.zero_grad(set_to_none=True)
            loss, logits = method.backward(ctx, x, y)
            if not meter.finite(loss):
                return
            add_correction(method, ctx)
            if training.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, training.grad_clip)
            _step(optimizer, ctx, phase_lr)
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


def _phase_batches(ctx: ClientContext, phase: Phase) -> Iterator[Batch]:
    """A phase's batches: its epochs' in turn, ending after ``phase.steps`` of them when it caps them. An epoch
    past the cap is never begun, so it draws nothing from the client's generator."""
    taken = 0
    for _ in range(phase.epochs):
        if taken == phase.steps:
            return
        for batch in ctx.batches():
            yield batch
            taken += 1
            if taken == phase.steps:
                return


def _step(optimizer: torch.optim.Optimizer | KeptSGD, ctx: ClientContext, phase_lr: float) -> None:
    """The optimiser step, at ``ctx.step_lr`` when ``backward`` set one for this step (then cleared)."""
    if ctx.step_lr is None:
        optimizer.step()
        return
    set_lr(optimizer, ctx.step_lr)
    optimizer.step()
    set_lr(optimizer, phase_lr)
    ctx.step_lr = None


def set_lr(optimizer: torch.optim.Optimizer | KeptSGD, lr: float) -> None:
    """Change the learning rate of every parameter group."""
    if isinstance(optimizer, KeptSGD):
        optimizer.lr = lr
        return
    for group in optimizer.param_groups:
        group["lr"] = lr


EVAL_BATCH = 100
"""Test images per evaluation batch: the unit the workers share an evaluation in (``batch_scores``).
100, not 1000: on a one-thread CPU worker the activations of a small batch stay in cache; counts are the
same, summed losses differ from 1000's in the last digits."""


@torch.no_grad()
def score_sums(
    model: nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor, device: torch.device,
    batches: Sequence[int],
) -> torch.Tensor:
    """[len(batches), 2] float64 on ``device``: (summed CE loss, correct) of ``model`` in eval mode on each of
    ``batches`` (indices of ``EVAL_BATCH``-image slices of uint8 ``x``, in ascending order), left unread.

    The batches' images and labels go over in one copy each and are normalised there by table lookup (the
    bits of ``to_float``); each score is written into the result on the device. A per-batch read, as
    ``float(loss)`` did, is a host sync, and so is each copy from pageable memory: where Tune trials share
    one GPU, each waits for the GPU's turn (docs/architecture.md). float32 → float64 is exact, so what the caller
    reads equals those per-batch Python floats."""
    model.eval()
    sums = torch.empty(len(batches), 2, dtype=torch.float64, device=device)
    if not batches:
        return sums
    first, end = batches[0] * EVAL_BATCH, (batches[-1] + 1) * EVAL_BATCH
    xs, ys = x[first:end].to(device), y[first:end].to(device)
    table = device_table(data.mean, data.std, device)
    for row, b in enumerate(batches):
        rows = slice(b * EVAL_BATCH - first, (b + 1) * EVAL_BATCH - first)
        logits = model(lookup_float(xs[rows], table))
        sums[row, 0] = torch.nn.functional.cross_entropy(logits, ys[rows], reduction="sum")
        sums[row, 1] = (logits.argmax(1) == ys[rows]).sum()
    return sums


def read_scores(sums: torch.Tensor) -> list[tuple[int, float]]:
    """``score_sums`` rows as (correct, summed loss) pairs: one read."""
    return [(int(correct), loss) for loss, correct in sums.tolist()]


def batch_scores(
    model: nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor, device: torch.device,
    batches: Sequence[int],
) -> list[tuple[int, float]]:
    """(correct, summed CE loss) on each of ``batches`` (``score_sums``, read once). Per batch, so an
    evaluation split over workers sums the very same numbers in the same order as one process does
    (``evaluate``)."""
    return read_scores(score_sums(model, data, x, y, device, batches))


def eval_batch_count(n: int) -> int:
    return -(-n // EVAL_BATCH)


def total_scores(scores: list[tuple[int, float]], n: int) -> tuple[int, float, int]:
    """(correct, summed loss, count) from per-batch scores in batch order: losses added left to right."""
    correct, loss_sum = 0, 0.0
    for batch_correct, batch_loss in scores:
        correct += batch_correct
        loss_sum += batch_loss
    return correct, loss_sum, n


def evaluate(
    model: nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor, device: torch.device,
) -> tuple[int, float, int]:
    """(correct, summed CE loss, count) of ``model`` on uint8 images ``x`` in eval mode."""
    return total_scores(batch_scores(model, data, x, y, device, range(eval_batch_count(len(y)))), len(y))
