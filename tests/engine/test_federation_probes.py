"""What the probes need from the workers: local models rebuilt rather than shipped (``all_model``, H_N/H_D),
and the Hessian probe computed on the workers (issue 12 item 3)."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import numpy as np
import pytest
import ray
import torch

import fltune.metrics._hessian
from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.federation import Federation
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.rng import round_clients
from fltune.methods.base import State, client_model, to_numpy
from fltune.metrics._hessian import CurvatureTask, client_traces, cross_client_consistency, global_curvature

BASE = [
    "data.dataset=synthetic", "data.subsample=0.25", "partition.kind=dirichlet_prior", "partition.eval_fraction=0.2",
    "federation.clients=10", "federation.fraction=0.4", "federation.rounds=2", "training.local_epochs=1",
    "training.batch_size=32", "training.lr=0.05", "tracking.enabled=false", "resources.workers=2",
]
REBUILT = ["fedavg", "fedprox", "feddyn", "scaffold", "fedper", "lg_fedavg", "fedpac", "moon"]
"""Methods whose local model is its update plus its personal part (``client_model``)."""
SHIPPED = ["ditto", "fednova"]
"""Methods whose update or personal state is not the trained model: their workers ship the model."""


def same_bits(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def figures(fed: Federation) -> list[dict[str, float]]:
    """The run's metrics without its timings."""
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in fed.history]


def run(fed: Federation, shipped: bool = False) -> Federation:
    """All rounds; ``shipped``: every worker ships every local model (the reference before the rebuild)."""
    try:
        fed.open()
        if shipped:
            fed.run_ref = ray.put(replace(fed.spec(fed.data, keep_latest=True), rebuild=False))
        fed.run()
    finally:
        fed.close()
    return fed


@pytest.mark.parametrize("name", REBUILT + SHIPPED)
def test_local_model_hook_rebuilds_exactly_the_methods_it_should(name: str) -> None:
    """One client trained in-process: the hook's rebuild is the trained model, bit for bit, for the
    methods that ship nothing extra, and differs for those the workers must ship."""
    cfg = build_config(overrides=[*BASE, f"method.name={name}", "federation.clients=4"])
    data, method = load_data(cfg), build_method(cfg)
    model, start = build_model_for(cfg, data), initial_state(cfg, data)
    inputs = RoundInput(round=1, seed=0, lr=0.05, global_state=start,
                        server=method.server_payload(method.init_server_state(start)))
    out = train_client(Trainer.of(method, model, data, cfg.training, torch.device("cpu")), 0, inputs, {})
    rebuilt = client_model(out.update, out.state)
    assert same_bits(rebuilt, to_numpy(model.state_dict())) == (name in REBUILT)


@pytest.mark.parametrize("name", ["ditto", *(pytest.param(n, marks=pytest.mark.extended)
                                            for n in ("fedavg", "feddyn", "fedper"))])
def test_rebuilt_local_models_give_the_shipped_figures(pools, name: str) -> None:
    """all_model accuracy and loss, weights, client store and every kept local model: the same bits
    whether the workers ship the local models (the path before the rebuild) or the driver rebuilds them
    (Ditto falls back to shipping: both runs take that path)."""
    overrides = [*BASE, f"method.name={name}"]
    rebuilt = run(build_federation(build_config(overrides=overrides), pool=pools[2]))
    shipped = run(build_federation(build_config(overrides=overrides), pool=pools[2]), shipped=True)
    assert "acc_all_model" in rebuilt.history[-1] and "loss_all_model" in rebuilt.history[-1]
    assert figures(rebuilt) == figures(shipped)
    assert same_bits(rebuilt.global_state, shipped.global_state)
    assert rebuilt.latest.keys() == shipped.latest.keys() and len(rebuilt.latest) > 0
    assert all(same_bits(rebuilt.latest[c], shipped.latest[c]) for c in rebuilt.latest)
    assert pickle.dumps(dict(rebuilt.client_store)) == pickle.dumps(dict(shipped.client_store))


@pytest.mark.parametrize("name", [pytest.param("fedavg", marks=pytest.mark.extended), "fedper"])
def test_checkpoint_with_rebuilt_local_models_resumes_exactly(pools, name: str) -> None:
    overrides = [*BASE, f"method.name={name}", "federation.rounds=3"]
    straight = run(build_federation(build_config(overrides=overrides), pool=pools[2]))
    first = build_federation(build_config(overrides=overrides), pool=pools[2])
    try:
        first.open()
        first.step()
        first.step()
        saved = pickle.dumps(first.state_dict())  # what a Tune checkpoint writes
    finally:
        first.close()
    resumed = build_federation(build_config(overrides=overrides), pool=pools[2])
    resumed.load_state_dict(pickle.loads(saved))
    run(resumed)
    assert figures(resumed) == figures(straight)
    assert all(same_bits(resumed.latest[c], straight.latest[c]) for c in straight.latest)


HESSIAN = [
    "model.name=mlp", "federation.rounds=2", "metrics.protocols=[global]", "metrics.hessian.every=1",
    "metrics.hessian.at_end=true", "metrics.hessian.batches=2", "metrics.hessian.batch_size=16",
    "metrics.hessian.clients=2", "metrics.hessian.top_k=2", "metrics.hessian.max_iter=8",
]


def test_hessian_probe_runs_on_the_workers(pools, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Hessian-vector products broken in this (the driver's) process, the probe still measures —
    the workers import their own — and its figures are those of this process computing them alone on
    one thread (the workers' ``cpus_per_worker``), bit for bit."""

    def on_the_driver(*args: object) -> None:
        raise AssertionError("a Hessian-vector product ran in the driver's process")

    monkeypatch.setattr(fltune.metrics._hessian, "_mean_hvp", on_the_driver)
    fed = run(build_federation(build_config(overrides=[*BASE, *HESSIAN]), pool=pools[2]))
    monkeypatch.undo()
    last = fed.history[-1]
    assert [int(row["round"]) for row in fed.history if "hessian_lambda_max" in row] == [1, 2]
    assert {p.name for p in fed.artifacts} == {"loss_landscape.png", "hessian_spectrum.png"}

    cfg, cpu, threads = fed.cfg, torch.device("cpu"), torch.get_num_threads()
    fed_cfg = cfg.federation
    compared = sorted(round_clients(fed_cfg, 2))[:2]
    torch.set_num_threads(1)
    try:
        alone = CurvatureTask(global_curvature, fed.global_state)(cfg, fed.data, cpu)
        alone.update(cross_client_consistency([CurvatureTask(client_traces, fed.latest[c], c)(cfg, fed.data, cpu)
                                               for c in compared]))
    finally:
        torch.set_num_threads(threads)
    assert all(math.isfinite(v) for v in alone.values())
    assert {k: last[k] for k in alone} == alone
    assert np.isfinite(last["hessian_s"])
