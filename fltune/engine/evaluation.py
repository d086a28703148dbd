"""Plain evaluation: a model's summed CE loss and correct count on test images, per batch, so an evaluation
split over workers sums the same numbers in the same order as one process does."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fltune.data.federated import FederatedData
from fltune.data.augment import lookup_float
from fltune.engine.batches import device_table


EVAL_BATCH = 100
"""Test images per evaluation batch, the unit workers share an evaluation in: small, so a one-thread CPU worker's
activations stay in cache. Changing it moves summed losses in their last digits."""


@torch.no_grad()
def score_sums(
    model: nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor, device: torch.device,
    batches: Sequence[int],
) -> torch.Tensor:
    """[len(batches), 2] float64 on ``device``: (summed CE loss, correct) of ``model`` in eval mode on each of
    ``batches`` (indices of ``EVAL_BATCH``-image slices of uint8 ``x``, ascending), left unread: each read is a
    host sync waiting for the GPU's turn where Tune trials share one. Normalised by lookup (``to_float``'s bits)."""
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
    """(correct, summed CE loss) on each of ``batches``, read once (per batch: see the module)."""
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
