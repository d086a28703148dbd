"""Training throughput of fltune's client executors against the unbatched physical limit (issue 12).

Workloads (FMNIST, 100 clients, 10 per round):
  W1  FedAvg, FedAvg CNN, Dirichlet 0.5, E = 5, B = 50.
  W2  SimFAFL, VIB CNN, SimFAFL Table 2's FMNIST non-IID2 cell at paper settings (E = 10, B = 48, SGD
      momentum 0, clip 10, lr 0.05: ``fltune/reproduce/papers/simfafl.py``).
Figure: training client-samples per second, the median over the timed rounds (warm-up rounds dropped; no
evaluation runs: ``metrics.protocols=[]``). Rows, in one run on the same device:
  B0         a tight single-process eager loop with the data already normalised on the device, the
             method's own loss (``Method.backward``), a fresh SGD per client, a float64 weight average:
             what training clients one after another can reach at best;
  reference  ``resources.executor=reference`` (the loop before the fast path) on the Ray worker pool;
  exact      ``resources.executor=exact`` (the default; bit-identical to reference);
  batched    ``resources.executor=batched`` (K clients at once with torch.func).
Last lines: ``ratio <path>/B0 <workload> <x>`` and ``ratio exact/reference <workload> <x>`` (each when both
rows ran). ``--paths`` picks the rows, ``--set KEY=VALUE`` changes every row's config (B0 takes its data and
training settings from it too: ``data.root``, ``training.batch_size``; the fltune rows also e.g. a resources
variant such as ``resources.deterministic=false``, ``resources.batch_clients=5`` or, with ``--paths B0 batched``,
``resources.compile=true``).

On a GPU the defaults are the issue's (3 warm-up rounds, 20 timed, full data); on CPU they are small
(1 warm-up, 3 timed, 10 % of the data: ~60 samples a client) so a run takes minutes.

    python bench/gpu_throughput.py [--workloads W1 W2] [--paths B0 exact ...] [--set KEY=VALUE ...]
                                   [--rounds N] [--warmup N] [--scale F] [--b0-threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import typing
from collections.abc import Callable

import torch

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, ResourcesConfig, build_config
from fltune.data.augment import to_float
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.rng import derive_seed, round_clients
from fltune.errors import FLTuneError
from fltune.methods.base import ClientContext
from fltune.reproduce.papers.simfafl import ROWS, SCALES, cell

WORKLOADS: dict[str, Callable[[], dict[str, typing.Any]]] = {
    "W1": lambda: {
        "method.name": "fedavg", "model.name": "fedavg_cnn", "partition.kind": "dirichlet_prior",
        "partition.alpha": 0.5, "training.local_epochs": 5, "training.batch_size": 50,
    },
    "W2": lambda: {
        **SCALES["paper"].settings, **cell("SimFAFL", "fmnist", "non-IID2", None, ROWS["SimFAFL"]).settings,
    },
}
COMMON = {"data.dataset": "fmnist", "federation.clients": 100, "federation.fraction": 0.1,
          "metrics.protocols": [], "tracking.enabled": False}


def workload_config(
    name: str, rounds: int, scale: float, executor: str = "exact", extra: tuple[str, ...] = (),
) -> ExperimentConfig:
    """The workload's config for one row; ``extra`` are ``KEY=VALUE`` overrides applied last."""
    settings = {**WORKLOADS[name](), **COMMON, "federation.rounds": rounds, "data.subsample": scale,
                "resources.executor": executor}
    return build_config(overrides=[*(f"{key}={json.dumps(value)}" for key, value in settings.items()), *extra])


def executors() -> list[str]:
    """The executor names the config accepts: the fltune rows."""
    return list(typing.get_args(ResourcesConfig.model_fields["executor"].annotation))


def fltune_rates(cfg: ExperimentConfig, data: FederatedData) -> list[float]:
    """Client-samples per second of every round run by the engine (the round's own training time)."""
    fed = build_federation(cfg, data)
    try:
        return [result.metrics["samples"] / result.metrics["round_s"] for result in fed.rounds()]
    finally:
        fed.close()


def b0_rates(cfg: ExperimentConfig, data: FederatedData, device: torch.device, threads: int) -> list[float]:
    """The same rounds' clients in one process: data normalised on ``device`` once, each client's epochs
    of the method's own backward and a plain SGD step, weights averaged in float64 on the device."""
    torch.set_num_threads(threads)
    method, model = build_method(cfg), build_model_for(cfg, data).to(device)
    pool_x = to_float(data.x.to(device), data.mean, data.std)
    pool_y = data.y.to(device)
    global_state = {k: torch.tensor(v, device=device) for k, v in initial_state(cfg, data).items()}
    fed, tr = cfg.federation, cfg.training
    rates = []
    for r in range(1, fed.rounds + 1):
        start, samples = time.perf_counter(), 0
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        clients = round_clients(fed, r)
        for cid in clients:
            torch.manual_seed(derive_seed(fed.seed, r, cid))
            model.load_state_dict(global_state)
            idx = torch.as_tensor(data.client_train[cid], device=device)
            opt = torch.optim.SGD(model.parameters(), lr=tr.lr, momentum=tr.momentum)
            ctx = ClientContext(client_id=cid, model=model, global_state=global_state, state={},
                                num_samples=len(idx), epochs=tr.local_epochs, lr=tr.lr, device=device,
                                batches=lambda: iter(()))
            method.setup_client(ctx)
            for _ in range(tr.local_epochs):
                order = idx[torch.randperm(len(idx), device=device)]
                for s in range(0, len(order), tr.batch_size):
                    chunk = order[s:s + tr.batch_size]
                    opt.zero_grad(set_to_none=True)
                    method.backward(ctx, pool_x[chunk], pool_y[chunk])
                    if tr.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip)
                    opt.step()
                    samples += len(chunk)
            for k, v in model.state_dict().items():
                total[k] += len(idx) * v.double()
        weight = sum(len(data.client_train[c]) for c in clients)
        global_state = {k: (v / weight).to(global_state[k].dtype) for k, v in total.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(samples / (time.perf_counter() - start))
    return rates


def row_rate(
    path: str, cfg: ExperimentConfig, data: FederatedData, warmup: int, device: torch.device, b0_threads: int,
) -> float:
    """One row's figure: the median client-samples/s of ``cfg``'s rounds after the ``warmup`` first."""
    rates = b0_rates(cfg, data, device, b0_threads) if path == "B0" else fltune_rates(cfg, data)
    return statistics.median(rates[warmup:])


def main() -> None:
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=20 if gpu else 3, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=3 if gpu else 1)
    parser.add_argument("--scale", type=float, default=1.0 if gpu else 0.1, help="data.subsample")
    parser.add_argument("--b0-threads", type=int, default=os.cpu_count() or 1,
                        help="B0's torch threads (on a shared CPU, 1 avoids threads spinning on each other)")
    parser.add_argument("--paths", nargs="+", default=["B0", *executors()], choices=["B0", *executors()],
                        help="rows to run (default all)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every row (B0: its data and training settings), repeatable")
    args = parser.parse_args()
    executors_run = [p for p in args.paths if p != "B0"] or ["exact"]
    try:  # a bad --set fails here, in one line, before any row runs (checked with each fltune row's executor)
        for name in args.workloads:
            for path in executors_run:
                workload_config(name, 1, args.scale, path, tuple(args.overrides))
    except FLTuneError as err:
        parser.error(str(err))
    device = torch.device("cuda" if gpu else "cpu")
    print(f"device {device}; {args.warmup} warm-up + {args.rounds} timed rounds; data.subsample {args.scale}; "
          f"rows: {' '.join(args.paths)}; overrides: {' '.join(args.overrides) or 'none'}")
    ratios = []
    for name in args.workloads:
        cfg = workload_config(name, args.warmup + args.rounds, args.scale, executors_run[0], tuple(args.overrides))
        data = load_data(cfg)
        figures = {}
        for path in args.paths:
            row_cfg = cfg if path == "B0" else workload_config(
                name, args.warmup + args.rounds, args.scale, path, tuple(args.overrides))
            figures[path] = row_rate(path, row_cfg, data, args.warmup, device, args.b0_threads)
            print(f"{name} {path:<10} {figures[path]:10.0f} client-samples/s", flush=True)
        ratios += [f"ratio {path}/B0 {name} {rate / figures['B0']:.3f}"
                   for path, rate in figures.items() if path != "B0" and "B0" in figures]
        if "exact" in figures and "reference" in figures:
            ratios.append(f"ratio exact/reference {name} {figures['exact'] / figures['reference']:.3f}")
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
