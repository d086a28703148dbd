"""MLflow logging on a writer thread: calls run in order, errors surface, and a run always ends with its
status — finished, failed or killed — before the command goes on."""

from __future__ import annotations

import threading

import pytest
from mlflow.tracking import MlflowClient

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.callbacks import Callback
from fltune.engine.federation import Federation
from fltune.tracking.callback import BackgroundWriter, MLflowCallback
from fltune.tracking.mlflow_log import mlflow_key

TINY = ["data.dataset=synthetic", "model.name=mlp", "federation.clients=4", "federation.fraction=0.5",
        "federation.rounds=3", "training.local_epochs=1", "metrics.protocols=[global]", "resources.workers=1"]


def test_writer_runs_calls_in_order_off_the_calling_thread() -> None:
    seen: list[tuple[int, bool]] = []
    writer = BackgroundWriter()
    for i in range(50):
        writer.submit(lambda i: seen.append((i, threading.current_thread() is threading.main_thread())), i)
    writer.close()
    assert seen == [(i, False) for i in range(50)]


def test_writer_raises_the_first_error_and_skips_what_followed() -> None:
    seen: list[int] = []
    writer = BackgroundWriter()

    def fail() -> None:
        raise ValueError("store unreachable")

    writer.submit(seen.append, 1)
    writer.submit(fail)
    writer.submit(seen.append, 2)
    with pytest.raises(ValueError, match="store unreachable"):
        writer.close()
    assert seen == [1]
    with pytest.raises(ValueError):  # and on every later call
        writer.submit(seen.append, 3)


class StopAt(Callback):
    def __init__(self, round_: int, error: BaseException) -> None:
        self.round, self.error = round_, error

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        if metrics["round"] == self.round:
            raise self.error


@pytest.mark.parametrize("error, status", [(KeyboardInterrupt(), "KILLED"), (RuntimeError("boom"), "FAILED"),
                                           (None, "FINISHED")])
def test_run_ends_with_its_status_and_every_round_logged(ray_session, mlflow_uri, error, status) -> None:
    cfg = build_config(overrides=TINY)
    fed = build_federation(cfg)
    logger = MLflowCallback(cfg)
    summary: dict = {}
    try:
        callbacks = [logger, StopAt(2, error)] if error else [logger]
        if error:
            with pytest.raises(type(error)):
                fed.run(callbacks)
        else:
            summary = fed.run(callbacks)
    finally:
        fed.close()
    client = MlflowClient(mlflow_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == status
    assert summary.get("mlflow_run_id", logger.run_id) == logger.run_id
    logged = [m.step for m in client.get_metric_history(logger.run_id, mlflow_key("acc_global"))]
    assert logged == ([1, 2] if error else [1, 2, 3])  # the stopping round's metrics were logged before it
