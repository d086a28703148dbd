"""Scores, statuses and ranking of trials (pure functions, no Ray)."""

from __future__ import annotations

import math

import pytest

from fltune.metrics.evaluation import rounds_to_target
from fltune.tune.results import (
    TrialRow, best, classify, error_line, failed_result, failure_lines, make_row, rank, sensitivity_figure,
    trials_figure, unfinished, write_csv,
)
from fltune.tune.space import Objective, SearchSpace
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


def test_seed_score_last_3_averages_the_last_three_evaluations() -> None:
    """Rounds without a finite value (not evaluated, diverged) are skipped, not counted; fewer than three values
    average what there is."""
    history = [*HISTORY, {"round": 5.0, "acc_global": 0.7}, {"round": 6.0, "acc_global": math.nan},
               {"round": 7.0, "acc_global": 0.9}]
    last_3 = Objective(metric="acc_global", reduce="last_3")
    assert seed_score(history, last_3) == pytest.approx((0.4 + 0.7 + 0.9) / 3)
    assert seed_score(HISTORY, last_3) == pytest.approx((0.5 + 0.4) / 2)
    assert math.isnan(seed_score(HISTORY[1:2], last_3))


def test_seed_score_mean_at_target_and_run_constants() -> None:
    history = [
        {"round": 1.0, "cost_round_s": 3.0, "cost_cum_up_gbit": 1.0, "acc_global": 0.55},
        {"round": 2.0, "cost_round_s": 1.0, "cost_cum_up_gbit": 2.0, "acc_global": 0.62, "rounds_to_target": 2.0},
        {"round": 3.0, "cost_round_s": 2.0, "cost_cum_up_gbit": 3.0, "acc_global": 0.64, "rounds_to_target": 2.0},
    ]
    assert seed_score(history, Objective(metric="cost_round_s", reduce="mean")) == 2.0
    assert seed_score(history, Objective(metric="cost_cum_up_gbit", reduce="at_target")) == 2.0  # FedAlign Table 8
    assert seed_score(history, Objective(metric="rounds_to_target")) == 2.0
    never_reached = seed_score(history[:1], Objective(metric="cost_cum_up_gbit", reduce="at_target"))
    assert math.isnan(never_reached)
    constants = {"cost_stored_params": 1.2e6}
    assert seed_score(history, Objective(metric="cost_stored_params"), constants) == 1.2e6


def test_rounds_to_target_is_reported_from_the_round_it_is_reached_on() -> None:
    rows = [{"round": 1.0, "acc_global": 0.4}, {"round": 2.0}, {"round": 3.0, "acc_global": 0.61}]
    assert rounds_to_target(rows[:2], "acc_global", 0.6) is None
    assert rounds_to_target(rows, "acc_global", 0.6) == 3
    assert rounds_to_target([*rows, {"round": 4.0, "acc_global": 0.59}], "acc_global", 0.6) == 3


def test_last_good_carries_values_over_and_ignores_nan() -> None:
    assert last_good(HISTORY) == {"round": 4.0, "acc_global": 0.4, "train_loss": 0.7, "diverged": 1.0}


def test_status_of_a_trial() -> None:
    assert classify({"round": 3, "status": "finished"}, errored=False) == "finished"  # with or without done
    assert classify({"round": 1, "status": "running", "done": True}, errored=False) == "stopped"
    assert classify({"round": 1, "status": "diverged"}, errored=False) == "diverged"
    assert classify({"round": 1, "status": "running"}, errored=True) == "failed"
    assert classify(failed_result(ValueError("partition.alpha: refused")), errored=False) == "failed"
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


def test_tied_trials_rank_in_the_order_tune_created_them_however_they_are_listed() -> None:
    """A resumed study lists its trials in another order: its best (and best_config.yaml, a comparison's tuned
    values) used to flip between tied trials (three FedProx trials at acc_global 0.312, measured)."""
    rows = [make_row(f"t{tag[0]}", {}, {"round": 4, "status": "finished", "objective": 0.312, "experiment_tag": tag},
                     False) for tag in ("3_method_mu=0.0258", "1_method_mu=0.0157", "2_method_mu=0.0726")]
    assert [r.created for r in rows] == [3, 1, 2]
    for listed in (rows, rows[::-1], rows[1:] + rows[:1]):
        assert [r.trial_id for r in rank(listed, "max")] == ["t1", "t2", "t3"]
        assert best(listed, "min").trial_id == "t1"


def test_a_job_with_trials_missing_or_not_ended_is_unfinished() -> None:
    """A stop can come before Tune created every trial (or any): such a job resumes, it has not ended."""
    done = make_row("a", {}, {"status": "finished", "round": 3}, errored=False)
    running = make_row("b", {}, {"round": 1}, errored=False)
    failed = make_row("c", {}, {"round": 1}, errored=True)
    assert unfinished([], 2) and unfinished([done], 2) and unfinished([done, running], 2)
    assert not unfinished([done, failed], 2)


# A trial's error.txt as Tune wrote it on an H100 (trimmed): its last failure of three, raised in torch's
# compiler inside a Ray worker, fltune's frames in the trial process before Ray's re-raise line.
COMPILER_TRACE = """Failure # 3 (occurred at 2026-11-28_00-08-09)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=8962, ip=192.0.2.2, repr=run_cell)
  File "/tmp/site/ray/tune/trainable/function_trainable.py", line 249, in _trainable_func
    output = fn()
  File "/home/u/fltune/fltune/engine/pool.py", line 170, in map
    return own + ray.get(refs)
ray.exceptions.RayTaskError: \x1b[36mray::ClientWorker.train()\x1b[39m (pid=10124, ip=192.0.2.2)
  File "/home/u/fltune/fltune/engine/worker.py", line 151, in train
    return self._pack(self._train_groups(result, inputs, client_ids, states, global_tensors))
  File "/opt/torch/lib/python3.12/site-packages/torch/_dynamo/convert_frame.py", line 729, in __call__
    result = _compile(
  File "/opt/torch/lib/python3.12/site-packages/torch/_dynamo/side_effects.py", line 792, in codegen_save_tempvars
    assert var.mutation_type.cls_source is not None
AssertionError: 

from user code:
   File "/home/u/fltune/fltune/engine/batched.py", line 383, in _take
    return out._replace(carry=_kept(out.carry, inputs, live)), live, correct

Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace
"""

RAISED_TRACE = """Failure # 1 (occurred at 2026-11-28_01-00-00)
ray.exceptions.RayTaskError(FLTuneError): \x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=1, ip=127.0.0.1)
  File "/x/site-packages/torch/_dynamo/eval_frame.py", line 1024, in _fn
    return fn(*args, **kwargs)
  File "/x/site-packages/fltune/data/federated.py", line 207, in load
    raise FLTuneError(f"data.root: {root} holds no FMNIST")
fltune.errors.FLTuneError: data.root: /data holds no FMNIST
"""


def test_error_line_names_the_last_exception_and_the_last_fltune_frame_it_passed() -> None:
    """Ray's wrapper lines and torch's frames are left out; an empty message leaves the exception's name; a
    failure inside torch's compiler says so (a dynamo wrapper around an uncompiled call does not)."""
    compiling = " in torch.compile (resources.compile=false runs without it)"
    assert error_line(COMPILER_TRACE) == "AssertionError (fltune/engine/batched.py:383, _take)" + compiling
    assert error_line(RAISED_TRACE) == (
        "FLTuneError: data.root: /data holds no FMNIST (fltune/data/federated.py:207, load)")
    assert error_line("Failure # 1\nray.exceptions.ActorDiedError: The actor died unexpectedly\n") == (
        "ActorDiedError: The actor died unexpectedly")
    assert error_line("Failure # 1\nthe worker died unexpectedly\n\n") == "the worker died unexpectedly"
    assert error_line("") == "no trace"


def test_failure_lines_give_one_line_per_reason_with_a_count_and_a_trace_to_read() -> None:
    traces = [("/s/job/run_cell_0", COMPILER_TRACE), ("/s/job/run_cell_1", RAISED_TRACE),
              ("/s/job/run_cell_2", COMPILER_TRACE)]
    assert failure_lines(traces) == [
        "fltune: 2 trial(s) failed: AssertionError (fltune/engine/batched.py:383, _take) in torch.compile "
        "(resources.compile=false runs without it); trace: /s/job/run_cell_0/error.txt",
        "fltune: 1 trial(s) failed: FLTuneError: data.root: /data holds no FMNIST "
        "(fltune/data/federated.py:207, load); trace: /s/job/run_cell_1/error.txt",
    ]
    assert failure_lines([]) == []
    # trials fltune refused (``failed_result``) come with their reason and no trace, grouped with the others
    refused = ["partition.alpha: 1e-06 leaves clients empty", "partition.alpha: 1e-06 leaves clients empty"]
    assert failure_lines([("/s/job/run_cell_1", RAISED_TRACE)], refused) == [
        "fltune: 1 trial(s) failed: FLTuneError: data.root: /data holds no FMNIST "
        "(fltune/data/federated.py:207, load); trace: /s/job/run_cell_1/error.txt",
        "fltune: 2 trial(s) failed: partition.alpha: 1e-06 leaves clients empty"]
    assert failure_lines([("/s/job/run_cell_3", COMPILER_TRACE.replace("# 3", "# 2") + RAISED_TRACE)]) == [
        "fltune: 1 trial(s) failed: FLTuneError: data.root: /data holds no FMNIST "
        "(fltune/data/federated.py:207, load); trace: /s/job/run_cell_3/error.txt"]  # its last failure's reason


SPACE = SearchSpace.model_validate({
    "params": {"method.mu": {"type": "loguniform", "low": 1e-4, "high": 1.0},
               "training.lr": {"type": "choice", "values": [0.1, 0.01, 0.05]},
               "model.name": {"type": "choice", "values": ["mlp", "cnn"]}},
    "objective": {"metric": "acc_global"}})
ROWS = [TrialRow("a", "finished", {"method.mu": 0.01, "training.lr": 0.05, "model.name": "cnn"}, 4, 0.8, 0.0,
                 {"acc_global": 0.8}),
        TrialRow("b", "stopped", {"method.mu": 0.5, "training.lr": 0.1, "model.name": "mlp"}, 2, 0.6, 0.0,
                 {"acc_global": 0.6}),
        TrialRow("c", "finished", {"method.mu": 0.001, "training.lr": 0.01, "model.name": "mlp"}, 4, 0.7, 0.0,
                 {"acc_global": 0.7})]


def test_sensitivity_axes_are_sorted_log_where_sampled_so_in_percent_and_mark_asha_stops() -> None:
    mu, lr, model = sensitivity_figure(ROWS, SPACE, "s").axes
    assert mu.get_xscale() == "log" and lr.get_xscale() == model.get_xscale() == "linear"
    assert list(lr.get_xticks()) == [0.01, 0.05, 0.1]  # numbers in order, not as the space lists them
    assert [t.get_text() for t in model.get_xticklabels()] == ["mlp", "cnn"]  # names in the space's order
    finished, stopped = mu.collections
    assert sorted(y for _, y in finished.get_offsets()) == [70.0, 80.0]  # accuracy in percent
    assert stopped.get_facecolors().size == 0 and finished.get_facecolors().size > 0  # stopped: hollow
    assert [text.get_text() for text in mu.texts] == ["r2"]  # the round its score is from
    assert mu.get_ylabel() == "acc_global (%), final"


def test_trials_figure_draws_every_trial_per_round_and_the_best_on_top() -> None:
    curves = {"a": {1: 0.5, 2: 0.8}, "b": {1: 0.6}, "c": {1: 0.4, 2: 0.7}}
    (ax,) = trials_figure(curves, "a", SPACE, "s").axes
    assert len(ax.lines) == 3 and ax.get_xlabel() == "round"
    best_line = max(ax.lines, key=lambda line: line.get_linewidth())
    assert best_line.get_label() == "best: a" and list(best_line.get_ydata()) == [50.0, 80.0]
    assert all(tick == round(tick) for tick in ax.get_xticks())


def test_trials_csv_has_a_column_only_for_what_some_trial_measured(tmp_path) -> None:
    columns = write_csv(ROWS, SPACE, tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert "acc_global" in columns and "acc_personalized" not in columns and "worker_nodes" not in columns
