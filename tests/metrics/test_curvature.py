"""The data H_N/H_D probe each client model on (``metrics.hessian.probe_data``, issue 11 item 5).

Default ``shared``, as the FedAlign authors measure (``mmendiet/FedAlign:pyhessian/compute_hessian.py``:
every saved client model is loaded and its Hessian taken on ``dl.get_dataloader(data_dir, …)``'s training
loader of the whole data set, the same batches for every client); ``own``: each on its client's data.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fltune.config import build_config
from fltune.engine.builders import build_model_for, load_data
from fltune.metrics._hessian import client_traces, consistency_batches, cross_client_consistency, probe_batches

CPU = torch.device("cpu")
TINY = ["data.dataset=synthetic", "data.subsample=0.1", "model.name=mlp", "partition.kind=dirichlet_prior",
        "partition.alpha=0.1", "federation.clients=4", "metrics.hessian.batches=2", "metrics.hessian.batch_size=16",
        "metrics.hessian.clients=2", "metrics.hessian.max_iter=20"]


def setup(probe_data: str | None):
    cfg = build_config(overrides=[*TINY, *([f"metrics.hessian.probe_data={probe_data}"] if probe_data else [])])
    data = load_data(cfg)
    shared = probe_batches(data, np.concatenate(data.client_train), cfg.metrics.hessian, 0, -1, CPU)
    return cfg, data, shared


def test_default_is_the_authors_shared_batches() -> None:
    cfg, data, shared = setup(None)
    assert cfg.metrics.hessian.probe_data == "shared"
    assert all(consistency_batches(data, c, shared, cfg.metrics.hessian, 0, CPU) is shared for c in range(4))


def test_own_batches_come_from_the_clients_data() -> None:
    cfg, data, shared = setup("own")
    for client in range(2):
        batches = consistency_batches(data, client, shared, cfg.metrics.hessian, 0, CPU)
        labels = torch.cat([y for _, y in batches])
        assert set(labels.tolist()) <= set(data.y[data.client_train[client]].tolist())
        expected = probe_batches(data, data.client_train[client], cfg.metrics.hessian, 0, client, CPU)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, expected))


@pytest.mark.parametrize("probe_data", ["shared", "own"])
def test_identical_models_are_consistent_only_on_shared_data(probe_data: str) -> None:
    """Two clients holding the same model: on shared data H_N/H_D see only the models, so H_N = 0 and
    H_D = 1 exactly; on their own (label-skewed, α = 0.1) data the data alone make them differ."""
    cfg, data, shared = setup(probe_data)
    torch.manual_seed(0)
    model = build_model_for(cfg, data)
    traces = [client_traces(copy.deepcopy(model), consistency_batches(data, c, shared, cfg.metrics.hessian, 0, CPU),
                            cfg.metrics.hessian, seed=0) for c in (0, 1)]
    out = cross_client_consistency(traces)
    if probe_data == "shared":
        assert out == {"hessian_hn": 0.0, "hessian_hd": pytest.approx(1.0, abs=1e-12)}
    else:
        assert out["hessian_hn"] > 0 and out["hessian_hd"] < 1.0
