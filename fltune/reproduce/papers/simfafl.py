"""SimFAFL (papers/simfafl.md) Tables 2–4: personalised FL on EMNIST-L, FMNIST, CIFAR-10, CIFAR-100.

Protocol (§5.1): 100 clients, 10 % per round; non-IID1 = `classes` (k = 5 EMNIST/CIFAR-10, 3 FMNIST, 15
CIFAR-100), non-IID2 = `dirichlet_prior` (δ = 0.5, 0.3 for CIFAR-100); train and test pooled, each client
split 70/30; a number is the mean over clients of each client's model on its own 30 % (``personalized``).
Rows ending in -FT fine-tune the head of the final model on every client before that evaluation.
"""

from __future__ import annotations

from typing import Any

from fltune.methods import get_method
from fltune.reproduce.registry import Cell, PaperTable, Scale, register_table

COLUMNS = {"non-IID1": {"partition.kind": "classes"}, "non-IID2": {"partition.kind": "dirichlet_prior"}}
ALPHA = {"emnist_letters": 0.5, "fmnist": 0.5, "cifar10": 0.5, "cifar100": 0.3}
PLAIN_MODEL = {"emnist_letters": "fedcr_mlp", "fmnist": "fedcr_cnn", "cifar10": "fedcr_cnn", "cifar100": "fedcr_cnn"}
"""§5.1 "all methods share the same model architecture per dataset": FedCR's trunks; the rows whose method
takes any model use their plain twins, the VIB rows (FedSR, FedCR, SimFAFL) pick the VIB nets themselves."""
BETAS = {"cifar100": {"method.beta1": 0.003, "method.beta2": 0.2}}
"""§5.1: β1 = 0.0025, β2 = 0.1 (SimFAFL's defaults) for the 10-class tasks; 0.003 / 0.2 for CIFAR-100."""

ROWS: dict[str, tuple[str, bool]] = {
    # paper row: (method, ends with the head fine-tuning phase)
    "FedAvg": ("fedavg", False),
    "FedAvg-FT": ("fedavg", True),
    "FedPer": ("fedper", False),
    "LG-FedAvg": ("lg_fedavg", False),
    "FedRep": ("fedrep", False),
    "FedBABU": ("fedbabu", True),  # FedBABU's own algorithm ends by fine-tuning its frozen-at-init head
    "Ditto": ("ditto", False),
    "FedSR-FT": ("fedsr", True),
    "FedPAC": ("fedpac", False),
    "FedCR": ("fedcr", True),  # FedCR's final round: every client fine-tunes its head, body frozen
    "SimFAFL": ("simfafl", True),  # [U] built on FedCR's code, so its final fine-tuning kept too
}

# Table 2 as printed: EMNIST n1, n2, FMNIST n1, n2, CIFAR-10 n1, n2, CIFAR-100 n1, n2.
TABLE2 = {
    "FedAvg": (94.3988, 94.5000, 84.1754, 86.6588, 76.8556, 76.0722, 26.8667, 28.5389),
    "FedAvg-FT": (96.2500, 95.8036, 95.8294, 91.7630, 83.6444, 83.3500, 53.1222, 38.3222),
    "FedPer": (94.21429, 91.39286, 95.08531, 88.3223, 71.2278, 68.8056, 39.4944, 24.3167),
    "LG-FedAvg": (87.8571, 85.1429, 94.0569, 87.1043, 62.9056, 63.7611, 43.9889, 27.3722),
    "FedRep": (91.1369, 87.8333, 93.0995, 85.9479, 67.7333, 67.4167, 40.6444, 23.1667),
    "FedBABU": (94.2143, 91.3929, 95.0569, 88.3460, 71.2278, 68.8056, 39.4944, 24.3167),
    "Ditto": (95.7321, 95.88010, 91.1422, 84.8673, 78.5111, 78.9722, 26.5500, 35.7833),
    "FedSR-FT": (85.0721, 80.5706, 91.9182, 83.1364, 57.5833, 60.5778, 37.9445, 24.0167),
    "FedPAC": (97.3512, 96.6012, 95.7630, 91.5024, 82.9611, 81.2167, 63.7000, 41.1444),
    "FedCR": (97.1765, 96.3088, 96.3318, 93.0000, 82.9161, 82.7333, 59.0556, 42.9111),
    "SimFAFL": (97.6824, 97.0015, 96.7400, 92.8227, 85.0722, 84.2222, 61.2111, 46.1333),
}
# Table 3 (ablation of SimFAFL's constraints), same columns.
TABLE3 = {  # row: (constraints dropped, values)
    "non-constraint": (("method.beta1", "method.beta2"), (94.8389, 94.9533, 93.3728, 90.9202, 63.2619, 68.3190, 39.9522, 29.7148)),
    "with L_ca": (("method.beta2",), (96.1380, 96.3144, 96.0014, 92.5024, 84.4444, 83.4911, 57.3922, 38.1615)),
    "with L_sa": (("method.beta1",), (96.2799, 96.5000, 95.1832, 91.3411, 82.2167, 82.0900, 56.6933, 36.2740)),
    "SimFAFL": ((), (97.6824, 97.0015, 96.7400, 92.8227, 85.0722, 84.2222, 61.2111, 46.1333)),
}
DATASETS = ("emnist_letters", "fmnist", "cifar10", "cifar100")
CELL_ORDER = [(d, col) for d in DATASETS for col in COLUMNS]

SCALES = {
    "paper": Scale(
        settings={
            "federation.clients": 100, "federation.fraction": 0.1, "federation.rounds": 500,
            "training.local_epochs": 10, "training.batch_size": 48, "training.lr": 0.05,
            "training.momentum": 0.5, "metrics.every": 10,
        },
        finetune_epochs=10,
        note="100 clients × 0.1, 500 rounds, E = 10, B = 48, SGD lr 0.05 (FedCR's runs; [U] in SimFAFL)",
    ),
    "quick": Scale(
        settings={
            "data.subsample": 0.2, "federation.clients": 20, "federation.fraction": 0.5, "federation.rounds": 20,
            "training.local_epochs": 2, "training.batch_size": 48, "training.lr": 0.05,
            "training.momentum": 0.5, "metrics.every": 5,
        },
        finetune_epochs=3,
        note="20 % of the data (stratified) over 20 clients × 0.5 — each client keeps the paper's ~490 "
             "training / 210 held-out samples and is trained ~10 times — 20 rounds, E = 2, 3 fine-tuning epochs",
    ),
}
COMMON = {
    "partition.eval_fraction": 0.3, "partition.pool_test": True,
    "metrics.protocols": ["personalized", "global"],
}
UNKNOWNS = (
    "rounds, local epochs, batch, lr: not in SimFAFL; FedCR's runs (500, 10, 48, 0.05) at paper scale",
    "momentum 0.5: the FedRep code base FedCR builds on",
    "FedCR and SimFAFL end with FedCR's final head fine-tuning (reported as acc_personalized_ft)",
    "rows of methods that take any model use FedCR's trunks with a plain last layer (fedcr_cnn / fedcr_mlp)",
)


def cell(row: str, dataset: str, column: str, paper: float | None, method: str, finetune: bool,
         extra: dict[str, Any] | None = None) -> Cell:
    """A Table 2-style cell: the method, its model, the column's partition and the dataset's β."""
    settings: dict[str, Any] = {**COMMON, **COLUMNS[column], "partition.alpha": ALPHA[dataset], "method.name": method}
    if method == "simfafl":
        settings.update(BETAS.get(dataset, {}))
    if get_method(method).model_for(dataset) is None:
        settings["model.name"] = PLAIN_MODEL[dataset]
    settings.update(extra or {})
    return Cell(row=row, dataset=dataset, column=column, paper=paper, settings=settings, finetune=finetune,
                metric="acc_personalized_ft" if finetune else "acc_personalized")


def table2() -> PaperTable:
    cells = [cell(row, d, col, TABLE2[row][i], *ROWS[row]) for row in ROWS for i, (d, col) in enumerate(CELL_ORDER)]
    return PaperTable(
        key="simfafl:table2", title="SimFAFL Table 2: final test accuracy (%) of SimFAFL and other methods",
        source="papers/simfafl.md, Table 2", value="mean over clients of the accuracy on their own 30 % (%)",
        cells=tuple(cells), scales=SCALES, unknowns=UNKNOWNS,
    )


def table3() -> PaperTable:
    """Ablation: a dropped constraint's β is 0; the others keep the dataset's Table 2 value."""
    cells = [cell(row, d, col, values[i], "simfafl", True, dict.fromkeys(dropped, 0.0))
             for row, (dropped, values) in TABLE3.items() for i, (d, col) in enumerate(CELL_ORDER)]
    return PaperTable(
        key="simfafl:table3", title="SimFAFL Table 3: ablation of the constraints L_ca (β1) and L_sa (β2)",
        source="papers/simfafl.md, Table 3", value="mean over clients of the accuracy on their own 30 % (%)",
        cells=tuple(cells), scales=SCALES, unknowns=UNKNOWNS,
    )


TABLE4_WEIGHTS = {
    "FedCR-β": ("fedcr", "method.beta", (0.0001, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008),
                (40.81, 40.14, 42.91, 41.07, 39.74, 35.10, 21.89, 14.75), {}),
    "SimFAFL-β1": ("simfafl", "method.beta1", (0.0001, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008),
                   (39.17, 41.95, 44.79, 45.27, 46.04, 46.78, 46.59, 45.96), {"method.beta2": 0.3}),
    "SimFAFL-β2": ("simfafl", "method.beta2", (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
                   (44.79, 45.02, 45.50, 46.13, 46.78, 46.66, 46.33, 46.80), {"method.beta1": 0.003}),
}


def table4() -> PaperTable:
    """β sweeps on CIFAR-100 non-IID2 (§5.4: β2 = 0.3 while β1 varies, β1 = 0.003 while β2 varies)."""
    cells = []
    for row, (method, field, weights, values, fixed) in TABLE4_WEIGHTS.items():
        for weight, value in zip(weights, values):
            c = cell(row, "cifar100", "non-IID2", value, method, True, {**fixed, field: weight})
            cells.append(c.model_copy(update={"column": f"non-IID2 {field.split('.')[1]}={weight:g}"}))
    quick = SCALES["quick"].model_copy(update={
        "substitute": "fmnist", "note": SCALES["quick"].note + "; FMNIST stands in when CIFAR-100 is absent"})
    return PaperTable(
        key="simfafl:table4", title="SimFAFL Table 4: accuracy (%) on CIFAR-100 non-IID2 under varying β1, β2",
        source="papers/simfafl.md, Table 4", value="mean over clients of the accuracy on their own 30 % (%)",
        cells=tuple(cells), scales={**SCALES, "quick": quick}, unknowns=UNKNOWNS,
    )


for build in (table2, table3, table4):
    register_table(build())
