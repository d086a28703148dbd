"""Paper-vs-measured reporting from trial rows (no Ray): values, Δ or ranks and Kendall τ-b, no-data cells,
CSV, Markdown, ETA."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from fltune.reproduce.job import new_spec
from fltune.reproduce.plan import PlannedCell, plan
from fltune.reproduce.registry import get_table
from fltune.reproduce.report import column_taus, kendall_tau_b, markdown, results, tau_metrics, write_csv
from fltune.tune.results import TrialRow
from tests.conftest import needs_fmnist


def row(cell: str, status: str, objective: float, std: float = 0.0, seconds: float = 60.0) -> TrialRow:
    return TrialRow(trial_id=cell[:6], status=status, params={"cell": cell}, round=20, objective=objective,
                    objective_std=std, metrics={"time_total_s": seconds})


def job(tmp_path: Path, scale: str, rows: list[str]):
    table = get_table("table2")
    planned = plan(table, scale, ["fmnist"], [], rows=rows)
    # pretend CIFAR-10's FedAvg cell was asked for but its data is missing
    missing = next(c for c in table.cells if c.row == "FedAvg" and c.dataset == "cifar10")
    planned.append(PlannedCell(missing, None, missing="data.dataset: cifar10 not found in /x"))
    return new_spec(table, scale, planned, seeds=2, storage=str(tmp_path), name="t", out=None,
                    max_concurrent=None)


@pytest.fixture()
def spec(tmp_path: Path):
    return job(tmp_path, "quick", ["FedAvg", "SimFAFL"])


@needs_fmnist
def test_paper_scale_on_the_papers_dataset_shows_delta(tmp_path: Path) -> None:
    paper = job(tmp_path, "paper", ["FedAvg", "SimFAFL"])
    rows = [row("FedAvg | FMNIST non-IID1", "finished", 0.80, 0.01),
            row("SimFAFL | FMNIST non-IID1", "diverged", math.nan)]
    res = {r.cell.key: r for r in results(paper, rows)}
    fedavg = res["FedAvg | FMNIST non-IID1"]
    assert fedavg.measured == pytest.approx(80.0) and fedavg.std == pytest.approx(1.0)
    assert not fedavg.ordering and fedavg.delta == pytest.approx(80.0 - 84.1754)
    assert res["SimFAFL | FMNIST non-IID1"].measured is None and res["SimFAFL | FMNIST non-IID1"].status == "diverged"
    assert res["FedAvg | FMNIST non-IID2"].status == "pending"
    assert res["FedAvg | CIFAR-10 non-IID1"].status == "no data"

    with write_csv(paper, list(res.values()), tmp_path / "t.csv").open() as f:
        by = {(r["method"], r["dataset"], r["partition"]): r for r in csv.DictReader(f)}
    first = by[("FedAvg", "FMNIST", "non-IID1")]
    assert (first["table"], first["paper"], first["measured"], first["std"], first["delta"], first["seeds"]) == (
        "simfafl:table2", "84.1754", "80.0000", "1.0000", "-4.1754", "2")
    no_data = by[("FedAvg", "CIFAR-10", "non-IID1")]
    assert no_data["measured"] == "" and no_data["status"] == "no data"

    md = markdown(paper, list(res.values()))
    assert "| FedAvg | 80.00 ± 1.00 (paper 84.18, Δ -4.18) |" in md and "data.dataset: cifar10 not found" in md
    assert "- FedAvg: fedavg, lr 0.01 — README" in md  # each row's settings under the table


def test_kendall_tau_b_by_hand() -> None:
    """τ-b = (C − D) / √((n0 − n_x)(n0 − n_y)); scipy.stats.kendalltau's default variant, worked by hand."""
    assert kendall_tau_b([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau_b([1, 2, 3], [30, 20, 10]) == -1.0
    # pairs (12)(13)(14)(23)(24)(34): only (23) discordant → (5 − 1) / 6
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # a tie in x: pair (12) is tied in x only → C = 2, D = 0, untied x-pairs 2, y-pairs 3 → 2 / √6
    assert kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    # ties on both sides of the same pair count in neither: x (1,1,2,3) y (5,5,6,4)
    # pairs: (12) tied both; (13) C; (14) D; (23) C; (24) D; (34) D → C 2, D 3, untied 5 each → −1/5
    assert kendall_tau_b([1, 1, 2, 3], [5, 5, 6, 4]) == pytest.approx(-0.2)
    assert kendall_tau_b([1.0], [2.0]) is None and kendall_tau_b([1, 1], [1, 2]) is None


@needs_fmnist
def test_quick_scale_shows_ranks_and_kendall_tau_instead_of_delta(tmp_path: Path) -> None:
    """FMNIST non-IID1 paper values: FedAvg 84.18, FedPer 95.09, Ditto 91.14, SimFAFL 96.74 (ranks 4, 2, 3, 1)."""
    quick = job(tmp_path, "quick", ["FedAvg", "FedPer", "Ditto", "SimFAFL"])
    measured = {"FedAvg": 0.70, "FedPer": 0.90, "Ditto": 0.92, "SimFAFL": 0.80}  # ranks 4, 2, 1, 3
    rows = [row(f"{m} | FMNIST non-IID1", "finished", v) for m, v in measured.items()]
    res = {r.cell.key: r for r in results(quick, rows)}
    fedper = res["FedPer | FMNIST non-IID1"]
    assert fedper.ordering and fedper.delta is None and (fedper.rank, fedper.paper_rank) == (2, 2)
    assert [(res[f"{m} | FMNIST non-IID1"].rank, res[f"{m} | FMNIST non-IID1"].paper_rank) for m in measured] == [
        (4, 4), (2, 2), (1, 3), (3, 1)]
    # pairs over (FedAvg, FedPer, Ditto, SimFAFL): measured 70 90 92 80, paper 84.18 95.09 91.14 96.74
    # (Avg,Per) C (Avg,Ditto) C (Avg,Sim) C (Per,Ditto) D (Per,Sim) D (Ditto,Sim) D → (3 − 3)/6 = 0
    taus = column_taus(list(res.values()))
    assert taus[("fmnist", "non-IID1")] == pytest.approx(0.0) and taus[("fmnist", "non-IID2")] is None
    assert tau_metrics(list(res.values())) == {"kendall_tau/FMNIST non-IID1": pytest.approx(0.0)}

    with write_csv(quick, list(res.values()), tmp_path / "t.csv").open() as f:
        by = {(r["method"], r["partition"]): r for r in csv.DictReader(f)}
    ditto = by[("Ditto", "non-IID1")]
    assert (ditto["delta"], ditto["rank"], ditto["paper_rank"], ditto["kendall_tau"]) == ("", "1", "3", "0.0000")
    md = markdown(quick, list(res.values()))
    assert "| Ditto | 92.00 ± 0.00 (rank 1; paper 91.14, rank 3) |" in md and "Δ" not in md.split("\n\n")[2]
    assert "| Kendall τ-b vs the paper's order | +0.00 | — |" in md
    assert f"`quick` scale: {quick.paper_table.scales['quick'].note}." in md.split("\n\n")[1]  # the file says how


@needs_fmnist
def test_a_diverged_cell_with_a_last_accuracy_says_it_diverged(spec) -> None:
    """Scaffold in FedSOL Table 2 at quick scale: NaN at round 20, 10 % accuracy at its last evaluation."""
    rows = [row("FedAvg | FMNIST non-IID1", "finished", 0.80), row("SimFAFL | FMNIST non-IID1", "diverged", 0.10)]
    res = {r.cell.key: r for r in results(spec, rows)}
    assert "| FedAvg | 80.00 ± 0.00 (rank 1; paper" in markdown(spec, list(res.values()))
    assert "| SimFAFL | 10.00 ± 0.00 diverged r20 (rank 2; paper" in markdown(spec, list(res.values()))
