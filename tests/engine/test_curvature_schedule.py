"""metrics.hessian in a real run: which rounds are probed, what is logged, the end-of-run figures in MLflow."""

from __future__ import annotations

import math

from mlflow.tracking import MlflowClient

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.tracking.callback import MLflowCallback
from fltune.tracking.mlflow_log import mlflow_key

TINY_HESSIAN = [
    "data.dataset=synthetic", "model.name=mlp", "partition.kind=dirichlet_prior", "federation.clients=6",
    "federation.fraction=0.5", "federation.rounds=3", "training.local_epochs=1", "training.batch_size=32",
    "metrics.protocols=[global]", "metrics.hessian.every=2", "metrics.hessian.at_end=true",
    "metrics.hessian.batches=2", "metrics.hessian.batch_size=16", "metrics.hessian.clients=2",
    "metrics.hessian.top_k=2", "metrics.hessian.max_iter=8", "resources.workers=1",
]


def test_hessian_schedule_logs_curves_and_end_figures(ray_session, mlflow_uri):
    cfg = build_config(overrides=TINY_HESSIAN)
    fed = build_federation(cfg)
    try:
        summary = fed.run([MLflowCallback(cfg)])
    finally:
        fed.close()
    probed = [int(row["round"]) for row in fed.history if "hessian_lambda_max" in row]
    assert probed == [2, 3]  # every 2 rounds, and at the end
    last = fed.history[-1]
    for key in ("hessian_lambda_1", "hessian_lambda_2", "hessian_lambda_1_over_2", "hessian_trace",
                "hessian_trace_se", "hessian_hn", "hessian_hd", "hessian_s"):
        assert math.isfinite(last[key]), key
    assert last["hessian_trace_se"] > 0  # max_iter 8 < the 10 samples before the stop rule: never 0 here
    assert last["hessian_lambda_1"] >= last["hessian_lambda_2"]
    assert summary["hessian_lambda_max"] == last["hessian_lambda_max"]

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, mlflow_key("hessian_trace"))] == [2, 3]
    assert {"loss_landscape.png", "hessian_spectrum.png"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
