"""SimFAFL Table 2's rows run as FedCR's code (``haozzh/FedCR``) runs them: no Ray, configs only.

Sources pinned here: ``README.md`` (per-method commands: --lr, --mu, --dimZ, --CMI, --L2R, --local_ep 10,
--local_bs 48, --epoch 500, --lr_decay 1), ``code_FedCR/utils/options.py`` (--momentum 0, --weigh_delay 0,
--last_local_ep 10, --local_rep_ep 1), ``code_FedCR/models/distributed_training_utils*.py`` (``max_norm = 10``
clipping on every step; the last round trains the non-shared part for max(last_local_ep, local_ep −
local_rep_ep) epochs, fedavg/fedSR the head for last_local_ep), ``code_FedCR/main_fed.py`` (fedbabu shares
fedper's keys and schedule), ``code_FedCR/main_fed_PAC.py`` (its own FedPAC: ``fedpac_fedcr``),
``code_FedCR/main_fed_ditto.py`` (Ditto's last round: one more Ditto round of every client, ``local_ep``
epochs).
"""

from __future__ import annotations

import pytest

from fltune.config import build_config
from fltune.reproduce.papers.simfafl import LOCAL_REP_EP, ROWS
from fltune.reproduce.job import new_spec
from fltune.reproduce.plan import cell_tree, plan
from fltune.reproduce.registry import get_table
from fltune.reproduce.table import DATASET_NAMES
from tests.conftest import needs_fmnist
from tests.reproduce.test_plan import fmnist_only  # noqa: F401 (fixture)

README_LR = {"FedAvg": 0.01, "FedAvg-FT": 0.01, "FedPer": 0.01, "LG-FedAvg": 0.01, "FedRep": 0.01,
             "FedBABU": 0.01, "FedPAC": 0.01, "Ditto": 0.5, "FedSR-FT": 0.005, "FedCR": 0.05, "SimFAFL": 0.05}
"""FedCR README.md's --lr per method; SimFAFL as FedCR ([U]: the paper gives none)."""
LAST_ROUND = {"FedAvg": False}
"""Rows without the code's last round: FedAvg reports the averaged model; every other row ends with it
(main_fed.py, main_fedSR.py, main_fed_PAC.py, main_fed_ditto.py)."""


def configs(scale: str, dataset: str = "fmnist", column: str = "non-IID1") -> dict:
    table = get_table("table2")
    return {c.row: build_config(cell_tree(c, table.scales[scale], dataset, []))
            for c in table.cells if c.dataset == dataset and c.column == column}


@pytest.mark.parametrize("scale", ["paper", "quick"])
def test_every_row_takes_the_readme_lr_plain_sgd_and_clipping_at_both_scales(scale: str) -> None:
    """Quick shrinks rounds, epochs and data only: lr, momentum, clipping and the last round stay."""
    for row, cfg in configs(scale).items():
        t = cfg.training
        assert t.lr == README_LR[row], row
        assert (t.optimizer, t.momentum, t.weight_decay, t.grad_clip, t.lr_decay, t.batch_size) == (
            "sgd", 0.0, 0.0, 10.0, 1.0, 48), row
        ends = LAST_ROUND.get(row, True)
        assert (t.finetune_epochs > 0) == ends, row
        assert t.finetune_lr is None, row  # the last round runs at the row's own lr (args.lr)


@pytest.mark.parametrize("scale", ["paper", "quick"])
def test_inputs_are_normalised_as_fedcrs_dataset_code(scale: str) -> None:
    """utils/utils_dataset.py: FMNIST through Normalize((0.5,), (0.5,)), EMNIST by its own training pixels'
    statistics, CIFAR by (to the third decimal) fltune's constants."""
    expected = {"fmnist": "half", "emnist_letters": "train", "cifar10": "dataset", "cifar100": "dataset"}
    for dataset, how in expected.items():
        for column in ("non-IID1", "non-IID2"):
            assert {cfg.data.normalise for cfg in configs(scale, dataset, column).values()} == {how}, dataset


@pytest.mark.parametrize("scale, last_local_ep", [("paper", 10), ("quick", 2)])
def test_last_round_lasts_max_of_last_local_ep_and_e_minus_rep_ep(scale: str, last_local_ep: int) -> None:
    """distributed_training_utils.py: fedavg/fedSR → last_local_ep; Ditto's own round → local_ep
    (distributed_training_utils_ditto.py); the others → max(last_local_ep, E − 1). Quick keeps the paper's
    last_local_ep = E."""
    for row, cfg in configs(scale).items():
        if not LAST_ROUND.get(row, True):
            continue
        e = cfg.training.local_epochs
        if ROWS[row].method == "ditto":
            expected = e
        elif ROWS[row].method in ("fedavg", "fedsr"):
            expected = last_local_ep
        else:
            expected = max(last_local_ep, e - LOCAL_REP_EP)
        assert cfg.training.finetune_epochs == expected, row
        assert last_local_ep == e  # README: --local_ep 10 with options.py's last_local_ep 10


def test_paper_scale_is_the_readme_run() -> None:
    for cfg in configs("paper").values():
        assert (cfg.federation.clients, cfg.federation.fraction, cfg.federation.rounds) == (100, 0.1, 500)
        assert cfg.training.local_epochs == 10 and cfg.data.subsample == 1.0


def test_rows_own_settings_follow_the_readme() -> None:
    by = configs("paper")
    assert by["Ditto"].method.params.lam == 0.1  # --mu 0.1
    assert by["Ditto"].method.params.first_personal == "initial"  # model_local: a copy of the initial model
    fedsr = by["FedSR-FT"]
    assert (fedsr.method.params.alpha_cmi, fedsr.method.params.alpha_l2r) == (0.001, 0.001)  # --CMI, --L2R
    assert fedsr.model.options == {"dim_z": 256}  # --dimZ 256
    assert by["FedCR"].method.params.beta2 == 1.0  # --beta2 1
    assert by["FedRep"].method.params.body_epochs == 1  # --local_rep_ep 1
    assert by["FedPAC"].method.name == "fedpac_fedcr"  # main_fed_PAC.py's FedPAC, not FedPAC's own code
    assert by["FedPAC"].method.params.lam == 1.0  # --beta_PAC 1
    assert by["FedPAC"].method.params.body_epochs == 1  # --local_rep_ep 1
    assert by["FedBABU"].method.name == "fedper"  # main_fed.py: fedbabu is trained exactly as fedper
    # Table 4's FedCR-β = 0.001 column equals Table 2's FedCR CIFAR-100 non-IID2 value (42.91)
    assert configs("paper", "cifar100", "non-IID2")["FedCR"].method.params.beta == 0.001


def test_header_lists_each_rows_settings_with_unknowns_marked() -> None:
    table = get_table("table2")
    assert list(table.row_settings) == list(ROWS)
    assert table.row_settings["Ditto"].startswith("ditto, lr 0.5, lam 0.1, first_personal initial, last round — ")
    assert "[U" in table.row_settings["SimFAFL"] and "last round" in table.row_settings["FedCR"]


def test_weight_sweeps_set_the_varied_beta_and_keep_table2s_simfafl_row() -> None:
    """Table 4 (§5.4) and appendix Tables 5–7: SimFAFL at each (β1, β2), on one dataset and partition."""
    sweep = {c.key: c for c in get_table("simfafl:table4").cells}
    assert sweep["SimFAFL-β2 | CIFAR-100 non-IID2 beta2=0.6"].paper == 46.80
    grid = get_table("simfafl:table5")
    assert len(grid.cells) == 4 * 5 and {c.dataset for c in grid.cells} == {"cifar100"}
    top = next(c for c in grid.cells if c.key == "SimFAFL β2=0.4 | CIFAR-100 non-IID1 beta1=0.003")
    cfg = build_config(cell_tree(top, grid.scales["paper"], "cifar100", []))
    assert top.paper == 61.42 and (cfg.method.params.beta1, cfg.method.params.beta2) == (0.003, 0.4)
    assert cfg.partition.kind == "classes" and cfg.training.lr == README_LR["SimFAFL"] and top.finetune
    table7 = get_table("simfafl:table7")
    corner = table7.cells[0]
    assert (corner.key, corner.paper) == ("SimFAFL β2=0 | CIFAR-10 non-IID2 beta1=0.001", 83.50)
    quick = build_config(cell_tree(corner, table7.scales["quick"], "fmnist", []))
    assert quick.partition.kind == "dirichlet_prior" and table7.scales["quick"].substitute == "fmnist"
    assert len(get_table("simfafl:table6").cells) == 3 * 5


def test_pre_experiments_run_as_table2s_rows_with_one_overall_centroid_or_l_ca_alone() -> None:
    """Table 1 (§4.1): FedAvg and FedCR as Table 2 runs them; Pre-exp I is FedCR with one Gaussian for every
    sample; Pre-exp II is Table 3's "with L_ca" (β2 = 0; on CIFAR-10 β1 = 0.001, the β1 at which Tables 6–7's
    β2 = 0 cells print its values 84.44 and 83.50)."""
    table = get_table("simfafl:table1")
    assert {c.dataset for c in table.cells} == {"cifar10", "cifar100"} and len(table.cells) == 16
    assert table.scales["quick"].substitute == "fmnist"

    def params(row: str, dataset: str, column: str = "non-IID2"):
        cell = table.cell(f"{row} | {DATASET_NAMES[dataset]} {column}")
        return cell, build_config(cell_tree(cell, table.scales["paper"], dataset, [])).method

    cell, pre1 = params("Pre-exp I", "cifar100")
    fedcr = params("FedCR", "cifar100")[1]
    assert (pre1.name, pre1.params.centroids, fedcr.params.centroids) == ("fedcr", "overall", "class")
    assert pre1.params.model_dump(exclude={"centroids"}) == fedcr.params.model_dump(exclude={"centroids"})
    assert cell.paper == 41.41 and cell.finetune

    cell, pre2 = params("Pre-exp II", "cifar10")
    assert cell.paper == 83.50 and (pre2.name, pre2.params.beta1, pre2.params.beta2) == ("simfafl", 0.001, 0.0)
    grid = get_table("simfafl:table7").cell("SimFAFL β2=0 | CIFAR-10 non-IID2 beta1=0.001")
    assert grid.paper == cell.paper
    ablation = get_table("simfafl:table3").cell("with L_ca | CIFAR-10 non-IID2")
    assert ablation.settings == cell.settings
    cifar100 = params("Pre-exp II", "cifar100")[1].params
    assert (cifar100.beta1, cifar100.beta2) == (0.003, 0.0)  # Table 2's CIFAR-100 β1
    assert params("FedAvg", "cifar10", "non-IID1")[0].settings == get_table("table2").cell(
        "FedAvg | CIFAR-10 non-IID1").settings


@needs_fmnist
def test_cells_that_fmnist_makes_the_same_run_share_one_trial(fmnist_only) -> None:
    """Table 1 at quick scale without CIFAR: CIFAR-10 and CIFAR-100 non-IID1 become the same FMNIST run
    (`classes` reads no α) for the rows without per-dataset settings, so they share a trial: 13 runs, not 16
    (Pre-exp II's β1 differs between them)."""
    table = get_table("simfafl:table1")
    planned = plan(table, "quick", None, [f"data.root={fmnist_only}"])
    spec = new_spec(table, "quick", planned, seeds=1, storage="/tmp/unused", name="t", out=None,
                    max_concurrent=None)
    assert len(spec.cells) == 16 and len(spec.trials) == 13
    assert spec.trials["FedAvg | CIFAR-10 non-IID1"] == ["FedAvg | CIFAR-10 non-IID1", "FedAvg | CIFAR-100 non-IID1"]
    assert "Pre-exp II | CIFAR-100 non-IID1" in spec.trials
