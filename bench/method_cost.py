"""What does each method cost next to FedAvg? FedAlign Table 5's columns, on one small FMNIST workload.

Workload (the same for every method): FMNIST (synthetic data when FMNIST is not installed — the ``data``
line says which), 5 % of it (stratified) split Dirichlet-prior δ = 0.5 over 20 clients (~150 training
samples each), 2 clients per round, 1 local epoch of batch 50, SGD lr 0.01 with momentum 0.9, ``--rounds``
rounds (default 6; the first is a warm-up), on one 1-CPU client worker (torch 1 thread), no evaluation
before the last round. Each method trains the model ``model.name: auto`` gives it (the FedAvg CNN; ResNet-56
for StochDepth, GradAug and FedAlign; the VIB CNN for FedCR, FedSR and SimFAFL) and is compared with FedAvg
on that same model.

Columns:

- ``s/round``: the engine's ``round_s`` (broadcast, the clients' local training on the worker,
  aggregation; no evaluation), median over the rounds after the warm-up — a round here is under a second,
  so one perturbed round (a GC pause, another process) would move a mean by tens of percent. Every method
  sees the same clients in the same rounds, so the medians compare like with like.
- ``peak MB``: the peak resident set (``VmHWM`` in ``/proc/<pid>/status``, Linux) of the run's client
  worker, a fresh Ray actor process per method, read after its last round; ``work MB`` is that peak minus
  the worker's resident set just after it started, i.e. what its work added: libraries torch loads on
  first use and the dataset (the same for every method), the model, the optimiser, the method's own
  copies, state and extra passes. Compare ``work MB`` across methods; FedAvg's is mostly the common part.
- ``fwd MFLOPs`` and ``stored M``: the engine's cost metrics (``Federation.static_costs``): one sample's
  forward pass of the model (2 FLOPs per multiply-add; FedAlign Table 5's MFLOPs are MACs, half these) and
  the parameter count × the method's declared ``stored_models``.
- ``train MFLOPs``: FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` over one client's local
  epoch run in this process by the engine's own ``train_client`` — every forward and backward pass the
  method really makes (SAM's two, MOON's three models, GradAug's sub-networks) — per training sample, for a
  client that already trained, starting from the run's final global model and server state.
- ``train fwd``: the forward passes alone of that same epoch (ops run outside autograd's backward), per
  training sample — FedAlign Table 5's MFLOPs column as the paper defines it ("the compute needs for the
  forward pass of the training process"; the paper's ResNet-56 ratios to FedAvg: MOON 3.00, StochDepth
  0.94, GradAug n = 2 1.96, FedAlign 1.02, FedProx and Mixup 1.00).

``×FedAvg`` columns divide by FedAvg on the same model. A full run over all registered methods takes about
9 minutes on a 2-core machine (the three ResNet-56 methods and their FedAvg reference are half of it).

    python bench/method_cost.py [--methods fedavg,fedprox,moon] [--rounds 6]

(from the repository root; prefix ``PYTHONPATH=.`` where the editable install does not put ``fltune`` on
the path, as for the other benchmarks).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import ray
import torch

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.data.datasets import load_dataset
from fltune.engine.builders import build_model_for, model_name, resolve_augment
from fltune.engine.federation import Federation
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.cluster import ensure_ray
from fltune.errors import DatasetMissing
from fltune.methods import METHODS
from fltune.metrics._flops import TrainingFlops

WORKLOAD = [
    "data.subsample=0.05", "partition.kind=dirichlet_prior", "partition.alpha=0.5", "federation.clients=20",
    "federation.fraction=0.1", "training.local_epochs=1", "training.batch_size=50", "training.lr=0.01",
    "training.momentum=0.9", "metrics.protocols=[global]", "metrics.every=1000", "resources.workers=1",
    "resources.cpus_per_worker=1", "tracking.enabled=false",
]


@dataclass(frozen=True)
class Cost:
    method: str
    model: str
    round_s: float
    peak_mb: float
    work_mb: float
    forward_mflops: float
    stored_params: float
    train_mflops: float
    train_forward_mflops: float


def dataset_name() -> str:
    """FMNIST when installed, else the synthetic dataset (same pipeline, 28×28 grey images)."""
    try:
        load_dataset("fmnist")
    except DatasetMissing:
        return "synthetic"
    return "fmnist"


def config(method: str, model: str, dataset: str, rounds: int) -> ExperimentConfig:
    return build_config(overrides=[*WORKLOAD, f"data.dataset={dataset}", f"method.name={method}",
                                   f"model.name={model}", f"federation.rounds={rounds}"])


def resident_mb(pid: int, field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak so far) of a process, in MB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def train_mflops_per_sample(fed: Federation) -> tuple[float, float]:
    """FLOPs of one more local epoch of a client that already trained (the run's final global model and
    server state, that client's stored state), counted pass by pass, per training sample: all of them, and
    the forward passes alone."""
    cid = min(fed.client_store) if fed.client_store else 0
    inputs = RoundInput(round=fed.round + 1, seed=fed.cfg.federation.seed, lr=fed.cfg.training.lr,
                        global_state=fed.global_state, server=fed.method.server_payload(fed.server_state))
    model = build_model_for(fed.cfg, fed.data)
    counter = TrainingFlops()
    with counter:
        trainer = Trainer.of(fed.method, model, fed.data, fed.cfg.training, torch.device("cpu"),
                             resolve_augment(fed.cfg, fed.data))
        result = train_client(trainer, cid, inputs, fed.client_store.get(cid, {}))
    per_sample = 1e6 * max(result.metrics["samples"], 1.0)
    return counter.get_total_flops() / per_sample, counter.forward_flops / per_sample


def measure(cfg: ExperimentConfig) -> Cost:
    """One method's run on a fresh worker process: its rounds, the worker's memory, the cost metrics."""
    fed = build_federation(cfg)
    try:
        fed.open()
        assert fed.pool is not None
        pid = ray.get(fed.pool.actors[0].pid.remote())  # also waits until the worker is up
        idle_mb = resident_mb(pid, "VmRSS")
        seconds = [result.metrics["round_s"] for result in fed.rounds()]
        peak_mb = resident_mb(pid, "VmHWM")
    finally:
        fed.close()
    costs = fed.static_costs()
    return Cost(cfg.method.name, model_name(cfg), statistics.median(seconds[1:] or seconds), peak_mb,
                peak_mb - idle_mb,
                costs["cost_forward_mflops"], costs["cost_stored_params"], *train_mflops_per_sample(fed))


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}" if reference > 0 else "—"


def print_table(costs: list[Cost], references: dict[str, Cost]) -> None:
    print(f"{'method':<12} {'model':<10} {'s/round':>8} {'×':>5} {'peak MB':>8} {'work MB':>8} {'×':>5} "
          f"{'fwd MFLOPs':>10} {'stored M':>9} {'train MFLOPs':>12} {'×':>5} {'train fwd':>9} {'×':>5}")
    for c in costs:
        ref = references[c.model]
        print(f"{c.method:<12} {c.model:<10} {c.round_s:8.2f} {ratio(c.round_s, ref.round_s):>5} "
              f"{c.peak_mb:8.0f} {c.work_mb:8.0f} {ratio(c.work_mb, ref.work_mb):>5} {c.forward_mflops:10.1f} "
              f"{c.stored_params / 1e6:9.2f} {c.train_mflops:12.1f} {ratio(c.train_mflops, ref.train_mflops):>5} "
              f"{c.train_forward_mflops:9.1f} {ratio(c.train_forward_mflops, ref.train_forward_mflops):>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", help="comma-separated registered methods (default: all)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per method, the first a warm-up")
    args = parser.parse_args()
    methods = args.methods.split(",") if args.methods else sorted(METHODS)
    dataset = dataset_name()
    torch.set_num_threads(1)
    ensure_ray(None)
    start = time.perf_counter()
    configs = [config(m, "auto", dataset, args.rounds) for m in methods]
    models = dict.fromkeys(model_name(cfg) for cfg in configs)
    references = {model: measure(config("fedavg", model, dataset, args.rounds)) for model in models}
    costs, failed = [], []
    for cfg in configs:
        try:
            costs.append(references[model_name(cfg)] if cfg.method.name == "fedavg" else measure(cfg))
        except Exception as err:  # one broken method must not lose the others' numbers
            failed.append(f"{cfg.method.name}: {type(err).__name__}: {err}")
    print(f"data {dataset}: 5 % over 20 clients, 2 per round, 1 local epoch, {args.rounds} rounds "
          f"(first one a warm-up), 1 worker; × = relative to FedAvg on the same model")
    print_table(costs, references)
    for line in failed:
        print(f"failed {line}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
