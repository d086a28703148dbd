"""The MLflow wrapper against a real sqlite store: finding a job's runs by tag, reading a curve back."""

from __future__ import annotations

import pytest

from fltune.config import TrackingConfig
from fltune.tracking.mlflow_log import Tracker

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
