"""The round loop against a real local Ray: determinism, worker failure, divergence, checkpoints."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from functools import partial

import numpy as np
import pytest
import ray
import torch

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.engine.batched import unbatchable
from fltune.engine.builders import build_model_for, load_data
from fltune.engine.callbacks import Callback
from fltune.data.datasets import load_dataset
from fltune.engine.federation import Federation, lockstep, open_all
from fltune.engine.evaluation import evaluate
from fltune.engine.executors import OneByOne
from fltune.engine.probes import Probe, RoundView, RunView
from fltune.engine.transfer import load_state
from fltune.engine.pool import WorkerPool
from fltune.engine.rng import round_clients
from fltune.methods import get_method
from fltune.methods.base import client_model
from fltune.tune.trainable import read_states, write_states
from tests.conftest import needs_fmnist, storages
from tests.engine.test_executor_exact import assert_same, tiny_config
from tests.methods.test_contract import each_method

BASE = [  # a quarter of synthetic (150 samples a client): the same paths, ~3× faster
    "data.dataset=synthetic", "data.subsample=0.25", "partition.kind=dirichlet_prior",
    "partition.eval_fraction=0.2", "federation.clients=10", "federation.fraction=0.4", "federation.rounds=2",
    "training.local_epochs=1", "training.batch_size=32", "training.lr=0.05", "tracking.enabled=false",
]


def federation(*extra: str, pool: WorkerPool | None = None) -> Federation:
    """A run on ``pool``'s actors, or on client actors of its own (``resources.*``)."""
    return build_federation(build_config(overrides=[*BASE, *extra]), pool=pool)


def run(fed: Federation, callbacks=()) -> Federation:
    try:
        fed.run(callbacks)
    finally:
        fed.close()
    return fed


def same_weights(a: Federation, b: Federation) -> bool:
    return all(a.global_state[k].tobytes() == b.global_state[k].tobytes() for k in a.global_state)


@pytest.mark.extended  # the suite's test_every_method_gives_the_same_run_on_one_worker_or_two_and_resumed[fedavg]
def test_one_and_two_workers_give_identical_runs(pools):
    one = run(federation("resources.workers=1", pool=pools[1]))
    two = run(federation("resources.workers=2", pool=pools[2]))
    assert one.status == two.status == "finished"
    keys = ("acc_global", "acc_all_model", "acc_personalized", "train_loss", "loss")
    assert [[r[k] for k in keys] for r in one.history] == [[r[k] for k in keys] for r in two.history]
    assert same_weights(one, two)
    assert one.history[-1]["acc_global"] > 0.3  # synthetic is learnable: well above 10 % chance


@pytest.mark.extended
def test_bernoulli_sampling_trains_each_rounds_draw_the_same_on_one_worker_or_two(pools):
    """MAN's protocol (``federation.sampling=bernoulli``): seed 0 draws 3, 6 and 7 of the 10 clients; FedDyn
    keeps a drift per client that trained, and the run is still a function of the seed alone. Extended: the
    suite pins the draw (tests/engine/test_rng.py) and one against two workers on six methods (below)."""
    extra = ("federation.sampling=bernoulli", "federation.rounds=3", "method.name=feddyn")
    one = run(federation("resources.workers=1", *extra, pool=pools[1]))
    two = run(federation("resources.workers=2", *extra, pool=pools[2]))
    assert one.status == two.status == "finished" and same_weights(one, two)
    drawn = [round_clients(one.cfg.federation, r) for r in (1, 2, 3)]
    assert [len(c) for c in drawn] == [3, 6, 7]
    assert set(one.client_store) == set().union(*drawn) == set(two.client_store)


EVERY_PROTOCOL = ["federation.clients=6", "federation.fraction=0.5", "federation.rounds=3",
                  "metrics.protocols=[global,all_model,personalized]", "training.finetune_epochs=1"]


@pytest.mark.parametrize("method", each_method())
def test_every_method_gives_the_same_run_on_one_worker_or_two_and_resumed(pools, method, tmp_path):
    """The determinism promise, method by method: 3 rounds on one worker, against rounds 1-2 on two workers
    (3 clients a round: 2 + 1), one of them this process (``pools.with_driver``: a share trained in the
    driver gives an actor's bits), checkpointed as a Tune trial writes it, and round 3 resumed in a new
    federation on the other pool, whose actors never trained this run. Clients are sampled (3 of 6), so
    client states (SCAFFOLD's c_k, Ditto's personal model, FedDyn's h_k, FedPAC's prototypes…) come back on
    another worker and through the checkpoint, where the contract test (tests/methods) keeps the same three
    clients on the same shards; every evaluation protocol and the final fine-tuning run. Same global state,
    client store and history (every round's accuracies, losses and FLOP counts), bit for bit.

    On the exact path, and on the batched one (groups of 2) where it batches this run: a method without a
    functional step, a composite or a model with BatchNorm trains on the exact path under ``batched``
    (``unbatchable``), the same run again."""
    for executor in ("exact", "batched"):
        def config(workers: int) -> ExperimentConfig:
            return tiny_config(method, f"resources.executor={executor}", "resources.batch_clients=2",
                               f"resources.workers={workers}", *EVERY_PROTOCOL)

        straight = build_federation(config(1), pool=pools[1])
        if executor == "batched" and unbatchable(straight.cfg, straight.method, straight.eval_model):
            break
        run(straight)
        first = build_federation(config(2), pool=pools.with_driver(2))
        try:
            first.open()
            first.step()
            first.step()
            write_states(tmp_path, [first.state_dict()])
        finally:
            first.close()
        resumed = build_federation(config(1), pool=pools[1])
        resumed.load_state_dict(read_states(tmp_path)[0])
        run(resumed)
        assert straight.status == resumed.status == "finished" and resumed.round == 3, executor
        assert_same(*[(fed.global_state, dict(fed.client_store), [{k: v for k, v in row.items() if not k.endswith("_s")}
                                                             for row in fed.history])  # timings left out
                      for fed in (straight, resumed)], f"{method} {executor}")


@needs_fmnist
@pytest.mark.extended
def test_evaluation_on_the_workers_equals_one_process_evaluating(pools):
    """2 500 test images: three evaluation batches, split 3 | 1 + 2 over one and two workers. The correct
    counts and summed losses must be those of the driver evaluating alone (the run closed, no pool), with
    the workers' one thread: on some CPUs (AVX-512 here) torch's kernels round differently per thread count."""
    fmnist = ("data.dataset=fmnist", "data.subsample=0.25", "federation.clients=4", "federation.rounds=1",
              "partition.eval_fraction=0")
    one = run(federation("resources.workers=1", *fmnist, pool=pools[1]))
    two = run(federation("resources.workers=2", *fmnist, pool=pools[2]))
    assert len(one.data.test_y) == 2500
    assert same_weights(one, two)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for fed in (one, two):
            assert fed.run_ref is None  # closed: evaluate_state now evaluates in this process
            assert (fed.history[-1]["acc_global"], fed.history[-1]["loss"]) == fed.evaluate_state(fed.global_state)
    finally:
        torch.set_num_threads(threads)
    assert one.history[-1]["acc_global"] == two.history[-1]["acc_global"] > 0.5


def test_personalised_evaluation_on_the_workers_equals_each_client_scored_alone(pools):
    """FedPer on two workers: each shard's clients share the global body and differ in their heads, and
    their scores are read once per shard. The mean accuracy must be what this process computes scoring each
    client's own model alone, after the run."""
    fed = run(federation("method.name=fedper", "resources.workers=2", "metrics.protocols=[personalized]",
                         pool=pools[2]))
    model, accs, threads = build_model_for(fed.cfg, fed.data), [], torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' count (see the test above)
    try:
        for cid, held_out in enumerate(fed.data.client_eval):
            load_state(model, client_model(fed.global_state, fed.client_store.get(cid, {})))
            correct, _, n = evaluate(model, fed.data, fed.data.x[held_out], fed.data.y[held_out], torch.device("cpu"))
            accs.append(correct / n)
    finally:
        torch.set_num_threads(threads)
    assert len({fed.client_store[c]["personal"]["head.weight"].tobytes() for c in fed.client_store}) > 1
    assert fed.history[-1]["acc_personalized"] == float(np.mean(accs))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["fedavg_cnn", "resnet56"])
def test_gpu_workers_give_identical_runs(ray_session, model):
    """On CUDA the workers share the GPU (``gpus_per_worker`` unset) and ``resources.deterministic`` picks
    reproducible cuDNN/cuBLAS kernels, so 1 and 2 workers still agree to the bit."""
    assert ray.cluster_resources().get("GPU", 0) >= 1
    options = ["model.options={blocks: 1}"] if model == "resnet56" else []
    one = run(federation("resources.workers=1", f"model.name={model}", *options))
    two = run(federation("resources.workers=2", f"model.name={model}", *options))
    assert same_weights(one, two)
    assert [r["acc_global"] for r in one.history] == [r["acc_global"] for r in two.history]


def test_runs_interleaved_on_a_shared_pool_match_runs_on_their_own(pools):
    pool = pools[2]
    own = run(federation("resources.workers=2", pool=pool))
    shared = build_federation(own.cfg, pool=pool)
    other = build_federation(build_config(overrides=[*BASE, "method.name=fedprox", "method.mu=0.1"]), pool=pool)
    # every call names its run, so two runs can take turns on the same actors
    assert [[r.round for r in results] for results in lockstep([shared, other])] == [[1, 1], [2, 2]]
    shared.close()
    other.close()
    assert same_weights(own, shared)
    assert [r["acc_global"] for r in own.history] == [r["acc_global"] for r in shared.history]
    assert other.round == 2 and not same_weights(other, shared)  # it really was another run
    assert len(ray.get([actor.pid.remote() for actor in pool.actors])) == 2  # close() left the pool up


class KillWorkerMidRound(Callback):
    """SIGKILLs one worker process shortly after round 2 starts (the worker is busy training)."""

    def __init__(self) -> None:
        self.killed_pid: int | None = None

    def on_round(self, fed, metrics):
        if metrics["round"] == 1:
            pid = ray.get(fed.pool.actors[0].pid.remote())
            timer = threading.Timer(0.3, lambda: os.kill(pid, signal.SIGKILL))
            timer.start()
            self.killed_pid = pid


def test_killed_worker_is_replaced_and_round_is_unchanged(pools):
    reference = run(federation("resources.workers=2", "training.local_epochs=3", pool=pools[2]))
    killer = KillWorkerMidRound()
    fed = federation("resources.workers=2", "training.local_epochs=3", pool=pools[2])
    fed.open()
    run(fed, [killer])
    assert killer.killed_pid is not None
    assert fed.status == "finished"
    assert same_weights(reference, fed)
    assert [r["acc_global"] for r in reference.history] == [r["acc_global"] for r in fed.history]


class Events(Callback):
    """Records the probes callbacks are told of and the rounds, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def on_probe(self, fed, round_, probe):
        self.seen.append((round_, probe))

    def on_round(self, fed, metrics):
        self.seen.append((int(metrics["round"]), "end"))


def test_callbacks_are_told_of_each_due_probe_before_its_round_ends(pools):
    """Progress names the probe running (a Hessian can take minutes on a CPU), only on the rounds it runs."""
    events = Events()
    run(federation("federation.rounds=2", "metrics.every=2", "metrics.protocols=[global]", "resources.workers=1",
                   pool=pools[1]), [events])
    assert [name for r, name in events.seen if r == 1] == ["cost", "update_norm", "end"]
    assert [name for r, name in events.seen if r == 2] == ["cost", "global", "update_norm", "end"]


def test_divergence_stops_with_status(pools):
    fed = run(federation("training.lr=1.0e6", "federation.rounds=5", "resources.workers=1", pool=pools[1]))
    assert fed.status == "diverged"
    assert fed.summary()["diverged_round"] == fed.round < 5


def test_lockstep_ends_every_loop_at_the_first_divergence(pools):
    """A trial's seeds advance one round each per step; one seed's divergence ends them all there."""
    healthy = federation("federation.rounds=5", "resources.workers=1", pool=pools[1])
    diverging = federation("training.lr=1.0e6", "federation.rounds=5", "resources.workers=1", pool=pools[1])
    try:
        steps = list(lockstep([healthy, diverging]))
    finally:
        healthy.close()
        diverging.close()
    assert [[r.status for r in results] for results in steps[:-1]] == [["running", "running"]] * (len(steps) - 1)
    assert [r.status for r in steps[-1]] == ["running", "diverged"]
    assert healthy.round == diverging.round == len(steps) < 5
    assert [r.metrics for r in steps[-1]] == [healthy.history[-1], diverging.history[-1]]


def test_open_all_leaves_the_process_only_the_workers_shared_copy(pools):
    """A trial's seeds are built on one load; once open they read the workers' copy, and the loader's
    cache no longer holds the private one (a later load reads the files again)."""
    whole = "data.subsample=1.0"  # a subsample is a copy of its own from the start
    feds = [federation(f"federation.seed={seed}", whole, pool=pools[2]) for seed in (0, 1)]
    loaded = load_dataset("synthetic")
    try:
        assert all(storages(fed.data) & storages(loaded) for fed in feds)
        open_all(feds)
        assert load_dataset("synthetic") is not loaded
        assert all(fed.pool is not None and not storages(fed.data) & storages(loaded) for fed in feds)
    finally:
        for fed in feds:
            fed.close()


def test_finetune_phase_reports_tuned_personal_accuracy_without_touching_the_global_model(pools):
    plain = run(federation("resources.workers=2", pool=pools[2]))
    tuned = run(federation("resources.workers=2", "training.finetune_epochs=2", pool=pools[2]))
    assert same_weights(plain, tuned)
    last = tuned.history[-1]
    assert "acc_personalized_ft" in last and "acc_personalized_ft" not in tuned.history[0]
    assert last["acc_personalized"] == plain.history[-1]["acc_personalized"]
    assert last["loss_personalized_ft"] != last["loss_personalized"]  # the heads really were tuned
    assert tuned.summary()["acc_personalized_ft"] == last["acc_personalized_ft"]


def test_fine_tuning_runs_at_the_lr_a_round_after_the_last_would_train_at(pools):
    """``training.finetune_lr`` unset: lr·lr_decay^R, the rate FedSOL's clients load from the server's optimiser
    after R rounds (the explicit value gives the same figures; the undecayed lr other ones)."""
    decayed = ("resources.workers=2", "federation.rounds=1", "training.finetune_epochs=1", "training.lr_decay=0.5")
    figures = {lr: run(federation(*decayed, *lr, pool=pools[2])).history[-1]["loss_personalized_ft"]
               for lr in ((), ("training.finetune_lr=0.025",), ("training.finetune_lr=0.05",))}
    assert figures[()] == figures[("training.finetune_lr=0.025",)] != figures[("training.finetune_lr=0.05",)]


def test_training_forward_flops_are_counted_on_the_real_training(pools):
    """FedAvg's forward passes per training sample are the model's forward pass; MOON's add the global and
    previous models' (FedAlign Table 5: 262.2 vs 87.3); Table 8's cumulative figure is that × rounds."""
    fedavg = run(federation("resources.workers=2", "federation.rounds=2", pool=pools[2]))
    moon = run(federation("resources.workers=2", "federation.rounds=2", "method.name=moon", pool=pools[2]))
    model_mflops = fedavg.static_costs()["cost_forward_mflops"]
    assert fedavg.history[0]["cost_train_forward_mflops"] == pytest.approx(model_mflops)
    assert 2.9 < moon.history[-1]["cost_train_forward_mflops"] / model_mflops < 3.3
    for fed in (fedavg, moon):
        per_sample = fed.history[0]["cost_train_forward_mflops"]
        assert fed.history[-1]["cost_train_forward_mflops"] == per_sample  # counted once, in round 1
        assert fed.history[-1]["cost_cum_forward_mflops"] == pytest.approx(2 * per_sample)


class _Seen(Probe):
    """A probe that keeps what the loop shows it: the round's view, and its run's."""

    name = "seen"
    metrics = {"seen_clients": "clients the round trained"}

    def __init__(self, run: RunView) -> None:
        self.run, self.views = run, []

    def measure(self, view: RoundView) -> dict[str, float]:
        self.views.append(view)
        return {"seen_clients": float(len(view.client_metrics))}


def test_a_federation_built_by_hand_from_its_parts_runs_as_the_assembled_one(pools):
    """``Federation`` takes its parts (method, model builder, data, executor, pool, probes) and builds none from
    the config: a FedProx run assembled by hand on the reference executor has the assembled exact run's bits;
    its probe sees each round through a frozen view whose run is the federation's, read-only."""
    cfg = build_config(overrides=[*BASE, "method.name=fedprox", "method.mu=0.1", "metrics.protocols=[global]"])
    data, seen = load_data(cfg), []

    def probes(run_view: RunView) -> list[Probe]:
        seen.append(_Seen(run_view))
        return seen

    method, model = partial(get_method("fedprox"), cfg.method.params), partial(build_model_for, cfg)
    hand = run(Federation(cfg, data, method, model, OneByOne(reference=True), pools[2], probes=probes))
    assembled = run(build_federation(cfg, pool=pools[2]))
    assert same_weights(hand, assembled) and hand.status == "finished"
    assert [row["train_loss"] for row in hand.history] == [row["train_loss"] for row in assembled.history]
    (probe,) = seen
    assert probe.run is hand.view and probe.run.history is hand.history and len(probe.views) == 2
    last = probe.views[-1]
    assert last.global_state is hand.global_state and last.run.cfg is cfg
    assert [v.metrics["seen_clients"] for v in probe.views] == [4.0, 4.0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        last.run.history = []  # type: ignore[misc]
