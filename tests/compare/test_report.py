"""The comparison's table: which accuracies it reports, read from a cell's last results."""

from __future__ import annotations

import math

import pytest

from fltune.compare.report import cell_figures, columns
from fltune.compare.spec import new_spec
from fltune.tune.results import TrialRow
from fltune.tune.space import set_dotted

BASE = {"data.dataset": "synthetic", "federation.clients": 4, "partition.eval_fraction": 0.2}


def spec(tmp_path, **settings):
    return new_spec(methods=["fedavg", "fedrep"], base=set_dotted({}, {**BASE, **settings}), seeds=1,
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
    base = set_dotted({}, {**BASE, "tracking.uri": f"sqlite:///{tmp_path}/store/mlflow.db"})
    comparison = new_spec(methods=["fedavg"], base=base, seeds=1, tune_budget=None, storage=str(tmp_path), name="c",
                          out=None, max_concurrent=None)
    assert comparison.out == str(tmp_path / "store" / "compare" / "c")
