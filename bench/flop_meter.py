"""What round 1's FLOP meter costs a client's training: fltune's ``TrainingFlops`` against torch's own
``FlopCounterMode`` and against no meter at all.

Round 1 of every run trains its clients under the meter (metrics/_flops.py), on the exact path, so the
meter's work per op lands on that round. Here: SGD steps of a model on random FMNIST-shaped batches in one
process, one thread, for each meter in turn, repeated and interleaved; the figure is each meter's median
time. At a small batch (the default, 2) the step's arithmetic is small and what the meter adds per op
shows, as it does on a GPU, where the arithmetic is fast; at batch 32 on a CPU the arithmetic hides it.
Both meters count the same FLOPs (checked here) and leave the same weights. Last lines: ``ratio
fltune/none`` and ``ratio torch/none``, the metered step's time over the bare one.

    python bench/flop_meter.py [--model fedavg_cnn] [--batch 2] [--steps 30] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fltune.metrics._flops import TrainingFlops
from fltune.models import build_model
from fltune.models.registry import MODELS


def train(model_name: str, batch: int, steps: int, meter: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """(seconds, final weights) of ``steps`` SGD steps under ``meter`` (None: no meter), from seed 0."""
    torch.manual_seed(0)
    model = build_model(model_name, (1, 28, 28), 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    with meter if meter is not None else nullcontext():
        for _ in range(steps):
            x = torch.randn(batch, 1, 28, 28, generator=generator)
            y = torch.randint(0, 10, (batch,), generator=generator)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return time.perf_counter() - start, model.state_dict()


def positive(text: str) -> int:
    """An argparse type: an integer ≥ 1 (argparse turns the error into one line and exit 2)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text}; allowed: an integer ≥ 1")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fedavg_cnn", choices=sorted(MODELS))
    parser.add_argument("--batch", type=positive, default=2)
    parser.add_argument("--steps", type=positive, default=30)
    parser.add_argument("--repeats", type=positive, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    meters = {"none": lambda: None, "torch": lambda: FlopCounterMode(display=False), "fltune": TrainingFlops}
    train(args.model, args.batch, 2, None)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in meters}
    for _ in range(args.repeats):
        weights, totals = {}, {}
        for name, make in meters.items():
            meter = make()
            seconds, weights[name] = train(args.model, args.batch, args.steps, meter)
            times[name].append(seconds)
            if meter is not None:
                totals[name] = meter.get_total_flops()
        if totals["torch"] != totals["fltune"] or not all(
                torch.equal(weights["none"][k], w[k]) for w in weights.values() for k in w):
            raise SystemExit(f"the meters disagree: {totals}")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.model}, batch {args.batch}, {args.steps} steps: " + ", ".join(
        f"{name} {seconds:.3f} s" for name, seconds in median.items()) + f"; {totals['fltune']:,} FLOPs counted")
    print(f"ratio fltune/none {median['fltune'] / median['none']:.3f}")
    print(f"ratio torch/none {median['torch'] / median['none']:.3f}")


if __name__ == "__main__":
    main()
