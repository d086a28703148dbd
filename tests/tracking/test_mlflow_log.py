"""The MLflow wrapper against a real sqlite store: finding a job's runs by tag, reading a curve back."""

from __future__ import annotations

import pytest

from fltune.config import TrackingConfig, build_config
from fltune.tracking.mlflow_log import DESCRIPTION, NOTE, Tracker, run_name

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


def test_history_is_the_curve_as_logged_and_last_step_its_end(tracker: Tracker) -> None:
    run_id = tracker.start(None, {})
    assert tracker.history(run_id, "acc") == {} and tracker.last_step(run_id, "acc") is None
    for step, value in ((1, 0.5), (2, 0.6), (3, 0.7)):
        tracker.log_metrics(run_id, {"acc": value}, step=step)
    assert tracker.history(run_id, "acc") == {1: 0.5, 2: 0.6, 3: 0.7} and tracker.last_step(run_id, "acc") == 3


def test_a_run_is_named_after_what_it_is_unless_the_user_names_it() -> None:
    overrides = ["method.name=fedprox", "data.dataset=synthetic", "partition.kind=dirichlet", "federation.seed=3"]
    assert run_name(build_config(overrides=overrides)) == "fedprox · synthetic · dirichlet · seed 3"
    assert run_name(build_config(overrides=[*overrides, "tracking.run_name=mine"])) == "mine"


def test_the_experiment_says_what_fltune_logged_there_and_keeps_a_description_the_user_wrote(mlflow_uri: str) -> None:
    tracker = Tracker(TrackingConfig(uri=mlflow_uri))
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags[NOTE] == DESCRIPTION and "`acc_*`" in DESCRIPTION
    tracker.client.set_experiment_tag(tracker.experiment_id, NOTE, "my ablation of μ")
    again = Tracker(TrackingConfig(uri=mlflow_uri))
    assert again.client.get_experiment(again.experiment_id).tags[NOTE] == "my ablation of μ"


def test_a_round_is_the_step_of_its_metrics_not_a_metric(tracker: Tracker) -> None:
    run_id = tracker.start(None, {})
    for round_ in (1, 2):
        tracker.log_round(run_id, {"round": float(round_), "acc_global": 0.25 * round_})
    assert set(tracker.client.get_run(run_id).data.metrics) == {"acc_global"}
    assert tracker.history(run_id, "acc_global") == {1: 0.25, 2: 0.5}
