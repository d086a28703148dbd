"""What a job costs before it runs (``reproduce … --plan``, ``tune … --plan``, paper-scale headers).

Work in client-samples, time from a calibration (a few optimiser steps per distinct model on one worker's
share of this device) × ``passes_per_step``, divided over the workers the cluster fits. Evaluation and probes
are not counted: a lower bound of the run's order.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from fltune.config import ExperimentConfig, build_config
from fltune.data.datasets import load_dataset
from fltune.engine.builders import build_method, model_name, model_of, torch_threads
from fltune.engine.batches import epoch_samples
from fltune.engine.local import make_optimizer
from fltune.errors import DatasetMissing, FLTuneError
from fltune.methods import get_method
from fltune.text import counted

CALIBRATION_STEPS = 5
"""Timed optimiser steps per distinct model (after one warm-up step)."""


@dataclass(frozen=True)
class Work:
    """One distinct experiment of a job and how many times it runs (seeds, trials)."""

    label: str
    cfg: ExperimentConfig
    runs: int
    samples: int
    """Client-samples one run trains."""
    seconds: float
    """One run's training time on one client worker."""


@dataclass(frozen=True)
class Estimate:
    """The job's total work and wall time on the cluster it will run on."""

    work: list[Work]
    cluster: dict[str, float]
    wall_s: float
    calibration: dict[str, float]
    """'<model> B=<batch> on <device>' → seconds per training sample."""

    @property
    def samples(self) -> int:
        return sum(w.samples * w.runs for w in self.work)


def client_samples(cfg: ExperimentConfig) -> int:
    """rounds × clients per round × epochs (``Method.epochs_trained``) × the mean client's training samples
    (less its held-out share; full batches only with ``drop_last``), plus the final personal round."""
    fed, training = cfg.federation, cfg.training
    epochs = get_method(cfg.method.name).epochs_trained
    data = load_dataset(cfg.data.dataset, cfg.data.root)
    pool = len(data.train_y) + (len(data.test_y) if cfg.partition.pool_test else 0)
    per_client = pool * cfg.data.subsample * (1 - cfg.partition.eval_fraction) / fed.clients
    if training.drop_last:
        per_client = epoch_samples(round(per_client), training)
    rounds = fed.rounds * fed.clients_per_round * epochs(training.local_epochs, training.local_epochs) * per_client
    tuned = epochs(training.finetune_epochs, training.local_epochs)
    final = fed.clients * tuned * per_client if "personalized" in cfg.metrics.protocols else 0.0
    return round(rounds + final)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def calibrate(cfg: ExperimentConfig, as_built: bool = True) -> float:
    """Seconds per training sample of the run's model at its batch size on one worker's share of this machine;
    ``as_built=False`` without the method's additions (one calibration per model, for ETA weights)."""
    method = cfg.method.name if as_built else "fedavg"
    return _calibrate(model_name(cfg), json.dumps(cfg.model.options, sort_keys=True), method,
                      cfg.data.dataset, cfg.data.root, cfg.training.batch_size, cfg.resources.cpus_per_worker)


@lru_cache(maxsize=None)
def _calibrate(model: str, options: str, method: str, dataset: str, root: str | None, batch: int,
               cpus: float) -> float:
    data = load_dataset(dataset, root)
    shape = tuple(data.train_x.shape[1:])
    cfg = build_config({"data": {"dataset": dataset, "root": root}, "method": {"name": method},
                        "model": {"name": model, "options": json.loads(options)}})
    dev = device()
    with torch_threads(int(cpus)):
        net = model_of(cfg, shape, data.num_classes).to(dev)
        optimizer = make_optimizer(list(net.parameters()), cfg.training, 1e-3)  # the engine's own step
        x = torch.randn(batch, *shape, device=dev)
        y = torch.randint(0, data.num_classes, (batch,), device=dev)
        start = 0.0
        for step in range(CALIBRATION_STEPS + 1):
            if step == 1:  # the first step warms up allocators and kernels
                _sync(dev)
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        _sync(dev)
        return (time.perf_counter() - start) / (CALIBRATION_STEPS * batch)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def work(label: str, tree: dict[str, Any], runs: int, as_built: bool = True) -> Work:
    """A distinct experiment: its client-samples and one run's seconds on one worker."""
    cfg = build_config(tree)
    _data_here(cfg)
    samples = client_samples(cfg)
    # the method's, not its class's: GradAug's grows with its n; one when undeclared (the plan says so)
    passes = getattr(build_method(cfg), "passes_per_step", 1.0)
    return Work(label, cfg, runs, samples, samples * passes * calibrate(cfg, as_built))


def _data_here(cfg: ExperimentConfig) -> None:
    """The run's data is here; a plan fetches nothing, so data to download is named as such, not missing."""
    try:
        load_dataset(cfg.data.dataset, cfg.data.root)
    except DatasetMissing:
        if not cfg.data.download:
            raise
        raise FLTuneError(f"--plan: data.dataset {cfg.data.dataset} is not here yet; data.download fetches it when "
                          "the job runs, and a plan fetches nothing: run the job, or get the data first") from None


def run_seconds(items: list[tuple[str, dict[str, Any], int]], as_built: bool = True) -> dict[str, float]:
    """Each of ``items`` (label, tree, runs): one run's estimated seconds on one worker."""
    return {label: work(label, tree, runs, as_built).seconds for label, tree, runs in items}


def longest_first(seconds: dict[str, float]) -> list[str]:
    """The labels of ``seconds``, longest first, ties in given order (Graham's LPT rule: a long trial started
    last would set the job's end)."""
    return sorted(seconds, key=lambda label: -seconds[label])


def cluster_resources(address: str | None) -> dict[str, float]:
    """The cluster a job will run on: the one at ``address`` (joined, nothing created), else this machine."""
    if address:
        import ray

        from fltune.engine.cluster import ensure_ray

        ensure_ray(address)
        return dict(ray.cluster_resources())
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def estimate(items: list[tuple[str, dict[str, Any], int]], cluster: dict[str, float],
             max_concurrent: int | None = None) -> Estimate:
    """``items``: (label, tree, runs); equal trees are one. Wall time: the work over the CPU slots (runs at
    once × ``min(workers, clients per round)``) or the GPUs, never below the longest run."""
    seen: dict[str, Work] = {}
    for label, tree, runs in items:
        key = json.dumps(tree, sort_keys=True, default=str)
        if key not in seen:
            seen[key] = work(label, tree, runs)
    jobs = list(seen.values())
    total = math.fsum(w.seconds * w.runs for w in jobs)
    per_run = [_parallel(w.cfg, cluster) for w in jobs]
    longest = max((w.seconds / p for w, p in zip(jobs, per_run)), default=0.0)
    if device().type == "cuda":
        slots = max(1.0, cluster.get("GPU", 1.0))
    else:
        cpus_per_worker = jobs[0].cfg.resources.cpus_per_worker if jobs else 1.0  # the same for every cell
        workers_fit = max(1, int(max(1.0, cluster.get("CPU", 1.0)) // cpus_per_worker))
        at_once = max(1, workers_fit // max(per_run, default=1))
        if max_concurrent:
            at_once = min(at_once, max_concurrent)
        slots = min(workers_fit, at_once * max(per_run, default=1))
    calibration = {f"{model_name(w.cfg)} B={w.cfg.training.batch_size} on {device().type}": calibrate(w.cfg)
                   for w in jobs}
    return Estimate(jobs, cluster, max(total / slots, longest), calibration)


def _parallel(cfg: ExperimentConfig, cluster: dict[str, float]) -> int:
    """Client workers one run trains on at once (``plan_workers``' default: as many as CPUs allow)."""
    res = cfg.resources
    workers = res.workers or max(1, int(cluster.get("CPU", 1.0) // res.cpus_per_worker))
    return max(1, min(workers, cfg.federation.clients_per_round))


def duration(seconds: float) -> str:
    """'42 s', '17 min', '3.4 h', '2.1 days'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def count(samples: float) -> str:
    """'820', '31.5k', '24.5M', '1.2G' client-samples."""
    for factor, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if samples >= factor:
            return f"{samples / factor:.1f}{unit}"
    return f"{samples:.0f}"


def summary(est: Estimate) -> str:
    """One line: total client-samples, estimated wall time, on what."""
    if not est.work:
        return "estimate: nothing to train here (no run has its data; see above)"
    gpus = est.cluster.get("GPU", 0.0)
    where = f"{est.cluster.get('CPU', 0):g} CPUs" + (f" + {gpus:g} GPU(s)" if gpus else "")
    speeds = "; ".join(f"{k}: {v * 1e3:.3f} ms/sample" for k, v in est.calibration.items())
    return (f"estimate: {count(est.samples)} client-samples to train, ~{duration(est.wall_s)} wall on {where} "
            f"(training only; calibrated {speeds})")


def settings(cfg: ExperimentConfig) -> str:
    """The settings that set a run's cost and its optimiser, as the plan lists them."""
    fed, t = cfg.federation, cfg.training
    final = f" + final {t.finetune_epochs} ep" if t.finetune_epochs else ""
    clip = (f", clip {t.grad_clip:g}" if t.grad_clip else "") + (", drop last" if t.drop_last else "")
    return (f"{cfg.method.name} · {model_name(cfg)} · {counted(fed.rounds, 'round')} × "
            f"{'~' if fed.sampling == 'bernoulli' else ''}{fed.clients_per_round}/{fed.clients} clients × "
            f"E {t.local_epochs}{final} · B {t.batch_size}, "
            f"{t.optimizer} lr {t.lr:g} mom {t.momentum:g}{clip}")


@dataclass
class Plan:
    """What a job would run and its cost (``--plan``, ``plan=True`` in Python): ``estimate`` holds the figures,
    ``str(plan)`` the text the command prints."""

    title: str
    estimate: Estimate
    notes: list[str]

    @classmethod
    def of(cls, title: str, items: list[tuple[str, dict[str, Any], int]], address: str | None,
           max_concurrent: int | None, notes: list[str]) -> Plan:
        """What would run and its cost, running nothing; the job's data checks come first."""
        from fltune.preflight import check_data

        est = estimate(items, cluster_resources(address), max_concurrent)
        check_data(w.cfg for w in est.work)
        return cls(title, est, notes)

    def lines(self) -> list[Any]:
        """What ``--plan`` prints, in order: a table of each distinct experiment (its settings, runs,
        client-samples, time), the notes, the one-line summary."""
        from rich.table import Table

        table = Table(title=self.title)
        for i, column in enumerate(("run", "settings", "× runs", "client-samples", "est. (1 worker)")):
            table.add_column(column, justify="left" if i < 2 else "right")  # names left, figures right
        for w in self.estimate.work:
            table.add_row(w.label, settings(w.cfg), str(w.runs), count(w.samples * w.runs),
                          duration(w.seconds * w.runs))
        return [table, *self.notes, summary(self.estimate)]

    def print(self) -> int:
        """``--plan``'s output; exit status 0."""
        from fltune.tracking.progress import listing

        listing.print(*self.lines(), sep="\n", highlight=False)
        return 0

    def __str__(self) -> str:
        """The text ``print()`` shows, at the width of the terminal it would go to."""
        from rich.console import Console

        from fltune.tracking.progress import listing

        out = Console(width=listing.width, record=True, file=io.StringIO())
        out.print(*self.lines(), sep="\n", highlight=False)
        return out.export_text()
