"""Planning a job: subsets, missing datasets as "no data", substitution, bad input as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fltune.errors import FLTuneError
from fltune.reproduce.plan import plan
from fltune.reproduce.registry import get_table
from tests.conftest import FMNIST_DIR, needs_fmnist


@pytest.fixture()
def fmnist_only(tmp_path: Path) -> Path:
    """A data root holding FMNIST (links to Debian's files, flat layout) and nothing else."""
    for gz in FMNIST_DIR.glob("*.gz"):
        (tmp_path / gz.name).symlink_to(gz)
    return tmp_path


@needs_fmnist
def test_missing_datasets_are_no_data_with_the_loaders_message(fmnist_only: Path) -> None:
    planned = plan(get_table("table2"), "quick", None, [f"data.root={fmnist_only}"], rows=["SimFAFL"])
    assert [p.cell.dataset for p in planned if p.runnable] == ["fmnist", "fmnist"]
    missing = {p.cell.dataset: p.missing for p in planned if not p.runnable}
    assert set(missing) == {"emnist_letters", "cifar10", "cifar100"}
    assert str(fmnist_only) in missing["cifar10"] and "download" in missing["cifar10"]


@needs_fmnist
def test_datasets_to_download_are_planned_as_they_are_and_fetched_only_by_the_job(fmnist_only: Path) -> None:
    """With ``data.download`` the job fetches what is missing before Ray starts; the plan itself fetches
    nothing and substitutes nothing: a cell whose data is not here yet is runnable and marked ``fetched``."""
    planned = plan(get_table("table2"), "quick", None, [f"data.root={fmnist_only}", "data.download=true"],
                   rows=["SimFAFL"])
    assert all(p.runnable and not p.substituted for p in planned)
    assert {p.tree["data"]["dataset"]: p.fetched for p in planned} == {
        "fmnist": False, "emnist_letters": True, "cifar10": True, "cifar100": True}


@needs_fmnist
def test_quick_table4_substitutes_fmnist_and_says_so(fmnist_only: Path) -> None:
    planned = plan(get_table("table4"), "quick", None, [f"data.root={fmnist_only}"])
    assert all(p.runnable and p.substituted == "fmnist for cifar100" for p in planned)
    assert planned[0].tree["data"]["dataset"] == "fmnist"
    paper = plan(get_table("table4"), "paper", None, [f"data.root={fmnist_only}"])
    assert not any(p.runnable for p in paper)  # the paper scale never substitutes


def test_subsets_and_overrides_apply_to_every_cell() -> None:
    planned = plan(get_table("table2"), "quick", ["FMNIST"], ["federation.rounds=3"], rows=["FedAvg", "Ditto"])
    assert [(p.cell.row, p.cell.column) for p in planned] == [
        ("FedAvg", "non-IID1"), ("FedAvg", "non-IID2"), ("Ditto", "non-IID1"), ("Ditto", "non-IID2")]
    assert all(p.tree["federation"]["rounds"] == 3 for p in planned)


@pytest.mark.parametrize("kwargs, message", [
    ({"scale_name": "huge"}, "--scale: simfafl:table2 has no scale 'huge'; allowed: paper, quick"),
    ({"datasets": ["svhn"]}, "--datasets: 'svhn' is not a dataset of simfafl:table2; allowed: emnist_letters"),
    ({"rows": ["FedXYZ"]}, "--rows: 'FedXYZ' is not a row of simfafl:table2; allowed: FedAvg, FedAvg-FT"),
    ({"overrides": ["training.lr=-1"]}, "training.lr"),
])
def test_bad_input_is_one_line_naming_the_flag(kwargs: dict, message: str) -> None:
    args = {"scale_name": "quick", "datasets": ["fmnist"], "overrides": [], **kwargs}
    with pytest.raises(FLTuneError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(get_table("table2"), **args)


@needs_fmnist
def test_naming_the_substitute_selects_the_cells_it_stands_in_for_like_for_like(fmnist_only: Path) -> None:
    planned = plan(get_table("fedsol:table2"), "quick", ["fmnist"], [f"data.root={fmnist_only}"])
    assert planned and {p.cell.dataset for p in planned} == {"mnist"}
    assert all(p.substituted == "fmnist for mnist" for p in planned)
    with pytest.raises(FLTuneError, match="--datasets: 'fmnist' is not a dataset of fedsol:table2"):
        plan(get_table("fedsol:table2"), "paper", ["fmnist"], [])  # the paper scale substitutes nothing
