"""FedAlign (Mendieta et al. 2022, the arXiv version with its appendix) Tables 1–7 (Table 7: CIFAR-10) and appendix
Tables 8–10.

Protocol (§3.2 and the authors' code): ``COMMON``, ``OPTIMISER`` and ``PAPER``, with fltune's crop + flip; each
row's method settings in ``ROWS`` (GradAug's μ per n: Table 5; FedAlign's clipping: App. E).

The numbers are the arXiv version's (the only one with Table 8 and a legible Table 2); the CVPR version prints
the same Table 1 but other means, with ± std, in Tables 2, 5 and 7.

Cost columns: ``cost_train_forward_mflops`` is the paper's MFLOPs, "the compute needs for the forward pass of the
training process": the forward FLOPs each method spends per training sample over round 1 (MOON's three models, GradAug's
sub-networks, StochDepth's dropped blocks, FedAlign's reduced width; metrics/_flops.py), at 2 FLOPs per multiply-add, so
×0.5 gives the paper's MACs (ResNet-56 on CIFAR-100, FedAvg: 87.2). Table 8's MFLOPs are that × the rounds to 60 %.
``cost_stored_params`` is the parameter count × the method's ``stored_models``."""

from __future__ import annotations

from typing import Any, NamedTuple

from fltune.reproduce.table import HESSIAN_AT_END, Cell, Paper, PaperTable, Scale



class Column(NamedTuple):
    """A printed column: its label, the metric compared, × factor (None: the table's), settings and reduction."""

    label: str
    metric: str = "acc_global"
    factor: float | None = None
    settings: dict[str, Any] = {}
    reduce: str = "final"


GRADAUG = {"method.omega_b": 0.8}
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "FedAvg": ("fedavg", {}),
    "FedProx": ("fedprox", {"method.mu": 1e-4}),
    "MOON": ("moon", {"method.mu": 1.0, "method.tau": 0.5, "method.anchors": "train", "method.first_prev": "initial"}),
    "Mixup": ("mixup", {"method.gamma": 0.1}),
    "StochDepth": ("stochdepth", {"method.rho_L": 0.9, "method.schedule": "code"}),
    "GradAug": ("gradaug", {"method.n": 2, "method.mu": 1.75, **GRADAUG}),
    **{f"GradAug (n = {n})": ("gradaug", {"method.n": n, "method.mu": mu, **GRADAUG})
       for n, mu in ((1, 1.5), (2, 1.75), (3, 2.0), (4, 2.25))},  # Table 5's μ per n
    "FedAlign": ("fedalign", {"method.mu": 0.45, "method.omega_s": 0.25, "training.grad_clip": 10.0}),
}

TABLE1 = {  # Acc. (%), λ_max, H_T, H_N, H_D
    "FedAvg": (52.9, 297, 6240, 11360, 0.98),
    "FedProx": (53.0, 270, 6132, 6522, 0.98),
    "MOON": (55.3, 252, 5520, 5712, 0.97),
    "Mixup": (54.0, 216, 5468, 15434, 0.99),
    "StochDepth": (55.5, 215, 3970, 8267, 0.97),
    "GradAug": (57.1, 167, 2597, 2924, 0.96),
}
TABLE1_COLUMNS = (Column("Acc."), Column("λ_max", "hessian_lambda_max", 1.0), Column("H_T", "hessian_trace", 1.0),
                  Column("H_N", "hessian_hn", 1.0), Column("H_D", "hessian_hd", 1.0))
TABLE2_COLUMNS = {"α=0.1": {"partition.alpha": 0.1}, "α=0.5": {"partition.alpha": 0.5},
                  "α=2.5": {"partition.alpha": 2.5}, "homog": {"partition.kind": "iid"}}
TABLE2 = {
    "FedAvg": (45.1, 52.9, 54.2, 56.2),
    "FedProx": (45.5, 53.0, 54.8, 54.5),
    "MOON": (46.1, 55.3, 55.6, 55.7),
    "Mixup": (43.5, 54.0, 55.2, 56.3),
    "StochDepth": (48.0, 55.5, 57.6, 58.6),
    "GradAug": (48.8, 57.1, 59.5, 60.7),
}
EPOCHS = {"E=10": {"training.local_epochs": 10}, "E=20": {}, "E=30": {"training.local_epochs": 30}}
TABLE3 = {
    "FedAvg": (50.6, 52.9, 53.2),
    "FedProx": (50.9, 53.0, 52.8),
    "MOON": (50.3, 55.3, 55.2),
    "Mixup": (50.5, 54.0, 54.2),
    "StochDepth": (51.1, 55.5, 56.7),
    "GradAug": (53.7, 57.1, 57.9),
}
SAMPLED = "C=64×0.25 (100)"
"""Tables 4, 6 and 7's client-sampling column: 64 clients, 25 % per round, 100 rounds."""
CLIENTS = {"C=16": {}, "C=32": {"federation.clients": 32}, "C=64": {"federation.clients": 64},
           "C=64×0.25": {"federation.clients": 64, "federation.fraction": 0.25},
           SAMPLED: {"federation.clients": 64, "federation.fraction": 0.25, "federation.rounds": 100}}
TABLE4 = {
    "FedAvg": (52.9, 44.7, 34.4, 33.2, 47.0),
    "FedProx": (53.0, 45.1, 34.8, 32.1, 46.2),
    "MOON": (55.3, 45.5, 35.2, 34.3, 50.2),
    "Mixup": (54.0, 44.8, 35.6, 34.1, 49.2),
    "StochDepth": (55.5, 47.7, 36.1, 34.5, 51.5),
    "GradAug": (57.1, 50.5, 40.3, 38.4, 53.5),
}
TABLE6 = {"α=0.1": 48.8, "α=2.5": 58.1, "homog": 58.1, "E=10": 50.9, "E=30": 58.5, "C=32": 48.0, "C=64": 36.5,
          "C=64×0.25": 35.6, SAMPLED: 51.5}
"""FedAlign under Tables 2–4's settings (its value in their default column is Table 5's 57.4)."""
ABLATIONS = {**TABLE2_COLUMNS, **EPOCHS, **CLIENTS}
TABLE9 = {**TABLE1, "GradAug (n = 1)": (56.8, 179, 3620, 2607, 0.97), "FedAlign": (57.4, 153, 4274, 23110, 0.98)}
"""Appendix Table 9: Table 1 (its GradAug is n = 2) plus GradAug (n = 1) and FedAlign."""
TABLE10 = {"μ=0.35": {"method.mu": 0.35}, "μ=0.45": {}, "μ=0.55": {"method.mu": 0.55},
           "ω_S=0.1": {"method.omega_s": 0.1}, "ω_S=0.25": {}, "ω_S=0.4": {"method.omega_s": 0.4}}
TABLE10_VALUES = (56.0, 57.4, 56.1, 54.9, 57.4, 55.2)
"""Appendix Table 10: FedAlign's μ with ω_S = 0.25, then ω_S with μ = 0.45."""
TABLE5 = {  # Acc (%), MFLOPs, Param (M), Time (s per round, 4 RTX-2080Ti)
    "FedAvg": (52.9, 87.3, 0.61, 137.2),
    "FedProx": (53.0, 87.3, 1.21, 161.9),
    "MOON": (55.3, 262.2, 2.21, 414.2),
    "Mixup": (54.0, 87.3, 0.61, 137.8),
    "StochDepth": (55.5, 82.4, 0.61, 136.7),
    "GradAug (n = 1)": (56.8, 133.9, 0.61, 229.2),
    "GradAug (n = 2)": (57.1, 170.7, 0.61, 323.9),
    "GradAug (n = 3)": (57.1, 217.4, 0.61, 417.7),
    "GradAug (n = 4)": (56.6, 264.1, 0.61, 514.4),
    "FedAlign": (57.4, 89.1, 0.61, 166.2),
}
MFLOPS = Column("MFLOPs", "cost_train_forward_mflops", 0.5)
"""fltune counts 2 FLOPs per multiply-add, the paper's MFLOPs are MACs (87.3)."""
PARAMS = Column("Param (M)", "cost_stored_params", 1e-6)
TABLE5_COLUMNS = (Column("Acc (%)"), MFLOPS, PARAMS, Column("Time (s)", "cost_round_s", 1.0, reduce="mean"))
TABLE7 = {  # CIFAR-10: C = 16, C = 64 × 0.25 (100), MFLOPs, Param (M)
    "FedAvg": (82.1, 78.6, 87.3, 0.61),
    "FedProx": (81.8, 78.1, 87.3, 1.21),
    "MOON": (83.4, 79.3, 262.2, 2.21),
    "Mixup": (80.5, 81.0, 87.3, 0.61),
    "StochDepth": (82.0, 80.4, 82.4, 0.61),
    "GradAug (n = 2)": (84.3, 84.2, 170.7, 0.61),
    "GradAug (n = 1)": (84.2, 81.8, 133.9, 0.61),
    "FedAlign": (82.3, 82.5, 89.1, 0.61),
}
TABLE7_COLUMNS = (Column("C=16"), Column(SAMPLED, settings=CLIENTS[SAMPLED]), MFLOPS, PARAMS)
TABLE8 = {  # rounds, MFLOPs, Comm Cost (Gb) to 60 % on CIFAR-100
    "FedAvg": (84, 7332, 26.23),
    "FedProx": (78, 6809, 24.36),
    "MOON": (55, 14421, 17.18),
    "Mixup": (71, 6198, 22.17),
    "StochDepth": (46, 3790, 14.37),
    "GradAug (n = 2)": (41, 6999, 12.81),
    "GradAug (n = 1)": (44, 5892, 13.74),
    "FedAlign": (37, 3297, 11.56),
}
TABLE8_COLUMNS = (Column("Rounds", "rounds_to_target", 1.0),
                  Column("MFLOPs", "cost_cum_forward_mflops", 0.5, reduce="at_target"),
                  Column("Comm Cost (Gb)", "cost_cum_up_gbit", 1.0, reduce="at_target"))

COMMON = {"model.name": "resnet56", "partition.kind": "dirichlet", "partition.alpha": 0.5,
          "metrics.protocols": ["global"]}
OPTIMISER = {"training.batch_size": 64, "training.lr": 0.01, "training.momentum": 0.9, "training.nesterov": True,
             "training.weight_decay": 1e-4, "training.drop_last": True}
"""The authors' client optimiser, ``SGD(lr, momentum=0.9, weight_decay=wd, nesterov=True)`` in every
``mmendiet/FedAlign:methods/*.py``; loaders drop the short last batch (``data_preprocessing/data_loader.py``) and
the server weighs a client by ``len(loader) * batch_size`` (``methods/base.py``)."""
PAPER = Scale(
    settings={"federation.clients": 16, "federation.fraction": 1.0, "federation.rounds": 25,
              "training.local_epochs": 20, **OPTIMISER, "metrics.every": 5},
    per_column={SAMPLED: {"metrics.every": 10}},
    note="16 clients × 1.0, 25 rounds, E = 20, B = 64 (short last batch dropped), SGD lr 0.01, Nesterov momentum "
         "0.9, wd 1e-4, ResNet-56",
)
QUICK = Scale(
    settings={"data.subsample": 0.02, "federation.clients": 2, "federation.fraction": 1.0, "federation.rounds": 3,
              "training.local_epochs": 2, **OPTIMISER, "training.batch_size": 32, "metrics.every": 3},
    per_column={SAMPLED: {"federation.clients": 8, "federation.fraction": 0.25, "federation.rounds": 12},
                "C=32": {"federation.clients": 4}, "C=64": {"federation.clients": 8},
                "C=64×0.25": {"federation.clients": 8, "federation.fraction": 0.25},
                "E=10": {"training.local_epochs": 1}, "E=30": {"training.local_epochs": 3}},
    substitute="fmnist",
    note="2 % of the data (stratified) over 2 clients × 1.0 (~600 training samples each), 3 rounds, E = 2, B = 32, "
         "the paper's lr and Nesterov momentum, ResNet-56 (columns of more clients: 1/8 of their clients, the "
         "100-round column 12 rounds; E = 10 and 30: E = 1 and 3); "
         "FMNIST stands in for CIFAR-100 and CIFAR-10 — a ResNet-56 barely starts learning in this budget",
)
SCALES = {"paper": PAPER, "quick": QUICK}
UNKNOWNS = (
    "Nesterov momentum 0.9, weight decay 1e-4, batch 64, each epoch's short last batch dropped and clients weighed by "
    "their full batches' samples (docs/methods.md §3: the authors' code; the paper says only 'SGD with momentum, "
    "lr 0.01')",
    "gradient clipping at norm 10 for FedAlign alone (App. E: 'a gradient clip is also applied'; value from "
    "the authors' code)",
    "GradAug's input sizes {32, 28, 24, 20} (the CIFAR sizes) on every dataset",
    "accuracy is the last round's server model; the authors' server logs its test accuracy every round and keeps "
    "the best round's model (methods/base.py), and the paper does not say which of the two it prints",
    "MOON's frozen global and previous models in train mode, batch statistics (method.anchors: train), and a "
    "client's first previous model the initial one (method.first_prev: initial), as the authors' methods/moon.py "
    "runs them; MOON's own code uses eval mode",
    "StochDepth's survival falls from 1 at the first block to ρ_L at the last (method.schedule: code), as the "
    "authors' models/resnet_stochdepth.py builds it; §3.2's formula starts at 1 − (1 − ρ_L)/L",
    "≠ code: each client's optimiser starts afresh every round (the code builds one per worker process, so at "
    "16 × 1.0 a client's momentum carries over from its previous round), and the test split is scored whole (the "
    "code's drop_last test loader scores 9,984 of CIFAR's 10,000 images)",
)
FEDALIGN = Paper(name="FedAlign", cite="Mendieta et al. 2022, arXiv version with appendix", scales=SCALES,
                 unknowns=UNKNOWNS, value="final server-model test accuracy (%)")


def cells(dataset: str, printed: dict[str, tuple[float, ...]], columns: tuple[Column, ...]) -> list[Cell]:
    """Each row's printed values under ``columns``: the row's method on ResNet-56 under the §3.2 setting, plus the
    column's settings."""
    return [Cell(row=row, dataset=dataset, column=column.label, paper=value, metric=column.metric,
                 factor=column.factor, reduce=column.reduce,
                 settings={**COMMON, "method.name": ROWS[row][0], **ROWS[row][1], **column.settings})
            for row, values in printed.items() for column, value in zip(columns, values, strict=True)]


def hessian_table(number: int, printed: dict[str, tuple[float, ...]]) -> PaperTable:
    """Accuracy and the Hessian figures of each method: five cells sharing one run (Tables 1 and 9)."""
    paper = {**HESSIAN_AT_END, "metrics.hessian.clients": 16, "metrics.hessian.batch_size": 64}
    scales = {"paper": SCALES["paper"].plus(paper),
              "quick": SCALES["quick"].plus(
                  {**HESSIAN_AT_END, "metrics.hessian.clients": 2, "metrics.hessian.batches": 1,
                   "metrics.hessian.batch_size": 32, "metrics.hessian.max_iter": 20, "metrics.hessian.tol": 0.01},
                  "; Hessian on 1 batch of 32, ≤ 20 iterations, tol 1e-2, H_N/H_D over the 2 clients")}
    return FEDALIGN.table(
        number, "accuracy (%) and second-order metrics (CIFAR-100)", cells("cifar100", printed, TABLE1_COLUMNS),
        value="final server-model test accuracy (%); λ_max and trace H_T of its training-loss Hessian; H_N and "
        "H_D (Eq. 3–4) across the last round's client models", scales=scales,
        unknowns=("Hessian: 10 batches of 64 training samples, as the authors' pyhessian/hessian.py stops its "
                  "loader after 10 batches of the run's batch size; H_N/H_D over all 16 clients of the last round",
                  "≠ code: the Hessian is that of the final server model on a fixed, seeded set without augmentation; "
                  "the authors' compute_hessian.py loads server.pt, which their server saves whenever its accuracy "
                  "improves (the best round's model), and its shuffled, augmented training loader draws other "
                  "batches at every Hessian-vector product"),
    )


def ablation(number: int, what: str, printed: dict[str, tuple[float, ...]], columns: dict[str, dict[str, Any]],
             extra_unknowns: tuple[str, ...] = ()) -> PaperTable:
    """An accuracy table whose columns each change the §3.2 setting (Tables 2, 3, 4, 6 and 10)."""
    measured = cells("cifar100", printed, tuple(Column(label, settings=extra) for label, extra in columns.items()))
    return FEDALIGN.table(number, f"accuracy (%) {what} (CIFAR-100)", measured, unknowns=extra_unknowns)


def table5() -> PaperTable:
    """Accuracy, forward MFLOPs, stored parameters and s/round of each method: four cells, one run."""
    return FEDALIGN.table(
        5, "accuracy, local compute, stored parameters and time per round",
        cells("cifar100", TABLE5, TABLE5_COLUMNS),
        value="final server-model test accuracy (%); training forward MFLOPs per sample (MACs); parameters "
        "stored while training (M); wall seconds per round (mean over rounds; the paper's on 4 RTX-2080Ti)",
        unknowns=("MFLOPs of the stochastic methods (StochDepth, GradAug) are round 1's average over its batches; "
                  "time is this machine's, with its worker count",))


def table7() -> PaperTable:
    """CIFAR-10: 16 clients synchronous, 64 × 0.25 for 100 rounds, and the C = 16 run's MFLOPs and parameters."""
    return FEDALIGN.table(
        7, "CIFAR-10 accuracy (%), MFLOPs and parameters", cells("cifar10", TABLE7, TABLE7_COLUMNS),
        value="final server-model test accuracy (%); training forward MFLOPs per sample (MACs); stored parameters (M)",
        source="Table 7 (CIFAR-10 columns)",
        unknowns=("Table 7's ImageNet-200 columns are not registered (no loader in fltune)",))


def table8() -> PaperTable:
    """Rounds, MFLOPs and upload Gbit until the server model first reaches 60 % (three cells, one run)."""
    scales = {"paper": SCALES["paper"].plus({"federation.rounds": 100, "metrics.every": 1, "metrics.target": 0.6}),
              "quick": SCALES["quick"].plus({"federation.rounds": 6, "metrics.every": 1, "metrics.target": 0.5},
                                            "; 6 rounds, target 50 %")}
    return FEDALIGN.table(
        8, "rounds, MFLOPs and communication to reach 60 % (CIFAR-100)", cells("cifar100", TABLE8, TABLE8_COLUMNS),
        value="first round the server model reaches 60 %; training forward MFLOPs (MACs) per sample × those rounds, as "
        "the paper's numbers are computed (87.3 × 84 = 7332); Gbit uploaded by then (32-bit weights)",
        scales=scales, source="appendix Table 8", percent=False,
        unknowns=("rounds: at most 100 (the paper runs until 60 %; its slowest method needs 84)",
                  "uploads are the whole state at its dtypes (BN buffers included), the paper counts parameters"),
    )


TABLES = [
    hessian_table(1, TABLE1),
    ablation(2, "under data heterogeneity Dir(α)", TABLE2, TABLE2_COLUMNS),  # α ∈ {0.1, 0.5, 2.5} and iid
    ablation(3, "by local epochs E", TABLE3, EPOCHS),  # E = 10, 20 and 30 local epochs a round
    # 16, 32 and 64 clients all sampled, and 64 with 25 % a round for 25 and 100 rounds
    ablation(4, "by number of clients C (× fraction sampled; (100): 100 rounds)", TABLE4, CLIENTS),
    table5(),
    # FedAlign under Tables 2–4's settings: one row, each column its table's
    ablation(6, "of FedAlign under Tables 2–4's settings", {"FedAlign": tuple(TABLE6.values())},
             {column: ABLATIONS[column] for column in TABLE6}),
    table7(),
    table8(),
    hessian_table(9, TABLE9),
    # FedAlign's μ and ω_S, each varied with the other at its default
    ablation(10, "of FedAlign by μ and ω_S", {"FedAlign": TABLE10_VALUES}, TABLE10,
             ("Table 10's two default columns (μ = 0.45, ω_S = 0.25) are the same run, Table 5's FedAlign",)),
]
