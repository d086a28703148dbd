"""What do the Hessian metrics cost next to the training they analyse?

Workload: the FedAvg CNN (FMNIST shape, 1.66 M parameters) and 10 batches of 50 FMNIST training images
(the first 500; random N(0, 1) images with random labels when FMNIST is not installed — the ``data``
line says which). Timed: one local epoch of SGD over the 10 batches (lr 0.01, momentum 0.9, FedSOL's
setting; best of 3, each from a fresh copy of the model), then λ_max (``top_eigenpairs``, k = 1) plus
the trace (``hessian_trace``) at the model after those epochs, with docs/methods.md §4's defaults (tol 1e-3, at
most 100 iterations each), on the same 10 batches. Runs on CUDA when available, else on CPU with
``torch.set_num_threads(1)`` for both timings (the 2 cores are shared; one thread keeps timings stable).
On CPU the process-CPU-time ratio is printed too: on a loaded shared machine the wall times of both
parts stretch unevenly, their CPU times do not. Last line: ``ratio <hessian/epoch>`` (wall time).

    python bench/hessian_cost.py
"""

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from fltune.data.augment import to_float
from fltune.data.datasets import load_dataset
from fltune.errors import DatasetMissing
from fltune.metrics._hessian import Batch, cross_entropy_loss, hessian_trace, top_eigenpairs
from fltune.models import build_model

BATCHES, BATCH_SIZE, EPOCH_REPEATS = 10, 50, 3
T = TypeVar("T")


def fmnist_batches(device: torch.device) -> tuple[list[Batch], str]:
    """The first 500 FMNIST training samples, normalised, as 10 batches; random data if FMNIST is absent."""
    count = BATCHES * BATCH_SIZE
    try:
        data = load_dataset("fmnist")
        x, y, source = to_float(data.train_x[:count], data.mean, data.std), data.train_y[:count], "FMNIST"
    except DatasetMissing:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(count, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (count,), generator=generator)
        source = "random N(0, 1) images, random labels (FMNIST not installed)"
    pairs = zip(x.to(device).split(BATCH_SIZE), y.to(device).split(BATCH_SIZE))
    return list(pairs), source


@dataclass(frozen=True)
class Timing(Generic[T]):
    wall_s: float
    cpu_s: float  # this process's CPU time; meaningless for CUDA work
    result: T


def timed(fn: Callable[[], T], device: torch.device) -> Timing[T]:
    """Wall and process-CPU seconds of ``fn()`` (CUDA work included) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu, result)


def train_epoch(model: torch.nn.Module, batches: list[Batch]) -> torch.nn.Module:
    """One local epoch of plain SGD, as a client of FedAvg runs it."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for batch in batches:
        optimiser.zero_grad()
        cross_entropy_loss(model, batch).backward()
        optimiser.step()
    return model


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches, source = fmnist_batches(device)
    initial = build_model("fedavg_cnn", (1, 28, 28), 10).to(device)
    train_epoch(copy.deepcopy(initial), batches[:1])  # warm-up: allocator, kernels

    epoch = min(
        (timed(lambda: train_epoch(copy.deepcopy(initial), batches), device) for _ in range(EPOCH_REPEATS)),
        key=lambda run: run.wall_s,
    )
    model = epoch.result

    calls = 0

    def counted_loss(m: torch.nn.Module, batch: Batch) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return cross_entropy_loss(m, batch)

    eigen = timed(lambda: top_eigenpairs(model, counted_loss, batches)[0][0], device)
    eigen_products, calls = calls // BATCHES, 0
    trace = timed(lambda: hessian_trace(model, counted_loss, batches).value, device)
    trace_products = calls // BATCHES
    hessian_wall_s, hessian_cpu_s = eigen.wall_s + trace.wall_s, eigen.cpu_s + trace.cpu_s

    print(f"device {device} (torch threads {torch.get_num_threads()})")
    print(f"data {source}: {BATCHES} batches of {BATCH_SIZE}")
    print(f"epoch_s {epoch.wall_s:.3f} (best of {EPOCH_REPEATS} SGD epochs; cpu {epoch.cpu_s:.3f} s)")
    print(f"lambda_max {eigen.result:.4g} in {eigen.wall_s:.2f} s ({eigen_products} Hessian-vector products)")
    print(f"trace {trace.result:.4g} in {trace.wall_s:.2f} s ({trace_products} Hessian-vector products)")
    print(f"hessian_s {hessian_wall_s:.2f} (cpu {hessian_cpu_s:.2f} s)")
    if device.type == "cpu":
        print(f"cpu_ratio {hessian_cpu_s / epoch.cpu_s:.1f}")
    print(f"ratio {hessian_wall_s / epoch.wall_s:.1f}")


if __name__ == "__main__":
    main()
