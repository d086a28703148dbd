"""A run's MLflow run, from a real federation: named after what it is, fltune's metrics per round with the
round as the step, the summary's own figures once, the curves figure and the model; a failed run's error."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.callbacks import Callback
from fltune.tracking.callback import MLflowCallback
from fltune.tracking.mlflow_log import ERROR, NOTE, mlflow_key
from tests.engine.test_federation import BASE


class Fails(Callback):
    def on_round(self, fed, metrics) -> None:
        raise RuntimeError("grad can be implicitly created only for scalar outputs")


def test_a_run_is_named_and_logs_each_figure_in_one_place(pools, mlflow_uri: str) -> None:
    cfg = build_config(overrides=[*BASE, "resources.workers=1", "tracking.enabled=true"])
    callback = MLflowCallback(cfg)
    fed = build_federation(cfg, pool=pools[1])
    try:
        summary = fed.run([callback])
    finally:
        fed.close()
    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.run_name == "fedavg · synthetic · dirichlet_prior · seed 0"
    metrics = run.data.metrics
    assert "round" not in metrics and not [key for key in metrics if key.startswith("final_")]
    assert {"best_acc", "wall_s", "samples_per_s"} <= set(metrics)  # the summary's figures no round has
    assert [m.step for m in client.get_metric_history(run.info.run_id, "acc/global")] == [1, 2]
    assert metrics[mlflow_key("acc_global")] == summary["acc_global"]  # the final value: the curve's last step
    assert {"curves.png", "model"} <= {a.path for a in client.list_artifacts(run.info.run_id)}

    failing = build_config(overrides=[*BASE, "federation.rounds=1", "resources.workers=1", "tracking.enabled=true"])
    callback = MLflowCallback(failing)
    fed = build_federation(failing, pool=pools[1])
    try:
        with pytest.raises(RuntimeError):
            fed.run([callback, Fails()])
    finally:
        fed.close()
    failed = client.get_run(callback.run_id)  # a failed trial's run said fltune.status=failed, not why
    assert failed.info.status == "FAILED" and failed.data.tags[ERROR] == failed.data.tags[NOTE] == (
        "RuntimeError: grad can be implicitly created only for scalar outputs")

