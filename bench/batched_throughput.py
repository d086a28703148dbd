"""Training throughput of the batched executor against the exact per-client loop, side by side.

Workload: FedAvg, FMNIST IID, 100 clients × 600, FedAvg CNN, 10 clients per round, E = 1, B = 50. Both
executors train the very same round (same clients, seeds, global weights) in this process, as one worker
would: the exact path client after client (``local.train_client``), the batched one as one group of 10
(``batched.train_group``). Rounds alternate between the two, so a shared machine's load hits both alike.
Figure: client-samples per second (median over rounds). Last line: ``ratio <batched/exact>``.

    python bench/batched_throughput.py [--rounds 3] [--threads 1] [--group 10] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fltune.config import build_config
from fltune.engine.batched import client_groups, train_group
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.local import RoundInput, train_client
from fltune.engine.rng import sample_clients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker's cpus_per_worker)")
    parser.add_argument("--group", type=int, default=10, help="resources.batch_clients")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = build_config(overrides=[
        "data.dataset=fmnist", "partition.kind=iid", "federation.clients=100", "federation.fraction=0.1",
        "model.name=fedavg_cnn", "training.local_epochs=1", "training.batch_size=50", "tracking.enabled=false",
    ])
    data, method = load_data(cfg), build_method(cfg)
    model = build_model_for(cfg, data).to(device)
    start = initial_state(cfg, data)
    tensors = {k: torch.tensor(v, device=device) for k, v in start.items()}
    fed = cfg.federation

    def exact(inputs: RoundInput, clients: list[int]) -> None:
        for cid in clients:
            train_client(method, model, data, cid, inputs, {}, cfg.training, "none", device, tensors)

    def batched(inputs: RoundInput, clients: list[int]) -> None:
        for group in client_groups(clients, args.group):
            for _ in train_group(method, model, data, group, inputs, {}, cfg.training, "none", device, tensors):
                pass

    rates: dict[str, list[float]] = {"exact": [], "batched": []}
    for r in range(1, args.rounds + 2):  # round 1 warms both up and is not timed
        clients = sample_clients(fed.seed, r, fed.clients, fed.clients_per_round)
        inputs = RoundInput(round=r, seed=fed.seed, lr=cfg.training.lr, global_state=start, server={})
        samples = sum(len(data.client_train[c]) for c in clients)
        for name, executor in (("exact", exact), ("batched", batched)):
            began = time.perf_counter()
            executor(inputs, clients)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r > 1:
                rates[name].append(samples / (time.perf_counter() - began))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"{name:8s} {value:9.0f} client-samples/s  (rounds: {', '.join(f'{v:.0f}' for v in rates[name])})")
    print(f"ratio {medians['batched'] / medians['exact']:.2f}")


if __name__ == "__main__":
    main()
