"""The paper tables as data: printed values, cells that validate at every scale, lookups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fltune.config import build_config
from fltune.data.datasets import NUM_CLASSES
from fltune.engine.builders import build_model_for
from fltune.errors import FLTuneError
from fltune.metrics.probe import probe_of
from fltune.reproduce.papers import fedalign, fedsol, man, simfafl
from fltune.reproduce.plan import cell_tree
from fltune.reproduce.registry import all_tables, get_table


def test_no_table_and_no_cell_of_a_table_is_listed_twice() -> None:
    """A key or a cell listed twice in ``papers/`` would hide one of them (the registry keeps the last table,
    ``PaperTable.cell`` the first cell)."""
    listed = [*fedalign.TABLES, *fedsol.TABLES, *man.TABLES, *simfafl.TABLES]
    assert len({table.key for table in listed}) == len(listed) == len(all_tables())
    for table in listed:
        assert len({cell.key for cell in table.cells}) == len(table.cells), table.key


def test_table2_holds_the_papers_numbers_and_layout() -> None:
    table = get_table("table2")  # the alias of simfafl:table2
    assert table.key == "simfafl:table2" and len(table.cells) == 11 * 8
    fmnist = {(c.row, c.column): c for c in table.cells if c.dataset == "fmnist"}
    assert len(fmnist) == 22
    assert fmnist[("SimFAFL", "non-IID1")].paper == pytest.approx(96.74)
    assert fmnist[("FedAvg", "non-IID2")].paper == pytest.approx(86.6588)
    assert fmnist[("FedAvg-FT", "non-IID1")].metric == "acc_personalized_ft"
    assert fmnist[("FedPer", "non-IID1")].metric == "acc_personalized_ft"  # FedCR's last round
    assert fmnist[("FedAvg", "non-IID1")].metric == "acc_personalized"
    assert fmnist[("LG-FedAvg", "non-IID2")].settings["method.name"] == "lg_fedavg"


@pytest.mark.parametrize("table", all_tables(), ids=lambda t: t.key)
def test_every_cell_is_a_valid_experiment_at_every_scale(table) -> None:
    """Every cell builds (``cell_tree`` also checks its metric's needs: a target, a Hessian probe) at every
    scale, on its own dataset and on the quick scale's stand-in, and evaluates the protocol it reads."""
    quick = table.scales["quick"]
    assert quick.substitute == "fmnist" or "fmnist" in table.datasets  # every quick scale runs here
    runs = [(scale, None) for scale in table.scales.values()]
    runs += [(quick, quick.substitute)] if quick.substitute else []
    for scale, stand_in in runs:
        for cell in table.cells:
            cfg = build_config(cell_tree(cell, scale, stand_in or cell.dataset, []))
            assert cfg.method.name == cell.settings["method.name"]
            own = cell.settings.get("training.finetune_epochs", 0)  # a cell's own τ (FedSOL Table 9)
            assert cfg.training.finetune_epochs == (scale.finetune_epochs if cell.finetune else own)
            probe = probe_of(cell.metric)
            assert probe is None or probe.protocol in (None, *cfg.metrics.protocols)
            if table.key.startswith("simfafl:"):
                assert cfg.partition.eval_fraction == 0.3 and cfg.partition.pool_test


def input_shape(dataset: str) -> tuple[int, int, int]:
    """Grey 28×28 for the MNIST family, colour 32×32 for the rest (CIFAR, SVHN, synthetic stand-ins)."""
    return (1, 28, 28) if dataset in ("mnist", "fmnist", "emnist_letters") else (3, 32, 32)


@pytest.mark.parametrize("table", all_tables(), ids=lambda t: t.key)
def test_every_cells_method_accepts_its_model(table) -> None:
    """The model a cell names (or ``auto``) is one its method can adapt, e.g. FedSR needs a VIB net."""
    scale = table.scales["paper"]
    seen = set()
    for cell in table.cells:
        cfg = build_config(cell_tree(cell, scale, cell.dataset, []))
        if (cfg.method.name, cfg.model.name, cell.dataset) in seen:
            continue
        seen.add((cfg.method.name, cfg.model.name, cell.dataset))
        data = SimpleNamespace(input_shape=input_shape(cell.dataset), num_classes=NUM_CLASSES[cell.dataset])
        build_model_for(cfg, data)  # raises FLTuneError naming model.name when the method refuses it


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
    assert ablation["with L_ca"].settings["method.beta2"] == 0.0
    assert "method.beta1" not in ablation["with L_ca"].settings


def test_unknown_table_lists_the_known_ones() -> None:
    with pytest.raises(FLTuneError, match=r"unknown table 'cifar'; allowed: table2, .*simfafl:table4"):
        get_table("cifar")
    with pytest.raises(FLTuneError, match=r"unknown table 'table9'; did you mean table4 or table3 or table2\?"):
        get_table("table9")
