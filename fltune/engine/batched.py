"""The batched executor (``resources.executor: batched``): K clients of a round trained at once. Why: the exact path
(local.py) trains one client and one small batch at a time, bound on a GPU by Python and kernel launches. Here the K
clients' parameters and momentum are stacked along a leading axis and one ``torch.func.vmap`` over
``functional.local_step`` computes all K steps in one set of kernels.

Semantics are the exact path's, client by client: each client's batches and noise come from its own (seed, round, client
id) generators in the same order; a client without a batch, or stopped by a non-finite loss, is masked (unchanged); a
short batch is padded and averaged over its real samples. The bits differ (another summation order), but a group depends
only on its clients, and groups (sorted ids in chunks of ``resources.batch_clients``) go to workers whole
(``dispatch.balance``): results do not depend on the worker count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import vmap

from fltune.config import ExperimentConfig, TrainingConfig
from fltune.data.augment import augment, lookup_float
from fltune.engine.batches import DeviceBatches, epoch_order
from fltune.engine.local import Trainer, client_contexts, train_metrics
from fltune.engine.transfer import RoundInput
from fltune.engine.rng import derive_seed
from fltune.methods.base import ClientContext, ClientResult, Method, Phase
from fltune.engine.functional import FunctionalStep, functional_gradient, local_step, own_backward, reads_modules
from fltune.methods.objective import Batch, Forward, NoiseShapes, clipped, sgd_step
from fltune.workarounds import compile_limits

Stacked = dict[str, Tensor]
"""Parameter name → tensor with a leading client axis of length K."""


def client_groups(clients: list[int], size: int) -> list[list[int]]:
    """The clients, sorted, in chunks of ``size``: a rule of the client list alone, so a shard of whole groups
    re-chunks into the same groups (only the last, of the largest ids, can be short)."""
    ordered = sorted(clients)
    return [ordered[start:start + size] for start in range(0, len(ordered), size)]


def unbatchable(cfg: ExperimentConfig, method: Method, model: nn.Module) -> str | None:
    """Why the batched executor trains this run per client on the exact path, or None when it batches."""
    if own_backward(type(method)):
        return f"method {cfg.method.name} has a backward of its own (a step only autograd takes)"
    if reads_modules(type(method)):
        return f"method {cfg.method.name}'s objective reads a client's modules (Batch.module)"
    if cfg.training.optimizer != "sgd":
        return f"training.optimizer {cfg.training.optimizer} (the batched step is SGD)"
    if batch_statistics(model):
        return f"model {cfg.model.name} has BatchNorm or buffers (batch statistics would mix padded samples in)"
    return None


def batch_statistics(model: nn.Module) -> bool:
    """Whether ``model`` keeps buffers or normalises by the batch (a BatchNorm without running buffers, FedSOL's
    ResNet-18, still does): the padded samples of a batched step would mix in, so it trains client by client."""
    return next(model.buffers(), None) is not None or any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                                          for m in model.modules())


@dataclass
class _Tally:
    """Per-step losses, takers (``live``) and correct counts, read once at the end; ``diverged`` is kept current."""

    diverged: Tensor
    steps: list[tuple[Tensor, Tensor, Tensor, list[int]]] = field(default_factory=list)
    """Per step: (losses, live, correct counts, real samples), one entry per client each."""

    def metrics(self) -> list[dict[str, float]]:
        """Each client's :func:`~fltune.engine.local.train_metrics`; the loss sum is folded step by step in
        float64, bit for bit a running ``loss_sum += where(live, loss.double() * count, 0)``."""
        k = len(self.diverged)
        losses = lives = corrects = np.zeros((0, k))
        if self.steps:
            rows = torch.cat([torch.stack(t).double() for t in list(zip(*self.steps))[:3]])
            losses, lives, corrects = np.split(rows.cpu().numpy(), 3)  # one read: [S, K] each
        lives = lives.astype(bool)
        counts = np.array([step[3] for step in self.steps], dtype=np.int64).reshape(len(lives), k)
        loss_sum = np.zeros(k)
        with np.errstate(invalid="ignore", over="ignore"):  # a masked client's loss may be NaN or inf
            for loss, live, count in zip(losses, lives, counts):
                loss_sum += np.where(live, loss * count, 0.0)
        seen, correct, steps = (counts * lives).sum(0), (corrects * lives).sum(0), lives.sum(0)
        return [train_metrics(*client) for client in zip(
            loss_sum.tolist(), correct.tolist(), seen.tolist(), steps.tolist(), self.diverged.tolist())]


def _stack(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack K per-client (nested) dicts of tensors along a new leading axis."""
    return {
        key: _stack([row[key] for row in rows]) if isinstance(value, dict) else torch.stack([row[key] for row in rows])
        for key, value in rows[0].items()
    }


def _common_phases(method: Method, contexts: list[ClientContext]) -> list[list[Phase]]:
    """Per phase index, every client's Phase; clients may differ in epochs (masked), not in what they train."""
    per_client = [method.phases(ctx) for ctx in contexts]
    by_index = list(zip(*per_client, strict=True))
    for phases in by_index:
        if len({(p.prefixes, p.lr) for p in phases}) > 1:
            raise ValueError(f"{method.name}: clients of one group train different parameters or lrs in a phase")
        if any(p.steps is not None for p in phases):
            raise ValueError(f"{method.name}: a phase capped at a step count (Phase.steps) has no batched form")
    return [list(phases) for phases in by_index]


def _padded(rows: list[Tensor | None], size: int) -> Tensor:
    """Per-client tensors zero-padded to ``size`` rows and stacked along axis 1: [size, K, ...]; None: zeros."""
    full = [row for row in rows if row is not None and len(row) == size]
    if len(full) == len(rows):
        return torch.stack(full, dim=1)
    real = next(row for row in rows if row is not None)
    out = real.new_zeros((size, len(rows), *real.shape[1:]))
    for k, row in enumerate(rows):
        if row is not None:
            out[:len(row), k] = row
    return out


@dataclass
class _Step:
    """The K clients' batches and noise of one step, padded to its largest real batch (B when ``fixed``); a
    client without a batch has weight 0 and ``active`` False. Views of ``_GroupEpoch``'s tensors."""

    index: Tensor
    """[K, size]: the step's rows of the device pool (0 in padded rows)."""
    source: DeviceBatches
    augmented: Tensor | None
    """Augmented per client, or None: gathered by :meth:`images` inside the group step."""
    padded: bool
    y: Tensor
    weight: Tensor
    real: Tensor
    """[K, B] bool: the real rows (``weight`` as a mask)."""
    active: Tensor
    noise: dict[str, Tensor]
    counts: list[int]

    def images(self) -> Tensor:
        """The step's images [K, size, ...]; gathered here so that a compiled step fuses the gather in."""
        if self.augmented is not None:
            return self.augmented
        return _gathered(self.source, self.index, self.real, self.padded)


def _gathered(source: DeviceBatches, index: Tensor, real: Tensor, padded: bool) -> Tensor:
    """Images [K, size, ...] gathered by ``index`` and normalised by table lookup; padded rows zeroed."""
    x = lookup_float(source.x[index], source.table)
    return _zero_padding(x, real) if padded else x


def _zero_padding(t: Tensor, real: Tensor) -> Tensor:
    """``t`` with the rows ``real`` ([K, B] or [S, K, B]) marks False set to zero, in place."""
    return t.masked_fill_(~real.view(*real.shape, *[1] * (t.dim() - real.dim())), 0)


class _GroupEpoch:
    """One epoch of a group's batches, laid out step-major ([S, K, B, ...]) as it starts, so a step only takes views.
    Each client's order is the exact path's draw (``batches.epoch_order``); step s is zero-padded to its largest real
    batch, or to B when ``fixed`` (a compiled step: one shape, one graph)."""

    def __init__(
        self, source: DeviceBatches, orders: list[Tensor | None], batch_size: int,
        noise: Callable[[Tensor, int], dict[str, Tensor]], fixed: bool = False,
    ) -> None:
        lengths = torch.tensor([0 if order is None else len(order) for order in orders])
        steps = -(-int(lengths.max()) // batch_size)
        index = torch.zeros(len(orders), steps * batch_size, dtype=torch.long)
        for k, order in enumerate(orders):
            if order is not None:
                index[k, :len(order)] = order
        self.counts = (lengths[:, None] - torch.arange(steps) * batch_size).clamp(0, batch_size)  # host [K, S]
        self.sizes = [batch_size] * steps if fixed else self.counts.amax(0).tolist()
        self.source, self.fixed = source, fixed
        device = source.device
        self.index = index.view(len(orders), steps, batch_size).transpose(0, 1).contiguous().to(device)
        count = self.counts.T.contiguous().to(device)  # step-major in memory too: [S, K]
        self.active = count > 0  # [S, K]
        self.real = torch.arange(batch_size, device=device) < count[..., None]  # [S, K, B]
        self.weight = self.real.float()
        self.y = _zero_padding(source.y[self.index], self.real)  # [S, K, B]
        self.noise = noise(self.counts, batch_size)  # [S, K, B, ...] each

    def step(self, s: int, augment_kind: str, group: _Group) -> _Step:
        """Step ``s``: views of the epoch's batches, and its images where the run augments them."""
        size, counts = self.sizes[s], self.counts[:, s].tolist()
        index, real = self.index[s, :, :size], self.real[s, :, :size]
        padded = self.fixed or min(counts) < size  # a step of full batches (most of them) has none
        augmented = None if augment_kind == "none" else self._augmented(index, real, padded, counts, augment_kind,
                                                                         group.generators)
        return _Step(index, self.source, augmented, padded, self.y[s, :, :size], self.weight[s, :, :size], real,
                     self.active[s], {key: t[s, :, :size] for key, t in self.noise.items()}, counts)

    def _augmented(
        self, index: Tensor, real: Tensor, padded: bool, counts: list[int], augment_kind: str,
        generators: list[torch.Generator],
    ) -> Tensor:
        """A step's real rows augmented per client with its own generator (host draws: outside the step)."""
        x = _gathered(self.source, index, real, padded)
        for k, n in enumerate(counts):
            if n:
                x[k, :n] = augment(x[k, :n], augment_kind, generators[k], self.source.black)
        return x


COMPILED_GRAPHS = 64
"""Graphs torch.compile may keep (default 8): ``_GroupTrainer._take`` serves every phase, shape and run of a process."""


_Device = tuple[Tensor, dict[str, Stacked], Stacked, Tensor, Tensor, Stacked, Stacked]
"""What a group step leaves for the host: (losses, carried inputs, records, live, correct counts, weights, momentum);
a plain tuple, as dynamo (torch 2.11) fails on a NamedTuple built inside a compiled step."""


def compile_step(step: Callable[..., _Device]) -> Callable[..., _Device]:
    """``torch.compile`` of a group step's device work (``resources.compile``). Why: on a GPU a small model's
    step waits on the host; compiled, the Python is traced away and elementwise work fused. Steps are padded to
    B (``fixed``) so short batches compile no new graph. Fused kernels round otherwise: last digits move, still
    deterministic. Inductor uses the worker's threads, not every core: Tune's trials' workers compile at once."""
    compile_limits(COMPILED_GRAPHS, torch.get_num_threads())
    return torch.compile(step)


class _GroupTrainer:
    """One phase's batched SGD on a group: each client's gradient (clipped as the exact path's) by vmap, then the
    one SGD step (``objective.sgd_step``) on the stacked clients, a masked client keeping its weights and momentum."""

    def __init__(
        self, method: Method, model: nn.Module, training: TrainingConfig, weights: Stacked, trainable: list[str],
        round_lr: float, global_weights: dict[str, Tensor], compiled: bool = False,
    ) -> None:
        self.training, self.trainable = training, trainable
        # SGD's momentum, zero as a fresh optimiser's
        self.buffers = {n: torch.zeros_like(weights[n]) for n in trainable} if training.momentum else {}
        forward, names = Forward(model), tuple(n for n, _ in model.named_parameters())

        def client_step(
            train: Stacked, frozen: Stacked, inputs: dict[str, Stacked], noise: Stacked, x: Tensor, y: Tensor,
            w: Tensor,
        ) -> FunctionalStep:
            weights = {n: train[n] if n in train else frozen[n] for n in names}
            step = local_step(method, Batch(
                forward, weights, x, y, w, inputs, noise, global_weights, trainable=tuple(train), lr=round_lr,
                grad_clip=training.grad_clip, gradient=functional_gradient))
            return step if training.grad_clip is None else step._replace(grads=clipped(step.grads, training.grad_clip))

        # global weights are shared by every client: closed over, not a vmap argument flattened every step
        self.steps = vmap(client_step, randomness="different")
        self.take = compile_step(self._take) if compiled else self._take

    def step(
        self, weights: Stacked, inputs: dict[str, Stacked], batch: _Step, lr: float, tally: _Tally,
    ) -> tuple[dict[str, Stacked], Stacked]:
        """One masked step of all K clients; ``weights`` and momentum take the stepped values. Returns the step's
        carried inputs and records."""
        train = {n: weights[n] for n in self.trainable}
        frozen = {n: p for n, p in weights.items() if n not in train}
        loss, carry, record, live, correct, stepped, self.buffers = self.take(train, frozen, inputs, self.buffers,
                                                                             batch, tally.diverged, lr)
        weights.update(stepped)
        tally.steps.append((loss, live, correct, batch.counts))
        return carry, record

    def _take(
        self, train: Stacked, frozen: Stacked, inputs: dict[str, Stacked], buffers: Stacked, batch: _Step,
        diverged: Tensor, lr: float,
    ) -> _Device:
        """The step's device work in one function (one graph for ``resources.compile``); sets ``diverged``. Every
        tensor is replaced, none written in place: torch 2.11's inductor fused an in-place update with a read of the
        overwritten buffer (a step of (1 + ρ)·g)."""
        out = self.steps(train, frozen, inputs, batch.noise, batch.images(), batch.y, batch.weight)
        diverged |= batch.active & ((out.loss - out.loss) != 0)  # x − x is 0 unless x is NaN or ±inf
        live = batch.active & ~diverged
        t = self.training
        stepped, moved = sgd_step(train, out.grads, lr, buffers, t.momentum, t.nesterov, t.weight_decay)
        correct = ((out.logits.argmax(-1) == batch.y) & batch.real).sum(1)
        return (out.loss, {key: _where(live, new, inputs[key]) for key, new in out.kept.items()}, out.record, live,
                correct, _where(live, stepped, train), _where(live, moved, buffers))


def _where(live: Tensor, new: Stacked, old: Stacked) -> Stacked:
    """A live client's new values, a masked client's old ones."""
    return {name: torch.where(live.view(-1, *[1] * (value.dim() - 1)), value, old[name]) for name, value in new.items()}


def client_noise(
    shapes: NoiseShapes, counts: list[int], size: int, generator: torch.Generator, device: torch.device,
) -> dict[str, Tensor]:
    """One client's draws of ``shapes`` for an epoch, ``[steps, size, S, d]`` each (``counts``: real samples per
    step), one draw per key cut step by step: on a CPU, bit for bit the exact path's per-step ``[S, n, d]``
    draws (``objective.draw_noise``) when S·n·d is a multiple of 16 (torch's CPU normal fills 16 at a time)."""
    out = {}
    for key, (samples, dim) in shapes.items():
        flat = torch.randn((samples, sum(counts), dim), device=device, generator=generator).view(-1)
        eps = out[key] = flat.new_zeros(len(counts), size, samples, dim)
        full = next((s for s, n in enumerate(counts) if n < size), len(counts))  # steps before a short one
        eps[:full] = flat[:full * samples * size * dim].view(full, samples, size, dim).transpose(1, 2)
        start = full * samples * size * dim
        for s, n in enumerate(counts[full:], start=full):
            eps[s, :n] = flat[start:start + samples * n * dim].view(samples, n, dim).transpose(0, 1)
            start += samples * n * dim
    return out


@dataclass
class _Group:
    """A group's clients and stacked training state, with each client's own batch and noise generators."""

    method: Method
    contexts: list[ClientContext]
    indices: list[np.ndarray]
    generators: list[torch.Generator]
    noise: list[torch.Generator]
    weights: Stacked
    inputs: dict[str, Stacked]
    tally: _Tally
    device: torch.device
    carried: set[str]
    noise_shapes: NoiseShapes

    def epoch(
        self, source: DeviceBatches, phases: list[Phase], epoch: int, batch_size: int, fixed: bool = False,
    ) -> _GroupEpoch:
        """The group's batches of ``epoch``; a client past its phase's epochs has none and draws nothing."""
        orders = [epoch_order(indices, generator, ctx.num_samples) if epoch < phase.epochs else None
                  for indices, generator, phase, ctx in zip(self.indices, self.generators, phases, self.contexts)]
        return _GroupEpoch(source, orders, batch_size, self.epoch_noise, fixed)

    def epoch_noise(self, counts: Tensor, batch_size: int) -> dict[str, Tensor]:
        """Each client's :func:`client_noise` (``counts`` [K, S]) padded to [S, K, B, ...]; stepless: no draw."""
        rows = [client_noise(self.noise_shapes, steps, batch_size, generator, self.device)
                if (steps := [n for n in row if n]) else None for generator, row in zip(self.noise, counts.tolist())]
        keys = next((row.keys() for row in rows if row is not None), ())
        return {key: _padded([None if row is None else row[key] for row in rows], counts.shape[1]) for key in keys}

    def absorb(self, carry: dict[str, Stacked], record: Stacked, step: _Step) -> None:
        """Keep the step's carried inputs and hand each client with a batch the records of its real samples."""
        for key, values in carry.items():
            self.carried.add(key)
            self.inputs[key].update(values)
        if record:
            for k, (ctx, n) in enumerate(zip(self.contexts, step.counts)):
                if n:
                    self.method.record_step(ctx, step.y[k, :n], {key: t[k, :n] for key, t in record.items()})

    @torch.no_grad()
    def finish(self, k: int, model: nn.Module) -> None:
        """Client ``k``'s weights into ``model``, carried inputs into its ``ClientContext.inputs`` (as exact)."""
        for name, p in model.named_parameters():
            p.copy_(self.weights[name][k])
        for key in self.carried:
            for name, tensor in self.contexts[k].inputs[key].items():
                tensor.copy_(self.inputs[key][name][k])


def _run_epoch(group: _Group, trainer: _GroupTrainer, laid: _GroupEpoch, lr: float, augment_kind: str) -> None:
    """One epoch's steps; a function of its own so the epoch's tensors (VIB's ε) are freed when it ends."""
    for s in range(len(laid.sizes)):
        step = laid.step(s, augment_kind, group)
        group.absorb(*trainer.step(group.weights, group.inputs, step, lr, group.tally), step)


def _group(
    trainer: Trainer, client_ids: list[int], inputs: RoundInput, states: dict[int, dict[str, Any]],
    global_tensors: dict[str, Tensor],
) -> _Group:
    """Set every client of the group up as ``local.train_client`` does and stack what they train."""
    contexts, generators, starts = [], [], []
    for ctx, generator in client_contexts(trainer, client_ids, inputs, states, global_tensors):
        contexts.append(ctx)
        generators.append(generator)
        starts.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    noise = [torch.Generator(trainer.device).manual_seed(generator.initial_seed()) for generator in generators]
    return _Group(trainer.method, contexts, [trainer.data.client_train[cid] for cid in client_ids], generators, noise,
                  _stack(starts), _stack([ctx.inputs for ctx in contexts]),
                  _Tally(torch.zeros(len(client_ids), dtype=torch.bool, device=trainer.device)),
                  trainer.device, set(), trainer.method.noise(trainer.model))


def train_group(
    trainer: Trainer, client_ids: list[int], inputs: RoundInput, states: dict[int, dict[str, Any]],
    global_tensors: dict[str, Tensor], compiled: bool = False,
) -> Iterator[tuple[int, ClientResult]]:
    """Train one group together, each phase's momentum from zero (the exact path's fresh optimiser); yield each
    client's result in the group's order, the model holding its final weights. ``trainer.source``: the worker's
    device pool (``Trainer.of(..., exact=True)``). ``compiled``: the step through ``compile_step``."""
    method, model, training, source = trainer.method, trainer.model, trainer.training, trainer.source
    group = _group(trainer, client_ids, inputs, states, global_tensors)
    model.train()
    torch.manual_seed(derive_seed(inputs.seed, inputs.round, client_ids[0]))  # a random layer's draws
    for phases in _common_phases(method, group.contexts):
        prefixes = phases[0].prefixes
        trainable = [n for n in group.weights if prefixes is None or n.startswith(prefixes)]
        stepper = _GroupTrainer(method, model, training, group.weights, trainable, inputs.lr, global_tensors,
                                compiled)
        lr = phases[0].lr if phases[0].lr is not None else inputs.lr
        for epoch in range(max(p.epochs for p in phases)):  # each client for its own phase's epochs
            _run_epoch(group, stepper, group.epoch(source, phases, epoch, training.batch_size, compiled), lr,
                       trainer.augment)
    for k, (ctx, metrics) in enumerate(zip(group.contexts, group.tally.metrics())):
        group.finish(k, model)
        ctx.steps = int(metrics["steps"])
        result = method.client_result(ctx)
        result.metrics.update(metrics)
        yield ctx.client_id, result
