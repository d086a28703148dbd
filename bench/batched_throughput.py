"""Training throughput of the batched executor against the exact per-client loop, side by side.

Workload: FMNIST IID, 100 clients × 600, 10 clients per round, E = 1, B = 50, per method in ``--methods``
(default FedAvg) on the FedAvg CNN, or on the method's own model (VIB methods: FedCR's VIB CNN). Both
executors train the very same round (same clients, seeds, global weights, the method's first server
payload) in this process, as one worker would: the exact path (a run's default executor) client after
client (``local.train_client``), the batched one as one group of 10 (``batched.train_group``). Rounds alternate
between the two, so a shared machine's load hits both alike. Figure: client-samples per second (median
over rounds). One line per method: ``ratio batched/exact <method> <ratio>``.

    python bench/batched_throughput.py [--methods fedavg ditto fedsam fedcr] [--rounds 3] [--threads 1]
                                       [--group 10] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fltune.config import build_config
from fltune.engine.batched import client_groups, train_group
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.local import Executor, RoundInput, train_client
from fltune.engine.rng import sample_clients
from fltune.methods import get_method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["fedavg"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker's cpus_per_worker)")
    parser.add_argument("--group", type=int, default=10, help="resources.batch_clients")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ratios = []
    for name in args.methods:
        medians = method_rates(name, args.rounds, args.group, device)
        for path, value in medians.items():
            print(f"{name} {path:8s} {value:9.0f} client-samples/s")
        ratios.append(f"ratio batched/exact {name} {medians['batched'] / medians['exact']:.2f}")
    print("\n".join(ratios))


def method_rates(name: str, rounds: int, group: int, device: torch.device) -> dict[str, float]:
    """Median client-samples/s of the exact and the batched executor on ``rounds`` timed rounds."""
    model_name = get_method(name).model_for("fmnist") or "fedavg_cnn"
    cfg = build_config(overrides=[
        "data.dataset=fmnist", "partition.kind=iid", "federation.clients=100", "federation.fraction=0.1",
        f"method.name={name}", f"model.name={model_name}", "training.local_epochs=1", "training.batch_size=50",
        "tracking.enabled=false",
    ])
    data, method = load_data(cfg), build_method(cfg)
    model = build_model_for(cfg, data).to(device)
    start = initial_state(cfg, data)
    server = method.server_payload(method.init_server_state(start))
    tensors = {k: torch.tensor(v, device=device) for k, v in start.items()}
    fed = cfg.federation

    executor = Executor.build("exact", data, device)  # a run's default executor

    def exact(inputs: RoundInput, clients: list[int]) -> None:
        for cid in clients:
            train_client(method, model, data, cid, inputs, {}, cfg.training, "none", device, tensors, executor)

    def batched(inputs: RoundInput, clients: list[int]) -> None:
        for chunk in client_groups(clients, group):
            for _ in train_group(method, model, data, chunk, inputs, {}, cfg.training, "none", device, tensors):
                pass

    rates: dict[str, list[float]] = {"exact": [], "batched": []}
    for r in range(1, rounds + 2):  # round 1 warms both up and is not timed
        clients = sample_clients(fed.seed, r, fed.clients, fed.clients_per_round)
        inputs = RoundInput(round=r, seed=fed.seed, lr=cfg.training.lr, global_state=start, server=server)
        samples = sum(len(data.client_train[c]) for c in clients)
        for path, train in (("exact", exact), ("batched", batched)):
            began = time.perf_counter()
            train(inputs, clients)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r > 1:
                rates[path].append(samples / (time.perf_counter() - began))
    return {path: statistics.median(values) for path, values in rates.items()}


if __name__ == "__main__":
    main()
