"""The comparison's table: which accuracies it reports, read from a cell's last results."""

from __future__ import annotations

import io
from dataclasses import replace
import math

import pytest
from rich.console import Console

from fltune.config import set_fields
from fltune.compare.report import cell_figures, columns, live_board, results, rich_table
from fltune.compare.spec import new_spec
from fltune.tune.results import TrialRow

BASE = {"data.dataset": "synthetic", "federation.clients": 4, "partition.eval_fraction": 0.2}


def spec(tmp_path, **settings):
    return new_spec(methods=["fedavg", "fedrep"], base=set_fields({}, {**BASE, **settings}), seeds=1,
                    tune_budget=None, storage=str(tmp_path), name="c", out=str(tmp_path / "out"), max_concurrent=None)


@pytest.mark.parametrize(("finetune", "reported"), [(0, False), (1, True)])
def test_a_fine_tuning_setting_reports_the_fine_tuned_accuracy_once(tmp_path, finetune, reported):
    """The papers' "-FT" figure: final only (it is measured once, after the last round)."""
    comparison = spec(tmp_path, **{"training.finetune_epochs": finetune})
    assert ("final acc_personalized_ft" in columns(comparison)) is reported
    assert "best acc_personalized_ft" not in columns(comparison)
    last = {"acc_global": 0.5, "acc_personalized": 0.6, "acc_personalized_ft": 0.7}
    row = TrialRow(trial_id="t", status="finished", params={"cell": "fedrep/seed0"}, round=2, objective=math.nan,
                   objective_std=math.nan, metrics=last)
    assert cell_figures(comparison, row).get("final acc_personalized_ft") == (0.7 if reported else None)


def test_the_files_go_beside_the_store_the_runs_are_logged_to(tmp_path):
    """Not ``./mlruns/compare`` when ``tracking.uri`` points elsewhere."""
    base = set_fields({}, {**BASE, "tracking.uri": f"sqlite:///{tmp_path}/store/mlflow.db"})
    comparison = new_spec(methods=["fedavg"], base=base, seeds=1, tune_budget=None, storage=str(tmp_path), name="c",
                          out=None, max_concurrent=None)
    assert comparison.out == str(tmp_path / "store" / "compare" / "c")


def test_the_terminal_table_reads_in_100_columns(tmp_path):
    """Every reported accuracy, rounds to target and the test, uncut at 100 columns (the live board's too:
    each running cell's round); the files keep every column."""
    comparison = new_spec(methods=["fedavg", "fedprox", "fedrep"], base=set_fields({}, {
        **BASE, "training.finetune_epochs": 1, "metrics.target": 0.5}), seeds=3, tune_budget=None,
        storage=str(tmp_path), name="c", out=str(tmp_path / "out"), max_concurrent=None)
    rows = [TrialRow(trial_id=f"t{i}", status="running" if i == 8 else "finished", params={"cell": cell},
                     round=3, objective=math.nan, objective_std=math.nan,
                     metrics={"acc_global": 0.61 + i / 100, "acc_all_model": 0.6, "acc_personalized": 0.812345,
                              "acc_personalized_ft": 0.85, "rounds_to_target": 7, "time_total_s": 1234.5})
            for i, cell in enumerate(comparison.cells)]
    ended = [replace(row, status="finished") for row in rows]
    for table in (rich_table(comparison, results(comparison, ended), f"compare {comparison.name}: final accuracies, "
                             "mean ± std over seeds"), live_board(comparison, rows)):
        out = Console(file=io.StringIO(), width=100)
        out.print(table)
        lines = out.file.getvalue().splitlines()
        assert max(map(len, lines)) <= 100 and "…" not in out.file.getvalue(), "\n".join(lines)
        assert "★ fedrep" in out.file.getvalue() and "62.00±1.00" in out.file.getvalue()
    assert "2/3 r3/10" in out.file.getvalue()  # the board: fedrep's third seed running, at round 3 of 10
