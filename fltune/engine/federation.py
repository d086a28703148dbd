"""The round loop: sample, broadcast, train on the pool's workers, aggregate, run the round probes.
``Federation.rounds`` is the package's one round loop: it yields a :class:`RoundResult` per round, which ``run`` hands
to callbacks and a Tune trial reports and checkpoints (its seeds in :func:`lockstep`). Measurements are probes
(``engine.probes``) whose heavy parts run on the workers of a :class:`~fltune.engine.dispatch.Pool`: the loop imports no
Ray, MLflow or Tune, and knows no method by name. Its state is plain data (``state_dict``); client states and latest
local models live in client stores on disk (engine/store.py), checkpointed as a log version."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from fltune.config import ExperimentConfig
from fltune.data.datasets import release_loaded
from fltune.data.federated import FederatedData
from fltune.engine.aggregate import WeightedSum
from fltune.engine.batched import client_groups
from fltune.engine.builders import initial_state, save_model
from fltune.engine.callbacks import Callback
from fltune.engine.dispatch import Pool, balance, deal
from fltune.engine.evaluation import batch_scores, eval_batch_count, total_scores
from fltune.engine.executors import Executor
from fltune.engine.transfer import RoundInput, load_state
from fltune.engine.probes import Probe, ProbeTask, RoundView, RunView
from fltune.engine.rng import round_clients, use_deterministic_cuda
from fltune.engine.store import ClientStore, WithRound
from fltune.errors import FLTuneError
from fltune.engine.worker import RunSpec
from fltune.methods import is_personalised
from fltune.methods.base import Aggregate, Method, ServerContext, State, Upload, client_model

T = TypeVar("T")

EVAL_CLIENTS = 256
"""Clients a personalised evaluation sends out at once: the states held in memory together."""


@dataclass(frozen=True)
class RoundResult:
    """One round as the loop yields it: its number, the run's status after it, and its metrics."""

    round: int
    status: str
    """running, or the run's end: finished (this was the last round) or diverged."""
    metrics: dict[str, float]


class Federation:
    """One federated run: ``rounds()`` yields each round's result, ``run()`` hands them to callbacks."""

    def __init__(
        self, cfg: ExperimentConfig, data: FederatedData, method: Callable[[], Method],
        model: Callable[[FederatedData], nn.Module], executor: Executor, pool: Pool | Callable[[], Pool],
        probes: Callable[[RunView], Sequence[Probe]] | None = None, folder: Path | None = None,
    ) -> None:
        """The run's parts, chosen where it is assembled (``fltune.assembly``); ``cfg`` gives its settings. ``method``
        and ``model`` build the method and the model of ``data``, here and on each worker (picklable); ``executor``
        trains on the workers. ``pool``: a caller's pool (left up by ``close``) or what starts the run's own
        (stopped by ``close``); results do not depend on which. ``probes``: builds the probes once data and
        evaluation model exist. ``folder``: the client stores' files (a Tune trial's storage, found on restart);
        None: a temporary one."""
        self.cfg, self.data, self.executor, self.build_method, self.build_model = cfg, data, executor, method, model
        self.method = method()
        self.initial_state: State = initial_state(cfg, data, model)
        self.global_state: State = self.initial_state
        self.server_state: dict[str, Any] = self.method.init_server_state(self.global_state)
        fed = cfg.federation
        self.client_store = ClientStore(fed.clients, folder and folder / "clients", cache=fed.clients_per_round)
        self.latest = ClientStore(fed.clients, folder and folder / "latest", cache=fed.clients_per_round)
        """Each client's latest local model, for probes that ``keeps_local_models``."""
        self.round = 0
        self.history: list[dict[str, float]] = []
        self.status = "running"
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":  # evaluating a closed run (no workers) runs on the driver
            use_deterministic_cuda(cfg.resources.deterministic)
        self.eval_model = model(data).to(self.device)
        self.sizes = [len(idx) for idx in self.data.client_train]
        self.pool: Pool | None = None if callable(pool) else pool
        self.start_pool = pool if callable(pool) else None
        self.run_ref: Any = None
        """The pool's handle of this run while it is open (``Pool.bind``); None: not open."""
        self.val_ref: Any = None
        self.artifacts: list[Path] = []
        """Files the probes wrote (end-of-run figures), for the tracking callbacks."""
        self.view = RunView(cfg, self.method, self.eval_model, self.initial_state, self.sizes, self.history, self.latest,
                            self.artifacts, self.evaluate_state, self.evaluate_personalized, self.compute)
        """What the probes read of this run."""
        self.probes: list[Probe] = list(probes(self.view)) if probes else []
        self.callbacks: Sequence[Callback] = ()
        """The callbacks of the ``run`` in progress (told as each probe starts)."""

    # ------------------------------------------------------------------ setup
    def open(self) -> None:
        """Start the run's own workers, or take the caller's, and bind this run to them."""
        if self.run_ref is None:
            if self.pool is None:
                assert self.start_pool is not None
                self.pool = self.start_pool()
            keep = any(probe.keeps_local_models for probe in self.probes)
            self.run_ref, self.data = self.pool.bind(self.spec(self.data, keep))  # the workers' copy

    def close(self) -> None:
        """Stop the workers this run started (a caller's pool stays up for its owner)."""
        if self.start_pool is not None and self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        self.run_ref = self.val_ref = None

    # ------------------------------------------------------------------ loop
    def rounds(self) -> Iterator[RoundResult]:
        """Every remaining round, until the last one or a divergence."""
        self.open()
        while self.round < self.cfg.federation.rounds and self.status == "running":
            metrics = self.step()
            yield RoundResult(self.round, self.status, metrics)

    def run(self, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """All remaining rounds; callbacks see every round and the end (also on failure or Ctrl-C)."""
        self.open()
        self.callbacks = callbacks
        for cb in callbacks:
            cb.on_start(self)
        try:
            for result in self.rounds():
                for cb in callbacks:
                    cb.on_round(self, result.metrics)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM turned into SystemExit by Ray
            self._finish(callbacks, "killed")
            raise
        except BaseException as err:
            cause = getattr(err, "cause", None)  # a worker's error inside Ray's, whose text is the remote traceback
            error = cause if isinstance(cause, BaseException) else err  # as its author raised it
            self._finish(callbacks, "failed", f"{type(error).__name__}: {error}")
            raise
        if self.status == "running":  # restored from a checkpoint taken before the end was marked
            self.status = "finished"
        return self._finish(callbacks, self.status)

    def _finish(self, callbacks: Sequence[Callback], status: str, error: str | None = None) -> dict[str, Any]:
        """End the run as ``status``; a failure's ``error`` goes to the callbacks in the summary."""
        self.status = status
        summary = self.summary() | ({"error": error} if error else {})
        for cb in callbacks:
            cb.on_end(self, summary)
        return summary

    def step(self) -> dict[str, float]:
        """One round (the body of ``rounds``); returns its metrics (accuracies only on evaluation rounds)."""
        self.open()
        assert self.pool is not None
        start = time.perf_counter()
        for probe in self.probes:
            probe.start_round()
        r = self.round + 1
        fed, training = self.cfg.federation, self.cfg.training
        clients = round_clients(fed, r)
        inputs = RoundInput(
            round=r, seed=fed.seed, lr=training.lr_at(r),
            global_state=self.global_state, server=self.method.server_payload(self.server_state),
        )
        meters = [build for probe in self.probes if (build := probe.client_meter(r)) is not None]
        shards = balance(clients, self.sizes, self.pool.width(), self.executor.group)  # whole groups per worker
        results = self.pool.map(self.run_ref, "train", shards, inputs, meters, per_shard=self._states_for)
        total = WeightedSum()
        uploads, states, client_metrics, latest = {}, {}, {}, {}
        for res in results:
            total.merge(res.summed())
            uploads.update(res.uploads)
            states.update(res.states)
            client_metrics.update(res.metrics)
            latest.update(res.local_models())
        metrics = self._train_metrics(client_metrics)
        self.round = r
        if metrics["diverged"]:
            self.status = "diverged"
        else:
            self.latest.update(latest)
            self._aggregate(r, total, uploads, states, client_metrics)
        metrics["round_s"] = time.perf_counter() - start
        metrics["lr"] = inputs.lr
        metrics["round"] = float(r)
        view = RoundView(
            run=self.view, round=r, clients=tuple(clients), running=self.status == "running", inputs=inputs,
            global_state=self.global_state, local_models=latest, client_metrics=client_metrics,
            upload_bits=total.entry_bits(), metrics=metrics,
        )
        self._probe(view, metrics)
        if self.status == "running" and r == fed.rounds:
            self.status = "finished"
        self.history.append(metrics)
        return metrics

    def _aggregate(
        self, r: int, total: WeightedSum, uploads: dict[int, Upload], states: dict[int, dict[str, Any]],
        client_metrics: dict[int, dict[str, float]],
    ) -> None:
        """The method's server step; all or nothing: non-finite new weights keep nothing and end as diverged."""
        ids = sorted(states)  # client-id order: nothing may depend on which worker returned which client
        aggregate = Aggregate(
            total.mean(), total.total_weight, {c: states[c] for c in ids}, {c: client_metrics[c] for c in ids},
            {c: uploads[c] for c in ids},
        )
        store = WithRound(self.client_store, aggregate.client_states)
        ctx = ServerContext(r, self.global_state, aggregate, self.server_state, store, self.cfg.federation.clients)
        update = self.method.aggregate(ctx)
        if not all(np.isfinite(v).all() for v in update.global_state.values() if v.dtype.kind == "f"):
            self.status = "diverged"
            return
        self.global_state, self.server_state = update.global_state, update.server_state
        self.client_store.update({**aggregate.client_states, **update.client_states})

    def _probe(self, view: RoundView, metrics: dict[str, float]) -> None:
        """Run the due probes in order, each adding its figures (and its time to its clock) to ``metrics``."""
        for probe in self.probes:
            if probe.due(view):
                for cb in self.callbacks:
                    cb.on_probe(self, view.round, probe.name)
                probe_start = time.perf_counter()
                metrics.update(probe.measure(view))
                if probe.clock:
                    metrics[probe.clock] = metrics.get(probe.clock, 0.0) + time.perf_counter() - probe_start

    def _states_for(self, shard: list[int]) -> dict[int, dict[str, Any]]:
        return {c: self.client_store[c] for c in shard if c in self.client_store}

    @staticmethod
    def _train_metrics(client_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
        samples = sum(m["samples"] for m in client_metrics.values())
        loss = sum(m["train_loss"] * m["samples"] for m in client_metrics.values()) / max(samples, 1.0)
        diverged = any(m["diverged"] for m in client_metrics.values()) or not math.isfinite(loss)
        return {"train_loss": loss, "samples": samples, "diverged": float(diverged)}

    # ------------------------------------------------------------------ evaluation services (for probes)
    def evaluate_state(self, state: State, split: str = "test") -> tuple[float, float]:
        """(accuracy, mean loss) of ``state`` on the pooled test set, or with ``split="val"`` the union of the
        clients' validation splits. While open, on the workers in contiguous shards of batches, scores summed
        in batch order: the same numbers as one process, whatever the worker count."""
        n = len(self.data.split(split)[1])
        if n == 0:  # metrics.test: false holds no test data: reading it is a bug, never a score
            raise FLTuneError(f"this run has no {split} data to evaluate on")
        batches = list(range(eval_batch_count(n)))
        if self.run_ref is None:
            load_state(self.eval_model, state)
            scores = batch_scores(self.eval_model, self.data, *self.data.split(split), self.device, batches)
        else:
            workers = self.pool.width()
            shards = [batches[len(batches) * i // workers:len(batches) * (i + 1) // workers] for i in range(workers)]
            parts = self.pool.map(self.run_ref, "evaluate_split", shards, state, split)
            scores = [score for part in parts for score in part]
        correct, loss, _ = total_scores(scores, n)
        return correct / n, loss / n

    def evaluate_personalized(self, finetune: bool, split: str = "test") -> tuple[list[float], list[float]]:
        """Each client's accuracy and mean loss, in client order, on its own held-out split (SimFAFL Table 2), or
        its validation split with ``split="val"``; with ``finetune`` after its final personal round. Clients go
        out ``EVAL_CLIENTS`` at a time, bounding the states read from the store at once."""
        assert self.pool is not None
        clients = list(range(self.cfg.federation.clients))
        run_ref = self.run_ref if split == "test" else self._validation_run()
        held_out = self.data.client_eval if split == "test" else self.data.client_val
        sizes = self.sizes if finetune else [len(idx) for idx in held_out]
        group = self.executor.group if finetune else 1  # a final round's groups whole
        training = self.cfg.training
        final = self.cfg.federation.rounds + 1  # fine-tuning draws as "round R+1", apart from training's
        inputs = RoundInput(round=final, seed=self.cfg.federation.seed, lr=training.finetune_lr or training.lr_at(final),
                            global_state=self.global_state, server={})
        scores: dict[int, tuple[int, float, int]] = {}
        for chunk in client_groups(clients, -(-EVAL_CLIENTS // group) * group):  # whole groups in each
            shards = balance(chunk, sizes, self.pool.width(), group)
            for part in self.pool.map(run_ref, "evaluate_clients", shards, inputs, finetune,
                                      per_shard=self._states_for):
                scores.update(part)
        return [scores[c][0] / scores[c][2] for c in clients], [scores[c][1] / scores[c][2] for c in clients]

    def _validation_run(self) -> Any:
        """This run bound again, on first use, with the validation splits as ``client_eval``."""
        assert self.pool is not None
        if self.val_ref is None:
            self.val_ref, _ = self.pool.bind(self.spec(self.data.val_as_eval(), keep_latest=False))
        return self.val_ref

    def spec(self, data: FederatedData, keep_latest: bool) -> RunSpec:
        """This run on ``data`` as the workers receive it: settings and parts."""
        return RunSpec(self.cfg, data, self.build_method, self.build_model, self.executor, keep_latest)

    def compute(self, tasks: Sequence[ProbeTask[T]]) -> list[T]:
        """Probe computations spread over the workers (and their GPUs) at once; results in task order. A task
        depends on the run's config, data and its arguments alone, so not on which worker ran it."""
        self.open()
        assert self.pool is not None
        return deal(self.pool, self.run_ref, tasks)

    def static_costs(self) -> dict[str, float]:
        """The run's constants from the probes that declare some (FedAlign Table 5)."""
        return {k: v for probe in self.probes for k, v in probe.run_constants(self.view).items()}

    # ------------------------------------------------------------------ results and checkpoints
    def summary(self) -> dict[str, Any]:
        """The run's final figures (``--json-out``): each probe's ``summary``, then the loop's totals;
        ``wall_s`` counts the rounds and the probes' clocks ``in_wall``."""
        history = self.history
        round_s = sum(row["round_s"] for row in history)
        samples = sum(row["samples"] for row in history)
        clocks = {probe.clock for probe in self.probes if probe.clock and probe.in_wall}
        summary = {key: value for probe in self.probes for key, value in probe.summary(self.view).items()}
        summary.update(
            rounds=int(history[-1]["round"]) if history else 0,
            wall_s=sum(row["round_s"] + sum(row.get(clock, 0.0) for clock in clocks) for row in history),
            round_s_mean=round_s / len(history) if history else None,
            samples_per_s=samples / round_s if round_s else None,
            status=self.status,
        )
        if self.status == "diverged":
            summary["diverged_round"] = summary["rounds"]
        return summary

    def save_model(self, folder: Path) -> Path:
        """The run's weights into ``folder`` (``builders.MODEL_FILES``): the global model, and each client's own
        weights, those of its client model (``client_model``) that are not the global ones. Only a
        personalised method's client states are read: another's (SCAFFOLD's control variates) hold no model."""
        personal = {}
        for cid in range(self.cfg.federation.clients) if is_personalised(type(self.method)) else ():
            if cid in self.client_store:
                state = client_model(self.global_state, self.client_store[cid])
                own = {key: value for key, value in state.items() if value is not self.global_state.get(key)}
                if own:
                    personal[cid] = own
        return save_model(folder, self.data, self.global_state, personal)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly; client stores commit their changes, the state holds the version."""
        return {
            "round": self.round, "global_state": self.global_state, "server_state": self.server_state,
            "client_store": self.client_store.commit(self.round), "latest": self.latest.commit(self.round),
            "history": self.history,
            "status": self.status,
            **{probe.name: probe.state_dict() for probe in self.probes if probe.state_dict() is not None},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("round", "global_state", "server_state", "status"):
            setattr(self, key, state[key])
        self.history[:] = state["history"]  # in place: the probes' view reads this list
        self.client_store.restore(state["client_store"])
        self.latest.restore(state["latest"])
        for probe in self.probes:
            if probe.name in state:
                probe.load_state_dict(state[probe.name])


def open_all(feds: Sequence[Federation]) -> None:
    """Open every federation, then drop the loader's cached datasets: ``open`` puts each in Ray's object store and uses
    that copy; the cache would keep the private one alive. Built first, so a trial's seeds share one load."""
    for fed in feds:
        fed.open()
    release_loaded()


def lockstep(feds: Sequence[Federation]) -> Iterator[list[RoundResult]]:
    """Several federations' round loops (a trial's seeds), one round of each per item, until one ends."""
    for results in zip(*(fed.rounds() for fed in feds)):
        yield list(results)
        if any(result.status != "running" for result in results):
            return
