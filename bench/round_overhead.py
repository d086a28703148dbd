"""How much does fltune's federated machinery cost over a tight single-process PyTorch loop?

Workload (issue: engine, part 11): FedAvg, FMNIST IID, 100 clients, 10 per round, 1 local epoch,
batch 50, FedAvg CNN, 5 timed rounds after 1 warm-up round. fltune runs it on its Ray actor pool (as
many 1-CPU workers as cores); the tight loop trains the very same clients on the very same samples in
one process using every core (torch threads = cores; on the GPU where there is one), averaging weights
in place. Evaluation is left out of both timings. Last line: ``ratio <fltune/tight>`` (goal ≤ 1.15).

    python bench/round_overhead.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.data.augment import to_float
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_model_for, initial_state, load_data
from fltune.engine.rng import round_clients


def workload(rounds: int, extra: tuple[str, ...] = ()) -> ExperimentConfig:
    """The issue's workload at ``rounds`` rounds (the first is the warm-up), ``extra`` overrides applied last."""
    return build_config(overrides=[
        "method.name=fedavg", "data.dataset=fmnist", "partition.kind=iid", "federation.clients=100",
        "federation.fraction=0.1", f"federation.rounds={rounds}", "training.local_epochs=1",
        "training.batch_size=50", "model.name=fedavg_cnn", "metrics.every=1000", "metrics.protocols=[global]",
        "tracking.enabled=false", *extra,
    ])


def fltune_round_seconds(cfg: ExperimentConfig) -> list[float]:
    fed = build_federation(cfg)
    try:
        fed.open()
        return [result.metrics["round_s"] for result in fed.rounds()]
    finally:
        fed.close()


def tight_round(model: torch.nn.Module, data: FederatedData, x: torch.Tensor, y: torch.Tensor,
                global_state: dict[str, torch.Tensor], clients: list[int], training) -> dict[str, torch.Tensor]:
    """One FedAvg round in plain PyTorch: each client trains one epoch from the global weights, the
    sample-weighted float64 average of their weights comes back. ``x``, ``y``: ``data``'s train images and
    labels on the model's device."""
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
    weight = 0
    for cid in clients:
        model.load_state_dict(global_state)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=training.lr, momentum=training.momentum)
        idx = torch.as_tensor(data.client_train[cid])[torch.randperm(len(data.client_train[cid]))].to(x.device)
        for s in range(0, len(idx), training.batch_size):
            chunk = idx[s:s + training.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(to_float(x[chunk], data.mean, data.std)), y[chunk]).backward()
            opt.step()
        for k, v in model.state_dict().items():
            total[k] += len(idx) * v.double()
        weight += len(idx)
    return {k: (v / weight).to(global_state[k].dtype) for k, v in total.items()}


def tight_round_seconds(cfg: ExperimentConfig, device: torch.device) -> tuple[list[float], int]:
    """Same clients, same samples, same steps: plain PyTorch on ``device``, no Ray, no copies beyond the
    average. Each round's seconds and the last round's samples."""
    torch.set_num_threads(os.cpu_count() or 1)
    data = load_data(cfg)
    model = build_model_for(cfg, data).to(device)
    x, y = data.x.to(device), data.y.to(device)
    global_state = {k: torch.tensor(v, device=device) for k, v in initial_state(cfg, data).items()}
    fed = cfg.federation
    times, samples = [], 0
    for r in range(1, fed.rounds + 1):
        start = time.perf_counter()
        clients = round_clients(fed, r)
        global_state = tight_round(model, data, x, y, global_state, clients, cfg.training)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        samples = sum(len(data.client_train[c]) for c in clients)
    return times, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cfg = workload(args.rounds + 1)
    ours = fltune_round_seconds(cfg)[1:]
    tight, samples = tight_round_seconds(cfg, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    tight = tight[1:]
    print(f"fltune  s/round: {' '.join(f'{t:.2f}' for t in ours)}  mean {sum(ours) / len(ours):.2f}"
          f"  ({samples * len(ours) / sum(ours):.0f} samples/s)")
    print(f"tight   s/round: {' '.join(f'{t:.2f}' for t in tight)}  mean {sum(tight) / len(tight):.2f}"
          f"  ({samples * len(tight) / sum(tight):.0f} samples/s)")
    print(f"ratio {sum(ours) / sum(tight):.3f}")


if __name__ == "__main__":
    main()
