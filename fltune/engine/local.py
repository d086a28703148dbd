"""The one local training loop every method runs, and plain evaluation.

Pure functions of (model, data, weights, state, seeds): they run inside Ray worker actors in a
federation and in-process in tests and benchmarks. Each client's randomness (shuffling, augmentation,
dropout) is seeded from (seed, round, client id) only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fltune.config import TrainingConfig
from fltune.data.augment import augment, to_float
from fltune.data.federated import FederatedData
from fltune.engine.rng import derive_seed
from fltune.methods.base import ClientContext, ClientResult, Method, Phase, State


@dataclass(frozen=True)
class RoundInput:
    """What every client of a round starts from (shared by all clients a worker trains)."""

    round: int
    seed: int
    lr: float
    global_state: State
    server: dict[str, Any]


def load_state(model: nn.Module, state: State) -> None:
    """Copy numpy weights into the model (copying: arrays from Ray's object store are read-only)."""
    model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})


def batches(
    data: FederatedData, indices: np.ndarray, batch_size: int, generator: torch.Generator, device: torch.device,
    *, shuffle: bool = True, augment_kind: str = "none",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of a client's samples: uint8 → float, augmented, normalised, on ``device``."""
    index = torch.tensor(indices, dtype=torch.long)  # a copy: arrays from Ray's object store are read-only
    if shuffle:
        index = index[torch.randperm(len(index), generator=generator)]
    for start in range(0, len(index), batch_size):
        chunk = index[start:start + batch_size]
        x = to_float(data.x[chunk], data.mean, data.std)
        if augment_kind != "none":
            x = augment(x, augment_kind, generator)
        yield x.to(device, non_blocking=True), data.y[chunk].to(device, non_blocking=True)


def make_optimizer(params: list[nn.Parameter], training: TrainingConfig, lr: float) -> torch.optim.Optimizer:
    """A fresh optimiser per client and phase (no momentum carried across clients, as in the papers' code)."""
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=training.weight_decay)
    return torch.optim.SGD(
        params, lr=lr, momentum=training.momentum, weight_decay=training.weight_decay, nesterov=training.nesterov
    )


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
    global_tensors: dict[str, torch.Tensor] | None = None,
) -> ClientResult:
    """One client's local update: the engine's loop around the method's hooks (see methods/base.py)."""
    client_seed = derive_seed(inputs.seed, inputs.round, client_id)
    torch.manual_seed(client_seed)
    generator = torch.Generator().manual_seed(client_seed)
    load_state(model, method.client_model_state(inputs.global_state, client_state))
    if global_tensors is None:
        global_tensors = {k: torch.tensor(v, device=device) for k, v in inputs.global_state.items()}
    indices = data.client_train[client_id]

    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return batches(data, indices, training.batch_size, generator, device, augment_kind=augment_kind)

    ctx = ClientContext(
        client_id=client_id, round=inputs.round, model=model, global_state=global_tensors,
        state=dict(client_state), server=inputs.server, num_samples=len(indices), epochs=training.local_epochs,
        lr=inputs.lr, device=device, batches=epoch,
        momentum=training.momentum if training.optimizer == "sgd" else 0.0, nesterov=training.nesterov,
    )
    method.setup_client(ctx)
    model.train()
    loss_sum, correct, seen, diverged = 0.0, 0, 0, False
    for phase in method.phases(ctx):
        params = _trainable(model, phase)
        optimizer = make_optimizer(params, training, phase.lr if phase.lr is not None else inputs.lr)
        for _ in range(phase.epochs):
            for x, y in epoch():
                optimizer.zero_grad(set_to_none=True)
                loss, logits = method.backward(ctx, x, y)
                if not math.isfinite(loss.item()):
                    diverged = True
                    break
                method.after_backward(ctx)
                if training.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, training.grad_clip)
                optimizer.step()
                ctx.steps += 1
                loss_sum += loss.item() * len(y)
                correct += int((logits.argmax(1) == y).sum())
                seen += len(y)
            if diverged:
                break
        if diverged:
            break
    for param in model.parameters():
        param.requires_grad_(True)
    result = method.client_result(ctx)
    result.metrics.update(
        train_loss=loss_sum / max(seen, 1) if not diverged else math.nan,
        train_acc=correct / max(seen, 1), samples=float(seen), steps=float(ctx.steps), diverged=float(diverged),
    )
    return result


EVAL_BATCH = 1000
"""Test images per evaluation batch: the unit the workers share an evaluation in (``batch_scores``)."""


@torch.no_grad()
def batch_scores(
    model: nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor, device: torch.device,
    batches: Iterable[int],
) -> list[tuple[int, float]]:
    """(correct, summed CE loss) of ``model`` in eval mode on each of ``batches`` (indices of
    ``EVAL_BATCH``-image slices of uint8 ``x``). Per batch, so an evaluation split over workers sums
    the very same numbers in the same order as one process does (``evaluate``)."""
    model.eval()
    scores = []
    for b in batches:
        xb = to_float(x[b * EVAL_BATCH:(b + 1) * EVAL_BATCH], data.mean, data.std).to(device)
        yb = y[b * EVAL_BATCH:(b + 1) * EVAL_BATCH].to(device)
        logits = model(xb)
        loss = float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
        scores.append((int((logits.argmax(1) == yb).sum()), loss))
    return scores


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
