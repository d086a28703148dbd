"""The MLflow wrapper against a real sqlite store: finding a job's runs by tag, reading a curve back."""

from __future__ import annotations

import pytest

from fltune.config import TrackingConfig, build_config
from fltune.tracking.mlflow_log import DESCRIPTION, ERROR, NOTE, Tracker, mlflow_key, run_name
from tests.plugin_helpers import write_method

FOLDERS = ["/data/jobs/c", "/data/it's/c", '/data/say "hi"/c', "/data/it's \"both\"/c"]
"""Job folders as a study's parent tag holds them: no quote, each kind of quote, both."""


@pytest.fixture
def tracker(mlflow_uri: str) -> Tracker:
    return Tracker(TrackingConfig(uri=mlflow_uri))


def test_find_matches_tag_values_whatever_quotes_they_hold(tracker: Tracker) -> None:
    runs = {folder: tracker.start(None, {"fltune.study": folder, "fltune.kind": "compare"}) for folder in FOLDERS}
    tracker.start(None, {"fltune.study": FOLDERS[1], "fltune.kind": "study"})  # same folder, another kind
    for folder, run_id in runs.items():
        found = tracker.find({"fltune.study": folder, "fltune.kind": "compare"})
        assert [run.info.run_id for run in found] == [run_id], folder
    assert tracker.find({"fltune.study": "/data/it", "fltune.kind": "compare"}) == []


def test_history_is_the_curve_as_logged(tracker: Tracker) -> None:
    run_id = tracker.start(None, {})
    assert tracker.history(run_id, "acc") == {}
    for step, value in ((1, 0.5), (2, 0.6), (3, 0.7)):
        tracker.log_metrics(run_id, {"acc": value}, step=step)
    assert tracker.history(run_id, "acc") == {1: 0.5, 2: 0.6, 3: 0.7}


def test_a_run_is_named_after_what_it_is_unless_the_user_names_it() -> None:
    overrides = ["method.name=fedprox", "data.dataset=synthetic", "partition.kind=dirichlet", "federation.seed=3"]
    assert run_name(build_config(overrides=overrides)) == "fedprox · synthetic · dirichlet · seed 3"
    assert run_name(build_config(overrides=[*overrides, "tracking.run_name=mine"])) == "mine"


def test_the_experiment_says_what_fltune_logged_there_and_keeps_a_description_the_user_wrote(mlflow_uri: str) -> None:
    tracker = Tracker(TrackingConfig(uri=mlflow_uri))
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags[NOTE] == DESCRIPTION and "`acc/…`" in DESCRIPTION
    tracker.client.set_experiment_tag(tracker.experiment_id, NOTE, "my ablation of μ")
    again = Tracker(TrackingConfig(uri=mlflow_uri))
    assert again.client.get_experiment(again.experiment_id).tags[NOTE] == "my ablation of μ"


def test_a_round_is_the_step_of_its_metrics_not_a_metric(tracker: Tracker) -> None:
    run_id = tracker.start(None, {})
    for round_ in (1, 2):
        tracker.log_round(run_id, {"round": float(round_), "acc_global": 0.25 * round_})
    assert set(tracker.client.get_run(run_id).data.metrics) == {"acc/global"}
    assert tracker.history(run_id, "acc_global") == {1: 0.25, 2: 0.5}
    assert [m.step for m in tracker.client.get_metric_history(run_id, "acc/global")] == [1, 2]  # int steps


def test_metrics_are_sectioned_by_prefix_in_mlflow_alone() -> None:
    """MLflow's UI groups a run's charts by the name's part before ``/``; fltune's own names stay as they are."""
    names = {"acc_global": "acc/global", "acc_personalized_worst10": "acc/personalized_worst10", "loss": "loss/global",
             "loss_all_model": "loss/all_model", "val_acc_global": "val/acc_global", "train_loss": "train/loss",
             "cost_cum_tflops": "cost/cum_tflops", "round_s": "time/round_s", "hessian_trace": "hessian/trace",
             "best_acc": "best_acc", "objective": "objective", "final_acc_global.fedavg": "final_acc_global.fedavg",
             "acc": "acc"}
    assert {name: mlflow_key(name) for name in names} == names


def test_a_failed_run_shows_its_error_and_a_users_method_its_name(tracker: Tracker, tmp_path) -> None:
    run_id = tracker.start(None, {})
    tracker.end(run_id, "failed", "RuntimeError: grad can be implicitly created only for scalar outputs")
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags[ERROR] == run.data.tags[NOTE] == (
        "RuntimeError: grad can be implicitly created only for scalar outputs")
    method = f"{write_method(tmp_path, 'named_smooth')}:LabelSmooth"
    assert run_name(build_config(overrides=[f"method.name={method}"])).startswith("label_smooth · ")
