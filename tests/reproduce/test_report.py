"""Paper-vs-measured reporting from trial rows (no Ray): values, Δ, no-data cells, CSV, Markdown, ETA."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from fltune.reproduce.job import new_spec
from fltune.reproduce.plan import PlannedCell, plan
from fltune.reproduce.registry import get_table
from fltune.reproduce.report import eta, markdown, results, write_csv
from fltune.tune.results import TrialRow
from tests.conftest import needs_fmnist


def row(cell: str, status: str, objective: float, std: float = 0.0, seconds: float = 60.0) -> TrialRow:
    return TrialRow(trial_id=cell[:6], status=status, params={"cell": cell}, round=20, objective=objective,
                    objective_std=std, metrics={"time_total_s": seconds})


@pytest.fixture()
def spec(tmp_path: Path):
    table = get_table("table2")
    planned = plan(table, "quick", ["fmnist"], [], rows=["FedAvg", "SimFAFL"])
    # pretend CIFAR-10's FedAvg cell was asked for but its data is missing
    missing = next(c for c in table.cells if c.row == "FedAvg" and c.dataset == "cifar10")
    planned.append(PlannedCell(missing, None, missing="data.dataset: cifar10 not found in /x"))
    return new_spec(table, "quick", planned, seeds=2, storage=str(tmp_path), name="t", out=None,
                    max_concurrent=None, datasets=None)


@needs_fmnist
def test_results_scale_to_percent_and_compute_delta(spec, tmp_path: Path) -> None:
    rows = [row("FedAvg | FMNIST non-IID1", "finished", 0.80, 0.01), row("SimFAFL | FMNIST non-IID1", "diverged", math.nan)]
    res = {r.cell.key: r for r in results(spec, rows)}
    fedavg = res["FedAvg | FMNIST non-IID1"]
    assert fedavg.measured == pytest.approx(80.0) and fedavg.std == pytest.approx(1.0)
    assert fedavg.delta == pytest.approx(80.0 - 84.1754)
    assert res["SimFAFL | FMNIST non-IID1"].measured is None and res["SimFAFL | FMNIST non-IID1"].status == "diverged"
    assert res["FedAvg | FMNIST non-IID2"].status == "pending"
    assert res["FedAvg | CIFAR-10 non-IID1"].status == "no data"

    with write_csv(spec, list(res.values()), tmp_path / "t.csv").open() as f:
        by = {(r["method"], r["dataset"], r["partition"]): r for r in csv.DictReader(f)}
    first = by[("FedAvg", "FMNIST", "non-IID1")]
    assert (first["table"], first["paper"], first["measured"], first["std"], first["seeds"]) == (
        "simfafl:table2", "84.1754", "80.0000", "1.0000", "2")
    assert by[("FedAvg", "CIFAR-10", "non-IID1")]["measured"] == "" and by[("FedAvg", "CIFAR-10", "non-IID1")]["status"] == "no data"

    md = markdown(spec, list(res.values()))
    assert "| FedAvg | 80.00 ± 1.00 (paper 84.18, Δ -4.18) |" in md and "data.dataset: cifar10 not found" in md


@needs_fmnist
def test_a_diverged_cell_with_a_last_accuracy_says_it_diverged(spec) -> None:
    """Scaffold in FedSOL Table 2 at quick scale: NaN at round 20, 10 % accuracy at its last evaluation."""
    rows = [row("FedAvg | FMNIST non-IID1", "finished", 0.80), row("SimFAFL | FMNIST non-IID1", "diverged", 0.10)]
    res = {r.cell.key: r for r in results(spec, rows)}
    assert "| FedAvg | 80.00 ± 0.00 (paper" in markdown(spec, list(res.values()))
    assert "| SimFAFL | 10.00 ± 0.00 diverged r20 (paper" in markdown(spec, list(res.values()))


@needs_fmnist
def test_eta_from_finished_cells_and_those_running(spec) -> None:
    rows = [row("FedAvg | FMNIST non-IID1", "finished", 0.8, seconds=120.0),
            row("FedAvg | FMNIST non-IID2", "running", math.nan),
            row("SimFAFL | FMNIST non-IID1", "running", math.nan)]
    # 4 cells: 1 done (2 min), 2 running (count as half each) → 2 cell-lengths left over 2 at once = 2 min
    assert eta(rows, 4) == ", ETA ~2 min"
    assert eta(rows[1:], 4) == ""
