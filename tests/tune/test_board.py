"""The trial board's ETA: trials left over how many ran at once, not over how many Tune calls running."""

from __future__ import annotations

import math
import time

from fltune.tune.board import eta, most_at_once
from fltune.tune.results import TrialRow


def test_eta_divides_by_the_trials_that_ran_at_once_not_those_tune_calls_running() -> None:
    """6 trials: 2 finished side by side (100 s and 140 s, overlapping), 1 training (round 3), 1 started but
    waiting for resources (round 0), 2 pending → 6 − 2 − ½ = 3.5 trial-lengths of 120 s over 2 at once = 3.5
    min. Counting Tune's 2 running trials as 2 more at once would say 1.75."""
    rows = [ended("a", 100.0, 1_000), ended("b", 140.0, 1_050),
            TrialRow("c", "running", {}, 3, math.nan, math.nan, {}), TrialRow("d", "running", {}, 0, math.nan,
                                                                               math.nan, {})]
    assert eta(rows, 6) == ", ETA ~4 min"  # 3.5 rounds to 4
    assert eta(rows[2:], 6) == ""  # none ended yet
    assert eta(rows[2:], 6, planned=(time.time() - 60, 600.0)) == ", ETA ~9 min (plan)"  # until one has, the plan's
    assert eta(rows[2:], 6, planned=(time.time() - 700, 600.0)) == ", past the plan's ~10 min"
    assert eta(rows, 6, planned=(time.time() - 60, 600.0)) == ", ETA ~4 min"  # then the measured pace
    one_after_another = [ended("a", 100.0, 1_000), ended("b", 100.0, 1_100), ended("c", 100.0, 1_200)]
    assert eta(one_after_another, 9) == ", ETA ~10 min"  # 6 left × 100 s, one at a time
    assert most_at_once([(0.0, 10.0), (5.0, 15.0), (8.0, 20.0), (14.0, 30.0)]) == 3
    assert most_at_once([(0.0, 10.0), (10.0, 20.0), (19.5, 25.0)]) == 1  # touching; < 1 s overlap


def ended(trial: str, seconds: float, timestamp: int) -> TrialRow:
    """A finished trial as Tune's last result gives it: its duration and when it ended (whole seconds)."""
    return TrialRow(trial, "finished", {}, 20, 0.8, 0.0, {"time_total_s": seconds, "timestamp": timestamp})


def test_eta_weighs_trials_by_their_estimated_seconds_when_given() -> None:
    """A paper-scale job: a cheap trial (estimated 100 s) took 200 s, so the pace is 2 s a second of estimate;
    left: one long (1,000 s) and one cheap, half done (training) → (1,000 + 100 − 50) × 2 / 1 at once = 35 min.
    Unweighted, the same rows say (3 − 1 − ½) × 200 s = 5 min."""
    rows = [TrialRow("a", "finished", {"cell": "cheap"}, 20, 0.8, 0.0, {"time_total_s": 200.0, "timestamp": 1_000}),
            TrialRow("b", "running", {"cell": "cheap2"}, 5, math.nan, math.nan, {}),
            TrialRow("c", "pending", {"cell": "long"}, 0, math.nan, math.nan, {})]
    costs = {"cheap": 100.0, "cheap2": 100.0, "long": 1_000.0}
    assert eta(rows, 3, costs) == ", ETA ~35 min"
    assert eta(rows, 3) == ", ETA ~5 min"
