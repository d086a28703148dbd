"""The round loop: sample, broadcast, train on the actor pool, aggregate, evaluate, report to callbacks.

The engine knows no method by name (it only calls hooks) and imports neither MLflow nor Ray Tune: those
attach as callbacks. Its whole state — global weights, server state, the per-client store, the latest
local models, the history — is plain data (``state_dict``), so a checkpoint is just that.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.aggregate import WeightedSum
from fltune.engine.callbacks import Callback
from fltune.engine.local import RoundInput, evaluate, load_state
from fltune.engine.pool import WorkerPool, balance, ensure_ray, plan_workers
from fltune.engine.rng import sample_clients, use_deterministic_cuda
from fltune.engine.setup import build_method, build_model_for, initial_state, load_data
from fltune.errors import FLTuneError
from fltune.metrics.accuracy import reached_target, summarise
from fltune.metrics.cost import CostMeter, forward_flops_per_sample, parameter_count, state_bits
from fltune.metrics.curvature import client_consistency, consistency_batches, end_figures, global_curvature, probe_batches
from fltune.methods.base import Aggregate, ServerContext, State, Upload


class Federation:
    """One federated run: ``run()`` for all rounds, or ``step()`` one round at a time (Tune trainables)."""

    def __init__(
        self, cfg: ExperimentConfig, data: FederatedData | None = None, pool: WorkerPool | None = None,
    ) -> None:
        """``pool``: serve the run on a caller's client actors (kept open by ``close``) instead of starting
        ``resources.*`` of its own; results do not depend on which, only on the pool's actor count."""
        self.cfg = cfg
        self.data = data if data is not None else load_data(cfg)
        self._check_sizes()
        self.method = build_method(cfg)
        self.initial_state: State = initial_state(cfg, self.data)
        self.global_state: State = self.initial_state
        self.server_state: dict[str, Any] = self.method.init_server_state(self.global_state)
        self.client_store: dict[int, dict[str, Any]] = {}
        self.latest: dict[int, State] = {}
        self.round = 0
        self.history: list[dict[str, float]] = []
        self.status = "running"
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":  # the driver's evaluations and Hessian probes
            use_deterministic_cuda(cfg.resources.deterministic)
        self.eval_model = build_model_for(cfg, self.data).to(self.device)
        self.protocols = self._applicable_protocols()
        self.sizes = [len(idx) for idx in self.data.client_train]
        self.pool: WorkerPool | None = None
        self.shared_pool = pool
        self.run_ref: ray.ObjectRef | None = None
        self.forward_mflops = forward_flops_per_sample(self.eval_model, self.data.input_shape)
        self.cost = CostMeter(self.forward_mflops)
        self.artifacts: list[Path] = []

    # ------------------------------------------------------------------ setup
    def _check_sizes(self) -> None:
        fed = self.cfg.federation
        if fed.clients_per_round > fed.clients:
            raise FLTuneError(f"federation.fraction: {fed.fraction} of {fed.clients} clients; allowed: (0, 1]")
        empty = [c for c, idx in enumerate(self.data.client_train) if len(idx) == 0]
        if empty:
            raise FLTuneError(
                f"federation.clients: {len(empty)} of {fed.clients} clients got no training samples; "
                "allowed: fewer clients or a less skewed partition"
            )

    def _applicable_protocols(self) -> list[str]:
        """`personalized` needs per-client held-out splits (partition.eval_fraction > 0)."""
        has_eval = all(len(idx) > 0 for idx in self.data.client_eval)
        return [p for p in self.cfg.metrics.protocols if p != "personalized" or has_eval]

    def open(self) -> None:
        """Start (or join) Ray and the client actors — or take the shared pool — and bind this run to them."""
        if self.pool is None:
            pool = self.shared_pool
            if pool is None:
                ensure_ray(self.cfg.resources.address)
                pool = WorkerPool(plan_workers(self.cfg, ray.cluster_resources()))
            keep = "all_model" in self.protocols or self.cfg.metrics.hessian.clients > 0
            self.run_ref = pool.bind(self.cfg, self.data, keep_latest=keep)
            self.pool = pool

    def close(self) -> None:
        """Stop the client actors this run started (a shared pool stays up for its owner)."""
        if self.pool is not None and self.pool is not self.shared_pool:
            self.pool.shutdown()
        self.pool = self.run_ref = None

    # ------------------------------------------------------------------ loop
    def run(self, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """All remaining rounds; callbacks see every round and the end (also on failure or Ctrl-C)."""
        self.open()
        for cb in callbacks:
            cb.on_start(self)
        try:
            while self.round < self.cfg.federation.rounds and self.status == "running":
                metrics = self.step()
                for cb in callbacks:
                    cb.on_round(self, metrics)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM turned into SystemExit by Ray
            self._finish(callbacks, "killed")
            raise
        except BaseException:
            self._finish(callbacks, "failed")
            raise
        if self.status == "running":
            self.status = "finished"
        summary = self.summary()
        for cb in callbacks:
            cb.on_end(self, summary)
        return summary

    def _finish(self, callbacks: Sequence[Callback], status: str) -> None:
        self.status = status
        summary = self.summary()
        for cb in callbacks:
            cb.on_end(self, summary)

    def step(self) -> dict[str, float]:
        """One round; returns its metrics (accuracies only on evaluation rounds)."""
        self.open()
        assert self.pool is not None
        start = time.perf_counter()
        self.cost.start_round()
        r = self.round + 1
        fed, training = self.cfg.federation, self.cfg.training
        clients = sample_clients(fed.seed, r, fed.clients, fed.clients_per_round)
        inputs = RoundInput(
            round=r, seed=fed.seed, lr=training.lr * training.lr_decay ** (r - 1),
            global_state=self.global_state, server=self.method.server_payload(self.server_state),
        )
        inputs_ref = ray.put(inputs)
        shards = balance(clients, self.sizes, len(self.pool.actors))
        results = self.pool.map(self.run_ref, "train", shards, inputs_ref, per_shard=self._states_for)
        total = WeightedSum()
        uploads, states, client_metrics, latest = {}, {}, {}, {}
        for res in results:
            total.merge(res.partial)
            uploads.update(res.uploads)
            states.update(res.states)
            client_metrics.update(res.metrics)
            latest.update(res.latest)
        metrics = self._train_metrics(client_metrics)
        self._count_cost(len(clients), inputs, total, client_metrics)
        self.round = r
        if metrics["diverged"]:
            self.status = "diverged"
        else:
            self.latest.update(latest)
            self._aggregate(r, total, uploads, states, client_metrics)
        metrics["round_s"] = time.perf_counter() - start
        metrics["lr"] = inputs.lr
        metrics.update(self.cost.round_metrics())
        if self.status == "running" and (r % self.cfg.metrics.every == 0 or r == fed.rounds):
            eval_start = time.perf_counter()
            metrics.update(self.evaluate(final=r == fed.rounds))
            metrics["eval_s"] = time.perf_counter() - eval_start
        if self.status == "running" and self.cfg.metrics.hessian.due(r, fed.rounds):
            probe_start = time.perf_counter()
            metrics.update(self.curvature(r, sorted(latest)))
            metrics["hessian_s"] = time.perf_counter() - probe_start
        metrics["round"] = float(r)
        metrics.update(reached_target([*self.history, metrics], self.cfg.metrics.target_metric, self.cfg.metrics.target))
        self.history.append(metrics)
        return metrics

    def _aggregate(
        self, r: int, total: WeightedSum, uploads: dict[int, Upload], states: dict[int, dict[str, Any]],
        client_metrics: dict[int, dict[str, float]],
    ) -> None:
        """The method's server step; the run keeps what it returns, or nothing of the round when the new
        weights are not finite (the run then ends as diverged)."""
        ids = sorted(states)  # client-id order: nothing may depend on which worker returned which client
        aggregate = Aggregate(
            total.mean(), total.total_weight, {c: states[c] for c in ids}, {c: client_metrics[c] for c in ids},
            {c: uploads[c] for c in ids},
        )
        store = {**self.client_store, **aggregate.client_states}
        ctx = ServerContext(r, self.global_state, aggregate, self.server_state, store, self.cfg.federation.clients)
        update = self.method.aggregate(ctx)
        if not all(np.isfinite(v).all() for v in update.global_state.values() if v.dtype.kind == "f"):
            self.status = "diverged"
            return
        self.global_state, self.server_state = update.global_state, update.server_state
        self.client_store = {**store, **update.client_states}

    def _count_cost(self, clients: int, inputs: RoundInput, total: WeightedSum,
                    client_metrics: dict[int, dict[str, float]]) -> None:
        """Communication and compute of the round (FedAlign Tables 5 and 8)."""
        self.cost.add_download(state_bits(inputs.global_state) + state_bits(_arrays(inputs.server)), clients)
        upload = total.entry_bits()
        for cid, m in client_metrics.items():
            self.cost.add_training(int(m["samples"]), self.method.passes_per_step)
            self.cost.add_upload(upload)
        forward = [m["forward_flops"] for m in client_metrics.values() if "forward_flops" in m]
        if forward:  # counted by the workers in round 1, over every sampled client's training
            samples = sum(m["samples"] for m in client_metrics.values())
            self.cost.set_training_forward(math.fsum(forward) / 1e6 / max(samples, 1.0))

    def _states_for(self, shard: list[int]) -> dict[int, dict[str, Any]]:
        return {c: self.client_store[c] for c in shard if c in self.client_store}

    @staticmethod
    def _train_metrics(client_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
        samples = sum(m["samples"] for m in client_metrics.values())
        loss = sum(m["train_loss"] * m["samples"] for m in client_metrics.values()) / max(samples, 1.0)
        diverged = any(m["diverged"] for m in client_metrics.values()) or not math.isfinite(loss)
        return {"train_loss": loss, "samples": samples, "diverged": float(diverged)}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, final: bool = False) -> dict[str, float]:
        """Accuracy and loss under every applicable protocol (METHODS.md §0); after the last round also the
        personalised accuracy after head fine-tuning (``acc_personalized_ft``) when configured."""
        out: dict[str, float] = {}
        if "global" in self.protocols:
            out["acc_global"], out["loss"] = self._evaluate_state(self.global_state)
        if "all_model" in self.protocols:
            out["acc_all_model"], out["loss_all_model"] = self._evaluate_state(self._all_model_state())
        if "personalized" in self.protocols:
            out["acc_personalized"], out["loss_personalized"] = self._evaluate_personalized(finetune=False)
            if final and self.cfg.training.finetune_epochs:
                out["acc_personalized_ft"], out["loss_personalized_ft"] = self._evaluate_personalized(finetune=True)
        return out

    def _evaluate_state(self, state: State) -> tuple[float, float]:
        load_state(self.eval_model, state)
        correct, loss, n = evaluate(self.eval_model, self.data, self.data.test_x, self.data.test_y, self.device)
        return correct / n, loss / n

    def _all_model_state(self) -> State:
        """Average of every client's latest local model (initial model if never sampled), FedDyn-style.

        Weighted by n_k when the method weights its updates by n_k, plain mean otherwise (METHODS.md §0).
        Summed in client order on the driver, so the result is independent of the worker count.
        """
        initial = self.initial_state
        weights = [self._all_model_weight(c) for c in range(self.cfg.federation.clients)]
        total = math.fsum(weights)
        acc = {k: np.zeros(v.shape, np.float64) for k, v in initial.items()}
        for cid, weight in enumerate(weights):
            for key, value in self.latest.get(cid, initial).items():
                acc[key] += weight * value
        return {k: (acc[k] / total).astype(initial[k].dtype) for k in acc}

    def _all_model_weight(self, cid: int) -> float:
        return float(self.sizes[cid]) if self.method.weighted_by_samples else 1.0

    def _evaluate_personalized(self, finetune: bool) -> tuple[float, float]:
        """Mean over clients of each client's accuracy on its own held-out split (SimFAFL Table 2)."""
        assert self.pool is not None
        clients = list(range(self.cfg.federation.clients))
        sizes = self.sizes if finetune else [len(idx) for idx in self.data.client_eval]
        shards = balance(clients, sizes, len(self.pool.actors))
        training = self.cfg.training
        inputs = RoundInput(  # the fine-tuning stream is "round R+1", apart from every training round
            round=self.cfg.federation.rounds + 1, seed=self.cfg.federation.seed,
            lr=training.finetune_lr or training.lr, global_state=self.global_state, server={},
        )
        scores: dict[int, tuple[int, float, int]] = {}
        calls = self.pool.map(self.run_ref, "evaluate_clients", shards, ray.put(inputs), finetune,
                              per_shard=self._states_for)
        for part in calls:
            scores.update(part)
        accs = [scores[c][0] / scores[c][2] for c in clients]
        losses = [scores[c][1] / scores[c][2] for c in clients]
        return float(np.mean(accs)), float(np.mean(losses))

    # ------------------------------------------------------------------ curvature (metrics.hessian)
    def curvature(self, r: int, clients: list[int]) -> dict[str, float]:
        """Hessian metrics of the global model and, over the first k of the round's clients, H_N/H_D."""
        hcfg, seed = self.cfg.metrics.hessian, self.cfg.federation.seed
        load_state(self.eval_model, self.global_state)
        pool = np.concatenate(self.data.client_train)
        batches = probe_batches(self.data, pool, hcfg, seed, -1, self.device)
        out = global_curvature(self.eval_model, batches, hcfg, seed)
        if hcfg.clients:
            models = []
            for cid in clients[: hcfg.clients]:
                local = build_model_for(self.cfg, self.data).to(self.device)
                load_state(local, self.latest[cid])
                models.append((local, consistency_batches(self.data, cid, batches, hcfg, seed, self.device)))
            out.update(client_consistency(models, hcfg, seed))
        if r == self.cfg.federation.rounds and hcfg.landscape:
            eigen = [out[f"hessian_lambda_{i + 1}"] for i in range(hcfg.top_k)]
            folder = Path(tempfile.mkdtemp(prefix="fltune-figures-"))
            self.artifacts += end_figures(self.eval_model, batches, eigen, folder, self.cfg.method.name, hcfg, seed)
        return out

    def static_costs(self) -> dict[str, float]:
        """Per-run constants of FedAlign Table 5: forward MFLOPs per sample and parameters stored."""
        params = parameter_count(self.eval_model)
        return {"cost_forward_mflops": self.forward_mflops, "cost_params": float(params),
                "cost_stored_params": params * self.method.stored_models}

    # ------------------------------------------------------------------ results and checkpoints
    def summary(self) -> dict[str, Any]:
        """The run's final figures (keys of ``--json-out``)."""
        return summarise(self.history, self.cfg, self.status)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where the run stands."""
        return {
            "round": self.round, "global_state": self.global_state, "server_state": self.server_state,
            "client_store": self.client_store, "latest": self.latest, "history": self.history,
            "status": self.status, "cost": self.cost,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.global_state = state["global_state"]
        self.server_state = state["server_state"]
        self.client_store = state["client_store"]
        self.latest = state["latest"]
        self.history = state["history"]
        self.status = state["status"]
        self.cost = state["cost"]


def _arrays(tree: Any) -> dict[str, np.ndarray]:
    """The numpy arrays inside a server payload (for communication cost), keyed by path."""
    if isinstance(tree, np.ndarray):
        return {"": tree}
    if isinstance(tree, dict):
        return {f"{k}/{p}": a for k, v in tree.items() for p, a in _arrays(v).items()}
    return {}
