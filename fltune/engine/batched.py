"""The batched executor (``resources.executor: batched``): K clients of a round trained at once.

The exact path (local.py) trains a worker's clients one after another, one small batch at a time, so on a
GPU the step is bound by Python and kernel launches. Here a group of K clients shares every step: their
parameters and SGD momentum buffers are stacked along a leading client axis and one
``torch.func.vmap(torch.func.grad(...))`` over ``functional_call`` computes all K gradients in one set of
kernels. The method supplies its per-batch objective as a pure function of the parameters
(``Method.functional_loss``, with the per-client tensors of ``Method.loss_inputs``); every other client hook
(``setup_client``, ``phases``, ``client_result``) runs per client on the worker's module as in the exact
path, so methods need nothing else.

Semantics are the exact path's, client by client: each client draws its batches from its own generator
seeded by (seed, round, client id) (``local.batches``), in the same order; a client with fewer samples
runs fewer steps (a client without a batch at a step, or stopped by a non-finite loss, is masked: neither
its parameters nor its momentum change); a short last batch is padded and its loss averaged over its
real samples only (``masked_cross_entropy``). The numbers are not bit-identical to the exact path's
(batched kernels sum in another order), but a group's result depends only on its clients: groups are the
round's sorted client ids in chunks of ``resources.batch_clients`` and are handed to workers whole
(``pool.balance``), so runs are deterministic and independent of the worker count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fltune.config import ExperimentConfig, TrainingConfig
from fltune.data.federated import FederatedData
from fltune.engine.local import RoundInput, batches, load_state
from fltune.engine.rng import derive_seed
from fltune.methods.base import ClientContext, ClientResult, Method, Phase

LOG = logging.getLogger(__name__)

Stacked = dict[str, Tensor]
"""Parameter name → tensor with a leading client axis of length K."""


def client_groups(clients: list[int], size: int) -> list[list[int]]:
    """The clients, sorted, in consecutive chunks of ``size``: a rule of the client list alone, never of
    the workers. A worker's shard made of whole groups re-chunks into the very same groups (only the last
    group, which holds the largest ids, can be short), so workers need not be told the grouping."""
    ordered = sorted(clients)
    return [ordered[start:start + size] for start in range(0, len(ordered), size)]


def unbatchable(cfg: ExperimentConfig, method: Method, model: nn.Module) -> str | None:
    """Why the batched executor trains this run per client on the exact path, or None when it batches."""
    if not type(method).batches_clients():
        return f"method {cfg.method.name} has no functional local step (Method.functional_loss)"
    if cfg.training.optimizer != "sgd":
        return f"training.optimizer {cfg.training.optimizer} (the batched step is SGD)"
    if next(model.buffers(), None) is not None:
        return f"model {cfg.model.name} has buffers (BatchNorm statistics would mix padded samples in)"
    return None


def note_fallback(cfg: ExperimentConfig, method: Method, model: nn.Module) -> None:
    """One log line per run (on the driver) when ``executor: batched`` cannot batch this run."""
    reason = unbatchable(cfg, method, model) if cfg.resources.executor == "batched" else None
    if reason:
        LOG.warning("resources.executor: batched trains every client on the exact path: %s", reason)


@dataclass
class _Tally:
    """Per-client running loss, accuracy, sample and step counts, kept on the device and read once."""

    loss_sum: Tensor
    correct: Tensor
    seen: Tensor
    steps: Tensor
    diverged: Tensor

    @classmethod
    def zeros(cls, k: int, device: torch.device) -> _Tally:
        def z(dtype: torch.dtype) -> Tensor:
            return torch.zeros(k, dtype=dtype, device=device)

        return cls(z(torch.float64), z(torch.long), z(torch.long), z(torch.long), z(torch.bool))

    def metrics(self) -> list[dict[str, float]]:
        """Each client's metrics as ``train_client`` reports them."""
        rows = zip(*(t.tolist() for t in (self.loss_sum, self.correct, self.seen, self.steps, self.diverged)))
        return [
            {"train_loss": loss / max(seen, 1) if not diverged else float("nan"),
             "train_acc": correct / max(seen, 1), "samples": float(seen), "steps": float(steps),
             "diverged": float(diverged)}
            for loss, correct, seen, steps, diverged in rows
        ]


def _context(
    method: Method, model: nn.Module, data: FederatedData, cid: int, inputs: RoundInput, state: dict[str, Any],
    training: TrainingConfig, augment_kind: str, device: torch.device, global_tensors: dict[str, Tensor],
) -> ClientContext:
    """Client ``cid``'s context after ``setup_client``, the model holding its starting weights (as in
    ``local.train_client``); its batches come from its own (seed, round, client id) generator."""
    seed = derive_seed(inputs.seed, inputs.round, cid)
    generator = torch.Generator().manual_seed(seed)
    load_state(model, method.client_model_state(inputs.global_state, state))
    indices = data.client_train[cid]

    def epoch() -> Iterator[tuple[Tensor, Tensor]]:
        return batches(data, indices, training.batch_size, generator, device, augment_kind=augment_kind)

    ctx = ClientContext(
        client_id=cid, round=inputs.round, model=model, global_state=global_tensors, state=dict(state),
        server=inputs.server, num_samples=len(indices), epochs=training.local_epochs, lr=inputs.lr,
        device=device, batches=epoch, momentum=training.momentum, nesterov=training.nesterov,
    )
    method.setup_client(ctx)
    return ctx


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
    return [list(phases) for phases in by_index]


def _padded_step(items: list[tuple[Tensor, Tensor] | None], device: torch.device) -> tuple[Tensor, ...]:
    """The K clients' batches of one step padded to one shape: (x, y, weight, active); a client without a
    batch gets weight 0 everywhere and active False."""
    real = [item for item in items if item is not None]
    size = max(len(y) for _, y in real)
    x = torch.zeros((len(items), size, *real[0][0].shape[1:]), dtype=real[0][0].dtype, device=device)
    y = torch.zeros((len(items), size), dtype=torch.long, device=device)
    weight = torch.zeros((len(items), size), device=device)
    for k, item in enumerate(items):
        if item is not None:
            n = len(item[1])
            x[k, :n], y[k, :n], weight[k, :n] = item[0], item[1], 1.0
    active = torch.tensor([item is not None for item in items], device=device)
    return x, y, weight, active


class _GroupTrainer:
    """One phase's batched SGD on a group: gradients by vmap, clipping and the optimiser step by hand,
    each op with torch.optim.SGD's meaning (weight decay, heavy-ball or Nesterov momentum)."""

    def __init__(self, method: Method, model: nn.Module, training: TrainingConfig, trainable: list[str]) -> None:
        self.training, self.trainable = training, trainable
        names = [n for n, _ in model.named_parameters()]

        def loss(
            train: Stacked, frozen: Stacked, inputs: dict[str, Stacked], x: Tensor, y: Tensor, w: Tensor,
        ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            params = {n: train[n] if n in train else frozen[n] for n in names}  # the model's order
            value, logits = method.functional_loss(
                lambda p, xb: functional_call(model, p, (xb,)), params, inputs, x, y, w,
            )
            return value, (value.detach(), logits.detach())

        self.grads = vmap(grad(loss, has_aux=True), randomness="different")

    def step(
        self, params: Stacked, buffers: Stacked, inputs: dict[str, Stacked], batch: tuple[Tensor, ...], lr: float,
        tally: _Tally,
    ) -> None:
        """One masked step of all K clients: ``params`` and ``buffers`` are updated in place."""
        x, y, weight, active = batch
        train = {n: params[n] for n in self.trainable}
        frozen = {n: p for n, p in params.items() if n not in train}
        grads, (loss, logits) = self.grads(train, frozen, inputs, x, y, weight)
        tally.diverged |= active & ~torch.isfinite(loss)
        live = active & ~tally.diverged
        if self.training.grad_clip is not None:
            self._clip(grads)
        for name, g in grads.items():
            self._update(name, g, params, buffers, lr, live)
        count = weight.sum(1).long()
        tally.loss_sum += torch.where(live, loss.double() * count, 0.0)
        tally.correct += torch.where(live, ((logits.argmax(-1) == y) & (weight > 0)).sum(1), 0)
        tally.seen += torch.where(live, count, 0)
        tally.steps += live.long()

    def _clip(self, grads: Stacked) -> None:
        """Per client, ``clip_grad_norm_``: scale by max_norm / (‖g‖ + 1e-6), at most 1 (in place)."""
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
        coef = (self.training.grad_clip / (norms + 1e-6)).clamp(max=1.0)
        for g in grads.values():
            g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))

    def _update(self, name: str, g: Tensor, params: Stacked, buffers: Stacked, lr: float, live: Tensor) -> None:
        """SGD on one parameter of every live client, in place on ``g`` (the step's own gradient), the
        buffer and the parameter: no new K-model tensors per step, which cost more than the arithmetic. A masked
        client's gradient becomes 0 before it can touch the momentum (a non-finite one too), its buffer is
        scaled by 1 instead of ρ and its step by 0, so neither changes; a zero buffer makes the first
        momentum step b = g, as torch.optim.SGD's."""
        t = self.training
        p = params[name]
        mask = live.view(-1, *[1] * (p.dim() - 1))
        if t.weight_decay:
            g.add_(p, alpha=t.weight_decay)
        g.masked_fill_(~mask, 0.0)
        if t.momentum:
            buf = buffers[name].mul_(torch.where(mask, t.momentum, 1.0)).add_(g)
            g = g.add_(buf, alpha=t.momentum) if t.nesterov else buf
        p.addcmul_(g, torch.where(mask, -lr, 0.0))


def _run_phase(
    trainer: _GroupTrainer, contexts: list[ClientContext], phases: list[Phase], params: Stacked,
    inputs: dict[str, Stacked], lr: float, tally: _Tally, device: torch.device,
) -> None:
    """A phase's epochs for the group, each client for its own ``phase.epochs`` (momentum starts at zero,
    as the exact path's fresh optimiser per client and phase)."""
    buffers = {n: torch.zeros_like(params[n]) for n in trainer.trainable}
    for epoch in range(max(p.epochs for p in phases)):
        streams = [ctx.batches() if epoch < p.epochs else iter(()) for ctx, p in zip(contexts, phases)]
        while True:
            items = [next(stream, None) for stream in streams]
            if all(item is None for item in items):
                break
            trainer.step(params, buffers, inputs, _padded_step(items, device), lr, tally)


def train_group(
    method: Method, model: nn.Module, data: FederatedData, client_ids: list[int], inputs: RoundInput,
    states: dict[int, dict[str, Any]], training: TrainingConfig, augment_kind: str, device: torch.device,
    global_tensors: dict[str, Tensor],
) -> Iterator[tuple[int, ClientResult]]:
    """Train one group of clients together; yield each client's result with ``model`` holding its final
    weights (so the worker can keep its local model), in the group's order."""
    contexts, starts, per_client_inputs = [], [], []
    for cid in client_ids:
        ctx = _context(method, model, data, cid, inputs, states.get(cid, {}), training, augment_kind, device,
                       global_tensors)
        contexts.append(ctx)
        starts.append({n: p.detach().clone() for n, p in model.named_parameters()})
        per_client_inputs.append(method.loss_inputs(ctx))
    params, stacked_inputs = _stack(starts), _stack(per_client_inputs)
    model.train()
    tally = _Tally.zeros(len(client_ids), device)
    torch.manual_seed(derive_seed(inputs.seed, inputs.round, client_ids[0]))  # a random layer's draws
    for phases in _common_phases(method, contexts):
        prefixes = phases[0].prefixes
        trainable = [n for n in params if prefixes is None or n.startswith(prefixes)]
        trainer = _GroupTrainer(method, model, training, trainable)
        lr = phases[0].lr if phases[0].lr is not None else inputs.lr
        _run_phase(trainer, contexts, phases, params, stacked_inputs, lr, tally, device)
    for k, (ctx, metrics) in enumerate(zip(contexts, tally.metrics())):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(params[name][k])
        ctx.steps = int(metrics["steps"])
        result = method.client_result(ctx)
        result.metrics.update(metrics)
        yield ctx.client_id, result
