"""``engine.worker``: a process that sees no GPU imports torch's compiler stack and counts FLOPs without Triton
(``skip_triton``), with the same counts and without the counter's note about Triton kernels; the personalised
evaluation's staged copies give each client's own scores."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import ray
import torch

import fltune.engine.executors as executors_module
import fltune.engine.worker as worker_module
from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data, resolve_augment
from fltune.engine.evaluation import evaluate
from fltune.engine.local import Trainer, final_round
from fltune.engine.transfer import RoundInput, load_state
from fltune.engine.worker import ClientWorker, RunSpec
from fltune.methods.base import client_model

COUNT = """
import json, sys
import torch
if {skip}:
    from fltune.engine.worker import skip_triton
    skip_triton()
import torch._dynamo
from fltune.metrics._flops import TrainingFlops
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 26 * 26, 10))
with TrainingFlops() as flops:
    model(torch.randn(8, 1, 28, 28)).sum().backward()
print(json.dumps([flops.get_total_flops(), flops.forward_flops, sys.modules.get("triton") is not None]))
"""


def spec_of(cfg: ExperimentConfig, data: FederatedData) -> RunSpec:
    """The run of ``cfg`` on ``data`` as its workers receive it (its assembled parts)."""
    return build_federation(cfg, data).spec(data, keep_latest=False)


def count(skip: bool) -> tuple[list, str]:
    """(total FLOPs, forward FLOPs, Triton loaded) of one training step, and what the process wrote to stderr:
    in a fresh interpreter, since this one may hold Triton already."""
    proc = subprocess.run([sys.executable, "-c", COUNT.format(skip=skip)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="skip_triton is for processes that see no GPU")
def test_flops_counted_without_triton_are_the_same_and_the_counter_stays_quiet():
    pytest.importorskip("triton")  # torch's CUDA build: Triton is installed, and the compiler stack imports it
    (total, forward, loaded), _ = count(skip=False)
    (total_skipped, forward_skipped, loaded_skipped), err = count(skip=True)
    assert loaded and not loaded_skipped
    assert (total_skipped, forward_skipped) == (total, forward) > (0, 0)
    assert "triton" not in err.lower()


@pytest.mark.parametrize("method", ["lg_fedavg", "ditto"])
def test_personalised_scores_are_each_client_scored_alone_in_chunks_of_any_size(ray_session, monkeypatch, method):
    """``evaluate_clients`` stages a chunk's held-out images and personal weights on the device at once and
    loads each client's weights from there. LG-FedAvg's clients differ in their lower layers, some share
    theirs, and clients never sampled share the global one; with fine-tuning (Ditto's own last round) each
    client trains first. Chunks of one, two and all clients must give the scores of each client's own model
    scored alone, bit for bit."""
    threads = torch.get_num_threads()
    cfg = build_config(overrides=[
        "data.dataset=synthetic", "data.subsample=0.05", "partition.eval_fraction=0.2", "federation.clients=6",
        f"method.name={method}", "training.local_epochs=1", "training.finetune_epochs=1", "tracking.enabled=false",
    ])
    data = load_data(cfg)
    state = initial_state(cfg, data)
    inputs = RoundInput(round=cfg.federation.rounds + 1, seed=0, lr=0.05, global_state=state, server={})
    rng = np.random.default_rng(0)
    body = {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in state.items()}
    states = {1: {"personal": body}, 2: {"personal": body},
              4: {"personal": {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in state.items()}}}
    method_ = build_method(cfg)
    if method == "lg_fedavg":  # its personal part is the layers below its shared top two
        keep = method_.personal_keys(build_model_for(cfg, data))
        states = {c: {"personal": {k: v for k, v in s["personal"].items() if k in keep}} for c, s in states.items()}
    ids = [0, 1, 2, 3, 4, 5]
    try:
        worker = ClientWorker(threads=1, in_driver=True)
        run_ref = [ray.put(spec_of(cfg, data))]
        per_model = sum(v.nbytes for v in state.values())
        for finetune in (False, True):
            alone = {}
            model = build_model_for(cfg, data)
            for cid in ids:
                if finetune:
                    trainer = Trainer.of(method_, model, data, cfg.training, torch.device("cpu"),
                                         resolve_augment(cfg, data))
                    final_round(trainer, cid, inputs, states.get(cid, {}))
                else:
                    load_state(model, client_model(state, states.get(cid, {})))
                held_out = data.client_eval[cid]
                alone[cid] = evaluate(model, data, data.x[held_out], data.y[held_out], torch.device("cpu"))
            for budget in (per_model, 2 * per_model, 100 * per_model):
                monkeypatch.setattr(worker_module, "STAGED_BYTES", budget)
                assert worker.evaluate_clients(run_ref, inputs, finetune, ids, states) == alone, (finetune, budget)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method, tuner", [("fedrep", "FineTune"), ("ditto", "Ditto")])
def test_a_batched_runs_final_round_trains_whole_groups_in_chunks_of_whole_groups(ray_session, monkeypatch, method,
                                                                                   tuner):
    """``resources.executor: batched``: the final round's pass over every client goes through ``train_group``
    (FedRep's tuner, Ditto's own round), group by group as the run's sorted clients chunk, even where a staging
    chunk would have cut a group (a one-client budget); each client is scored on what its group left it."""
    cfg = build_config(overrides=[
        "data.dataset=synthetic", "data.subsample=0.05", "partition.eval_fraction=0.2", "federation.clients=6",
        f"method.name={method}", "training.local_epochs=1", "training.finetune_epochs=1", "tracking.enabled=false",
        "resources.executor=batched", "resources.batch_clients=4",
    ])
    data = load_data(cfg)
    state = initial_state(cfg, data)
    inputs = RoundInput(round=cfg.federation.rounds + 1, seed=0, lr=0.05, global_state=state, server={})
    groups, real = [], executors_module.train_group

    def counted(final, group, *args, **kwargs):
        groups.append((type(final.method).__name__, list(group)))
        yield from real(final, group, *args, **kwargs)

    monkeypatch.setattr(executors_module, "train_group", counted)
    monkeypatch.setattr(worker_module, "STAGED_BYTES", sum(v.nbytes for v in state.values()))
    threads = torch.get_num_threads()
    try:
        worker = ClientWorker(threads=1, in_driver=True)
        run_ref = [ray.put(spec_of(cfg, data))]
        scores = worker.evaluate_clients(run_ref, inputs, True, list(range(6)), {})
    finally:
        torch.set_num_threads(threads)
    assert groups == [(tuner, [0, 1, 2, 3]), (tuner, [4, 5])]
    assert sorted(scores) == list(range(6)) and all(n == len(data.client_eval[c]) for c, (_, _, n) in scores.items())
