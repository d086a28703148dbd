"""The FedSOL, MAN and FedAlign tables (issue 5): printed values, per-cell settings, shared runs, the
paper-vs-measured report of non-percent and rounds-to-target cells, substitution. No Ray."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.reproduce.command import ReproduceOptions, Reproduction
from fltune.reproduce.job import new_spec
from fltune.reproduce.plan import cell_tree, plan
from fltune.reproduce.registry import get_table
from fltune.reproduce.table import PaperTable
from fltune.reproduce.report import cell_text, markdown, results, row_lines, write_csv
from fltune.tune.results import TrialRow
from tests.conftest import needs_fmnist
from tests.reproduce.test_plan import fmnist_only  # noqa: F401 (fixture)


def cells(key: str) -> dict[tuple[str, str, str], object]:
    return {(c.row, c.dataset, c.column): c for c in get_table(key).cells}


def config(table: PaperTable, cell, scale: str = "paper"):
    return build_config(cell_tree(cell, table.scales[scale], cell.dataset, []))


def test_fedsol_tables_hold_the_printed_values_and_partitions() -> None:
    table = get_table("fedsol:table2")
    by = cells("fedsol:table2")
    assert len(table.cells) == 8 * 9 * 2  # 8 rows × (MNIST, CIFAR-10 ×4, SVHN, CINIC-10, Path-, TissueMNIST) × 2
    assert by[("FedAvg", "mnist", "Sharding s=2")].paper == 96.16
    assert by[("FedSOL", "cifar10", "LDA α=0.05")].paper == 60.01
    assert by[("Scaffold", "cifar10", "LDA α=0.1")].paper == 10.00
    assert by[("FedNTD", "svhn", "Sharding s=2")].paper == 85.30
    shards = config(table, by[("FedProx", "cifar10", "Sharding s=10")])
    part = shards.partition
    assert (part.kind, part.shards_per_client, shards.method.params.mu) == ("class_shards", 10, 1.0)
    lda = config(table, by[("FedSAM", "cifar10", "LDA α=0.3")])
    assert (lda.partition.kind, lda.partition.alpha, lda.method.params.rho) == ("dirichlet", 0.3, 0.1)
    assert lda.federation.rounds == 300 and lda.training.lr_decay == 0.99 and lda.data.augment == "crop_flip_cutout"
    mnist = config(table, by[("FedAvg", "mnist", "LDA α=0.1")])
    assert mnist.federation.rounds == 200 and mnist.data.augment == "crop_flip_cutout"  # the authors' MNIST loader
    assert config(table, by[("FedAvg", "svhn", "LDA α=0.1")]).data.augment == "crop_flip"
    assert by[("Scaffold", "tissuemnist", "Sharding s=2")].paper == 30.99
    assert by[("FedSOL", "pathmnist", "LDA α=0.1")].paper == 78.88
    cinic = config(table, by[("FedProx", "cinic10", "LDA α=0.1")])
    assert by[("FedProx", "cinic10", "LDA α=0.1")].paper == 40.09  # Table 4's FedProx 'Base' CINIC-10
    assert (cinic.federation.clients, cinic.federation.fraction, cinic.federation.rounds) == (200, 0.05, 300)
    assert cinic.data.augment == "reflect_crop_flip"
    path = config(table, by[("FedAvg", "pathmnist", "Sharding s=2")])
    assert (path.federation.clients, path.federation.rounds, path.data.augment) == (200, 200, "flip")

    head = {(c.row, c.column): c for c in get_table("fedsol:table5").cells}
    assert len(head) == 13 and head[("All (full)", "ρ=0")].paper == 56.13
    tuned = config(get_table("fedsol:table5"), head[("Head (partial)", "ρ=1.5")])
    assert head[("Head (partial)", "ρ=1.5")].paper == 64.13
    assert (tuned.method.params.scope, tuned.method.params.rho) == ("head", 1.5)


def test_fedsol_table3_runs_table2s_settings_on_the_authors_three_models() -> None:
    table = get_table("fedsol:table3")
    by = cells("fedsol:table3")
    assert len(table.cells) == 4 * 3 * 3  # rows × architectures × (CIFAR-10, SVHN, PathMNIST)
    assert by[("FedSOL", "svhn", "Res18")].paper == 85.97 and by[("FedProx", "pathmnist", "SL-ViT")].paper == 74.10
    res18 = config(table, by[("FedSOL", "pathmnist", "Res18")])
    assert (res18.model.name, res18.model.options) == ("resnet18", {"running_stats": False})
    assert (res18.partition.kind, res18.partition.alpha, res18.federation.clients) == ("dirichlet", 0.1, 200)
    assert res18.method.params.scope == "head" and res18.data.augment == "flip"
    vgg = config(table, by[("FedNTD", "cifar10", "Vgg11")])
    assert vgg.model.name == "vgg11" and vgg.method.params.tau == 1.0 and vgg.data.augment == "crop_flip_cutout"
    assert config(table, by[("FedAvg", "svhn", "SL-ViT")], "quick").model.name == "sl_vit"


def test_fedsol_table1_uses_the_proximal_loss_as_a_loss_or_by_projection_in_table2s_fedprox_column() -> None:
    """§2.3: CIFAR-10 LDA α = 0.1, where Table 2 prints FedProx's 59.80 (Table 1's L2 Base)."""
    table = get_table("fedsol:table1")
    by = cells("fedsol:table1")
    assert len(table.cells) == 5
    base = config(table, by[("L2 Distance", "cifar10", "Base")])
    fedprox = cells("fedsol:table2")[("FedProx", "cifar10", "LDA α=0.1")]
    assert by[("L2 Distance", "cifar10", "Base")].paper == fedprox.paper == 59.80
    assert base == config(get_table("fedsol:table2"), fedprox)
    for row, column, loss, usage, paper in (("L2 Distance", "Projection", "l2", "projection", 56.35),
                                            ("KL-Divergence", "Base", "kl", "base", 60.31),
                                            ("KL-Divergence", "Projection", "kl", "projection", 50.88)):
        cfg = config(table, by[(row, "cifar10", column)])
        assert by[(row, "cifar10", column)].paper == paper
        assert (cfg.method.name, cfg.method.params.loss, cfg.method.params.usage) == ("proximal", loss, usage)
        assert (cfg.method.params.temperature, cfg.partition.alpha, cfg.training.lr_decay) == (3.0, 0.1, 0.99)
    assert config(table, by[("None (FedAvg)", "cifar10", "Base")]).method.name == "fedavg"


def test_fedsol_table9_fine_tunes_whole_models_and_scores_each_client_on_its_label_aligned_test_split() -> None:
    """App. D: the authors' configs/personalized/*.json (LDA α = 0.1, 300 rounds, E = 5), fine-tuned τ epochs;
    Local-only one 200-epoch run as 200 one-epoch rounds on every client."""
    table = get_table("fedsol:table9")
    by = cells("fedsol:table9")
    assert len(table.cells) == 11 * 3
    assert by[("PerFedAvg τ=1", "svhn", "LDA α=0.1")].paper == 64.1
    assert by[("FedSoL-FT τ=5", "tissuemnist", "LDA α=0.1")].paper == 91.6
    knn = config(table, by[("kNN-Per τ=5", "cifar10", "LDA α=0.1")])
    assert (knn.method.name, knn.training.finetune_epochs, knn.training.finetune_params) == ("knnper", 5, "all")
    assert (knn.partition.kind, knn.partition.alpha, knn.partition.test_per_client) == ("dirichlet", 0.1, 1000)
    assert (knn.federation.rounds, knn.training.local_epochs, knn.training.lr_decay) == (300, 5, 0.99)
    assert by[("kNN-Per τ=5", "cifar10", "LDA α=0.1")].metric == "acc_personalized_ft"
    local = by[("Local-only", "cifar10", "LDA α=0.1")]
    paper, quick = config(table, local), config(table, local, "quick")
    assert local.metric == "acc_personalized" and paper.training.finetune_epochs == 0
    assert (paper.method.name, paper.federation.fraction, paper.federation.rounds) == ("local_only", 1.0, 200)
    assert (quick.federation.rounds, quick.training.local_epochs) == (10, 1)  # the quick scale's length
    assert config(table, by[("FedAvg τ=1", "svhn", "LDA α=0.1")], "quick").federation.rounds == 10
    assert row_lines(table, ["FedBabu τ=1"])[0].startswith("FedBabu τ=1: fedbabu (head frozen at init)")


def test_man_tables_pair_accuracy_with_rounds_and_compose_man() -> None:
    table = get_table("man:table1")
    by = cells("man:table1")
    assert len(table.cells) == 12 * 2 * 3 * 2  # rows × (CIFAR-100, Tiny-ImageNet) × δ × (accuracy, rounds)
    assert by[("FedDC+MAN", "cifar100", "δ=0.3")].paper == 55.21
    rounds = by[("FedDC+MAN", "cifar100", "δ=0.3 rounds")]
    assert (rounds.paper, rounds.metric, table.factor(rounds)) == (144, "rounds_to_target", 1.0)
    never = by[("FedAvg", "cifar100", "iid rounds")]
    assert never.paper is None and never.paper_text == "500+"
    assert by[("FedDyn", "cifar100", "δ=0.6 rounds")].paper == 486
    paper = config(table, rounds)
    assert paper.method.name == "feddc+man" and paper.metrics.target == 0.5
    assert (paper.metrics.target_metric, paper.training.lr, paper.training.grad_clip) == ("acc_all_model", 0.1, 10.0)
    assert paper.data.augment == "flip_crop_half"  # the authors' (FedDyn's) Dataset: flip, then crop half the time
    quick = config(table, by[("FedASAM", "cifar100", "iid")], "quick")
    assert quick.method.params.rho == 0.1 and quick.partition.kind == "iid" and quick.metrics.target == 0.6
    assert quick.data.augment == "auto"  # FMNIST stands in: no augmentation

    tiny = config(table, by[("FedSAM+MAN", "tinyimagenet", "iid rounds")])  # supp. §7, EXPERIMENTS.md
    assert by[("FedSAM+MAN", "tinyimagenet", "iid rounds")].paper == 82
    assert (tiny.model.name, tiny.method.params.zeta, tiny.method.params.rho) == ("tinyimagenet_cnn", 0.1, 0.01)
    assert tiny.metrics.target == 0.28 and tiny.data.augment == "flip_crop_half"
    assert config(table, by[("FedSAM+MAN", "tinyimagenet", "iid")], "quick").metrics.target == 0.6
    assert config(table, by[("FedSAM", "tinyimagenet", "iid")]).method.params.rho == 0.03
    assert config(table, by[("FedSAM", "tinyimagenet", "δ=0.3")]).method.params.rho == 0.05
    assert config(table, by[("FedSAM+MAN", "cifar100", "iid")]).method.params.zeta == 0.15
    assert by[("FedDC+MAN", "tinyimagenet", "iid")].paper == 36.53

    hessian = get_table("man:table2")
    trace = cells("man:table2")[("FedSAM+MAN", "cifar100", "δ=0.6 trace")]
    assert trace.paper == 2918 and trace.metric == "hessian_trace" and not hessian.percent
    assert config(hessian, trace, "quick").metrics.hessian.at_end

    supp = cells("man:supp5")
    assert supp[("FedAvg", "cifar10", "δ=0.6")].paper == 79.34 and supp[("FedDC", "cifar10", "iid")].paper == 84.8
    assert config(get_table("man:supp5"), supp[("FedAvg", "cifar10", "δ=0.6")]).data.augment == "flip_crop_half"
    assert config(hessian, trace).data.augment == "flip_crop_half"

    supp6 = cells("man:supp6")
    assert len(supp6) == 4 * 2 * 2 and supp6[("FedSpeed+MAN", "cifar100", "δ=0.6 trace")].paper == 3674
    eigen = supp6[("FedSpeed", "cifar100", "δ=0.3 top eigenvalue")]
    assert eigen.paper == 47.31 and config(get_table("man:supp6"), eigen).method.name == "fedspeed"


def test_fedalign_tables_values_metrics_and_column_sizes() -> None:
    t1 = cells("fedalign:table1")
    assert t1[("GradAug", "cifar100", "H_N")].paper == 2924
    assert t1[("GradAug", "cifar100", "H_N")].metric == "hessian_hn"
    assert t1[("Mixup", "cifar100", "H_D")].paper == 0.99
    assert get_table("fedalign:table1").factor(t1[("Mixup", "cifar100", "H_D")]) == 1.0
    probe = config(get_table("fedalign:table1"), t1[("FedAvg", "cifar100", "λ_max")]).metrics.hessian
    assert (probe.clients, probe.batches, probe.batch_size) == (16, 10, 64)  # pyhessian: 10 batches of the run's B
    assert cells("fedalign:table2")[("StochDepth", "cifar100", "homog")].paper == 58.6

    t5 = get_table("fedalign:table5")
    moon = cells("fedalign:table5")[("MOON", "cifar100", "MFLOPs")]
    assert (moon.paper, moon.metric, t5.factor(moon)) == (262.2, "cost_train_forward_mflops", 0.5)  # MACs
    assert cells("fedalign:table5")[("FedAvg", "cifar100", "Time (s)")].reduce == "mean"
    gradaug = config(t5, cells("fedalign:table5")[("GradAug (n = 4)", "cifar100", "Acc (%)")])
    assert (gradaug.method.params.n, gradaug.method.params.mu, gradaug.model.name) == (4, 2.25, "resnet56")
    align = config(t5, cells("fedalign:table5")[("FedAlign", "cifar100", "Acc (%)")])
    assert align.training.grad_clip == 10.0 and align.partition.kind == "dirichlet" and align.federation.clients == 16


def test_fedalign_ablation_tables_change_one_setting_per_column() -> None:
    t3, t4, t6 = (get_table(f"fedalign:table{n}") for n in (3, 4, 6))
    e10 = cells("fedalign:table3")[("StochDepth", "cifar100", "E=10")]
    assert e10.paper == 51.1 and config(t3, e10).training.local_epochs == 10
    assert config(t3, e10, "quick").training.local_epochs == 1
    assert config(t3, cells("fedalign:table3")[("MOON", "cifar100", "E=20")]).training.local_epochs == 20
    c64 = cells("fedalign:table4")[("GradAug", "cifar100", "C=64×0.25")]
    paper, quick = config(t4, c64), config(t4, c64, "quick")
    assert c64.paper == 38.4 and (paper.federation.clients, paper.federation.fraction, paper.federation.rounds) == (
        64, 0.25, 25)
    assert (quick.federation.clients, quick.federation.fraction, quick.federation.rounds) == (8, 0.25, 3)
    assert config(t4, cells("fedalign:table4")[("FedAvg", "cifar100", "C=32")], "quick").federation.clients == 4
    align = cells("fedalign:table6")
    assert len(align) == 9 and align[("FedAlign", "cifar100", "α=2.5")].paper == 58.1
    homog = config(t6, align[("FedAlign", "cifar100", "homog")])
    assert homog.partition.kind == "iid" and homog.method.params.mu == 0.45 and homog.training.grad_clip == 10.0
    assert config(t6, align[("FedAlign", "cifar100", "C=64×0.25 (100)")]).federation.rounds == 100

    t9 = cells("fedalign:table9")
    assert t9[("FedAlign", "cifar100", "H_N")].paper == 23110
    assert t9[("GradAug (n = 1)", "cifar100", "λ_max")].paper == 179
    t10 = get_table("fedalign:table10")
    by = cells("fedalign:table10")
    assert config(t10, by[("FedAlign", "cifar100", "ω_S=0.4")]).method.params.omega_s == 0.4
    assert config(t10, by[("FedAlign", "cifar100", "μ=0.35")]).method.params.mu == 0.35
    assert by[("FedAlign", "cifar100", "μ=0.45")].settings == by[("FedAlign", "cifar100", "ω_S=0.25")].settings


def test_fedalign_rows_train_as_the_authors_code() -> None:
    """Every method in the authors' code builds ``SGD(lr, momentum=0.9, weight_decay=wd, nesterov=True)``
    (``mmendiet/FedAlign:methods/fedavg.py``, ``methods/fedalign.py``, …) and trains on ``drop_last`` loaders
    (``data_preprocessing/data_loader.py``); its MOON runs the frozen models in train mode, a client's first
    previous model the initial one (``methods/moon.py``), and its StochDepth always keeps the first block
    (``models/resnet_stochdepth.py``): so does every FedAlign cell."""
    for key in (f"fedalign:table{n}" for n in range(1, 11)):
        table = get_table(key)
        for scale in ("paper", "quick"):
            for one in table.cells:
                cfg = config(table, one, scale)
                training = cfg.training
                assert (training.momentum, training.nesterov, training.drop_last) == (0.9, True, True), (key, one.row)
                if cfg.method.name == "moon":
                    assert (cfg.method.params.anchors, cfg.method.params.first_prev) == ("train", "initial"), key
                assert cfg.method.name != "stochdepth" or cfg.method.params.schedule == "code", (key, one.row)

    t7 = get_table("fedalign:table7")
    sampled = cells("fedalign:table7")[("FedAvg", "cifar10", "C=64×0.25 (100)")]
    assert sampled.paper == 78.6
    paper, quick = config(t7, sampled), config(t7, sampled, "quick")
    assert (paper.federation.clients, paper.federation.fraction, paper.federation.rounds) == (64, 0.25, 100)
    assert (quick.federation.clients, quick.federation.fraction, quick.federation.rounds) == (8, 0.25, 12)

    t8 = cells("fedalign:table8")
    mflops = t8[("FedAlign", "cifar100", "MFLOPs")]
    assert t8[("FedAlign", "cifar100", "Rounds")].paper == 37 and mflops.paper == 3297
    assert (mflops.metric, mflops.reduce) == ("cost_cum_forward_mflops", "at_target")
    assert config(get_table("fedalign:table8"), mflops).metrics.target == 0.6


def test_a_metric_whose_needs_a_set_removes_is_one_line() -> None:
    table = get_table("man:table1")
    rounds = cells("man:table1")[("FedAvg", "cifar100", "δ=0.3 rounds")]
    with pytest.raises(FLTuneError, match=r"FedAvg \| CIFAR-100 δ=0.3 rounds: .*needs metrics.target"):
        cell_tree(rounds, table.scales["quick"], "fmnist", ["metrics.target=null"])
    hn = cells("fedalign:table1")[("FedAvg", "cifar100", "H_N")]
    with pytest.raises(FLTuneError, match="metrics.hessian.clients"):
        cell_tree(hn, get_table("fedalign:table1").scales["quick"], "fmnist", ["metrics.hessian.clients=0"])


@pytest.fixture()
def man_job(fmnist_only: Path, tmp_path: Path):  # noqa: F811
    table = get_table("man:table1")
    planned = plan(table, "quick", ["cifar100"], [f"data.root={fmnist_only}"], rows=["FedAvg", "FedDC+MAN"])
    return new_spec(table, "quick", planned, seeds=2, storage=str(tmp_path), name="m", out=None,
                    max_concurrent=None)


@needs_fmnist
def test_cells_of_one_experiment_share_a_run_and_substitution_is_said(man_job) -> None:
    assert len(man_job.cells) == 12 and len(man_job.trials) == 6  # accuracy + rounds per (row, δ)
    assert man_job.trials["FedAvg | CIFAR-100 δ=0.3"] == ["FedAvg | CIFAR-100 δ=0.3", "FedAvg | CIFAR-100 δ=0.3 rounds"]
    assert [(o.metric, o.reduce) for o in man_job.trial("FedAvg | CIFAR-100 δ=0.3")[2]] == [
        ("acc_all_model", "final"), ("rounds_to_target", "final")]
    assert all(run.substituted == "fmnist for cifar100" for run in man_job.cells.values())
    text = Reproduction(ReproduceOptions(table=man_job.table)).describe(man_job, nodes=1)
    assert "12 cells in 6 runs" in text and "substituted fmnist for cifar100, quick scale" in text


def row(trial: str, status: str, metrics: dict[str, float]) -> TrialRow:
    return TrialRow(trial_id=trial[:6], status=status, params={"cell": trial}, round=12, objective=math.nan,
                    objective_std=math.nan, metrics=metrics)


@needs_fmnist
def test_report_reads_each_cells_metric_scales_it_and_writes_r_plus(man_job, tmp_path: Path) -> None:
    rows = [
        row("FedDC+MAN | CIFAR-100 δ=0.3", "finished", {
            "objective:final:acc_all_model": 0.8, "objective_std:final:acc_all_model": 0.01,
            "objective:final:rounds_to_target": 4.0, "objective_std:final:rounds_to_target": 0.0}),
        row("FedAvg | CIFAR-100 δ=0.3", "finished", {
            "objective:final:acc_all_model": 0.6, "objective_std:final:acc_all_model": 0.02,
            "objective:final:rounds_to_target": math.nan, "objective_std:final:rounds_to_target": math.nan}),
    ]
    res = {r.cell.key: r for r in results(man_job, rows)}
    acc, rounds = res["FedDC+MAN | CIFAR-100 δ=0.3"], res["FedDC+MAN | CIFAR-100 δ=0.3 rounds"]
    # quick scale on FMNIST for CIFAR-100: ranks, not Δ
    assert (acc.measured, acc.std, acc.delta, acc.rank) == (pytest.approx(80.0), pytest.approx(1.0), None, 1)
    assert (rounds.measured, rounds.delta, rounds.rank) == (4.0, None, 1)  # rounds are not percentages
    never = res["FedAvg | CIFAR-100 δ=0.3 rounds"]
    assert never.unreached and cell_text(never, 2) == "12+ (paper 500+)"
    assert res["FedAvg | CIFAR-100 δ=0.6"].status == "pending"

    with write_csv(man_job, list(res.values()), tmp_path / "t.csv").open() as f:
        by = {(r["method"], r["partition"]): r for r in csv.DictReader(f)}
    assert (by[("FedAvg", "δ=0.3 rounds")]["paper"], by[("FedAvg", "δ=0.3 rounds")]["measured"]) == ("500+", "12+")
    assert by[("FedDC+MAN", "δ=0.3 rounds")]["measured"] == "4.0000"
    assert ("| FedDC+MAN | 80.00 ± 1.00 (rank 1; paper 55.21, rank 1) | 4.00 ± 0.00 (rank 1; paper 144.00, rank 1) |"
            in markdown(man_job, list(res.values())))
