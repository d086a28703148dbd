"""The paper tables as data: printed values, cells that validate at every scale, lookups."""

from __future__ import annotations

import pytest

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.reproduce.plan import cell_tree
from fltune.reproduce.registry import all_tables, get_table


def test_table2_holds_the_papers_numbers_and_layout() -> None:
    table = get_table("table2")  # the alias of simfafl:table2
    assert table.key == "simfafl:table2" and len(table.cells) == 11 * 8
    fmnist = {(c.row, c.column): c for c in table.cells if c.dataset == "fmnist"}
    assert len(fmnist) == 22
    assert fmnist[("SimFAFL", "non-IID1")].paper == pytest.approx(96.74)
    assert fmnist[("FedAvg", "non-IID2")].paper == pytest.approx(86.6588)
    assert fmnist[("FedAvg-FT", "non-IID1")].metric == "acc_personalized_ft"
    assert fmnist[("FedPer", "non-IID1")].metric == "acc_personalized"
    assert fmnist[("LG-FedAvg", "non-IID2")].settings["method.name"] == "lg_fedavg"


@pytest.mark.parametrize("table", all_tables(), ids=lambda t: t.key)
def test_every_cell_is_a_valid_experiment_at_every_scale(table) -> None:
    for scale in table.scales.values():
        for cell in table.cells:
            cfg = build_config(cell_tree(cell, scale, cell.dataset, []))
            assert cfg.method.name == cell.settings["method.name"]
            assert cfg.training.finetune_epochs == (scale.finetune_epochs if cell.finetune else 0)
            assert cfg.partition.eval_fraction == 0.3 and cfg.partition.pool_test


def test_simfafl_cells_take_the_papers_betas_per_dataset() -> None:
    table = get_table("simfafl:table2")
    by = {(c.row, c.dataset, c.column): c for c in table.cells}
    quick = table.scales["quick"]
    cifar100 = build_config(cell_tree(by[("SimFAFL", "cifar100", "non-IID2")], quick, "cifar100", []))
    assert (cifar100.method.params.beta1, cifar100.method.params.beta2) == (0.003, 0.2)
    assert cifar100.partition.alpha == 0.3
    fmnist = build_config(cell_tree(by[("SimFAFL", "fmnist", "non-IID1")], quick, "fmnist", []))
    assert (fmnist.method.params.beta1, fmnist.method.params.beta2) == (0.0025, 0.1)
    assert fmnist.partition.kind == "classes"
    ablation = {c.row: c for c in get_table("table3").cells if c.dataset == "fmnist" and c.column == "non-IID1"}
    assert ablation["with L_ca"].settings["method.beta2"] == 0.0 and "method.beta1" not in ablation["with L_ca"].settings


def test_unknown_table_lists_the_known_ones() -> None:
    with pytest.raises(FLTuneError, match=r"unknown table 'table9'; allowed: table2, .*simfafl:table4"):
        get_table("table9")
