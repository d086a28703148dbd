"""Scores, statuses and ranking of trials (pure functions, no Ray)."""

from __future__ import annotations

import math

from fltune.metrics.target import reached_target
from fltune.tune.results import best, classify, make_row, rank, unfinished
from fltune.tune.space import Objective
from fltune.tune.trainable import last_good, seed_score

HISTORY = [
    {"round": 1.0, "acc_global": 0.5, "train_loss": 1.0},
    {"round": 2.0, "train_loss": 0.8},  # not an evaluation round
    {"round": 3.0, "acc_global": 0.4, "train_loss": 0.7},
    {"round": 4.0, "train_loss": math.nan, "diverged": 1.0},
]


def test_seed_score_final_or_best_and_nan_before_any_evaluation() -> None:
    assert seed_score(HISTORY, Objective(metric="acc_global", reduce="final")) == 0.4
    assert seed_score(HISTORY, Objective(metric="acc_global", reduce="best")) == 0.5
    assert seed_score(HISTORY, Objective(metric="train_loss", reduce="best")) == 0.7  # min for losses
    assert math.isnan(seed_score(HISTORY[1:2], Objective(metric="acc_global")))


def test_seed_score_mean_at_target_and_run_constants() -> None:
    history = [
        {"round": 1.0, "cost_round_s": 3.0, "cost_cum_up_gbit": 1.0, "acc_global": 0.55},
        {"round": 2.0, "cost_round_s": 1.0, "cost_cum_up_gbit": 2.0, "acc_global": 0.62, "rounds_to_target": 2.0},
        {"round": 3.0, "cost_round_s": 2.0, "cost_cum_up_gbit": 3.0, "acc_global": 0.64, "rounds_to_target": 2.0},
    ]
    assert seed_score(history, Objective(metric="cost_round_s", reduce="mean")) == 2.0
    assert seed_score(history, Objective(metric="cost_cum_up_gbit", reduce="at_target")) == 2.0  # FedAlign Table 8
    assert seed_score(history, Objective(metric="rounds_to_target")) == 2.0
    assert math.isnan(seed_score(history[:1], Objective(metric="cost_cum_up_gbit", reduce="at_target")))  # never reached
    constants = {"cost_stored_params": 1.2e6}
    assert seed_score(history, Objective(metric="cost_stored_params"), constants) == 1.2e6


def test_rounds_to_target_is_reported_from_the_round_it_is_reached_on() -> None:
    rows = [{"round": 1.0, "acc_global": 0.4}, {"round": 2.0}, {"round": 3.0, "acc_global": 0.61}]
    assert reached_target(rows[:2], "acc_global", 0.6) == {}
    assert reached_target(rows, "acc_global", 0.6) == {"rounds_to_target": 3.0}
    assert reached_target([*rows, {"round": 4.0, "acc_global": 0.59}], "acc_global", 0.6) == {"rounds_to_target": 3.0}
    assert reached_target(rows, "acc_global", None) == {}


def test_last_good_carries_values_over_and_ignores_nan() -> None:
    assert last_good(HISTORY) == {"round": 4.0, "acc_global": 0.4, "train_loss": 0.7, "diverged": 1.0}


def test_status_of_a_trial() -> None:
    assert classify({"round": 3, "status": "finished"}, errored=False) == "finished"  # with or without done
    assert classify({"round": 1, "status": "running", "done": True}, errored=False) == "stopped"
    assert classify({"round": 1, "status": "diverged"}, errored=False) == "diverged"
    assert classify({"round": 1, "status": "running"}, errored=True) == "failed"
    assert classify({"round": 1, "status": "running"}, errored=False) == "running"  # shut down by Ctrl-C
    assert classify({}, errored=False) == "pending"


def test_ranking_puts_scored_trials_first_and_never_picks_a_diverged_one() -> None:
    rows = [
        make_row("div", {}, {"round": 2, "status": "diverged", "objective": 0.99}, False),
        make_row("low", {}, {"round": 3, "status": "finished", "objective": 0.6}, False),
        make_row("high", {}, {"round": 3, "status": "finished", "objective": 0.8}, False),
        make_row("err", {}, {}, True),
        make_row("asha", {}, {"round": 1, "status": "running", "done": True, "objective": 0.3}, False),
    ]
    assert [r.trial_id for r in rank(rows, "max")] == ["high", "low", "asha", "div", "err"]
    assert [r.trial_id for r in rank(rows, "min")][:3] == ["asha", "low", "high"]
    assert best(rows, "max").trial_id == "high"
    assert best(rows[3:4], "max") is None


def test_a_job_with_trials_missing_or_not_ended_is_unfinished() -> None:
    """A stop can come before Tune created every trial (or any): such a job resumes, it has not ended."""
    done = make_row("a", {}, {"status": "finished", "round": 3}, errored=False)
    running = make_row("b", {}, {"round": 1}, errored=False)
    failed = make_row("c", {}, {"round": 1}, errored=True)
    assert unfinished([], 2) and unfinished([done], 2) and unfinished([done, running], 2)
    assert not unfinished([done, failed], 2)
