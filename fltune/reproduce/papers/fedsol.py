"""FedSOL (Lee et al. 2024) Table 1 (the proximal loss's uses), Table 2 (Sharding and LDA), Table 3 (architectures),
Table 5 (partial perturbation) and Table 9 (personalised accuracy), under the protocol of §4.1 and App. B.3–B.5
(``PAPER``, ``sharding``, ``lda``).

Table 4 (FedSOL perturbing by FedProx's, FedNova's, Scaffold's, FedDyn's or MOON's proximal loss) is not registered: the
authors' code has no such variants and the paper gives no formulation for them."""

from __future__ import annotations

from typing import Any

from fltune.reproduce.table import Cell, Paper, PaperTable, Scale

ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    # paper row: (method, its App. B.5 Table 8 hyperparameters; the rest are fltune's defaults)
    "FedAvg": ("fedavg", {}),
    "FedProx": ("fedprox", {"method.mu": 1.0}),
    "FedNova": ("fednova", {}),
    "Scaffold": ("scaffold", {}),
    "FedNTD": ("fedntd", {"method.tau": 1.0, "method.beta": 1.0}),
    "FedSAM": ("fedsam", {"method.rho": 0.1}),
    "FedASAM": ("fedasam", {"method.rho": 1.0}),
    "FedSOL": ("fedsol", {}),  # ρ = 1, head perturbed, adaptive (§3.3–3.4), KL at T = 3 (App. B.5)
}

# Table 2 as printed, per row: MNIST, CIFAR-10 s|α (four values), SVHN, CINIC-10, PathMNIST, TissueMNIST.
SHARDING = {
    "FedAvg": (96.16, 51.48, 62.94, 70.96, 74.60, 73.63, 42.40, 57.40, 49.36),
    "FedProx": (95.86, 52.80, 58.19, 64.71, 69.37, 71.09, 40.00, 60.77, 48.20),
    "FedNova": (94.13, 46.89, 61.12, 67.11, 70.59, 67.35, 40.94, 58.85, 36.44),
    "Scaffold": (95.91, 62.60, 68.53, 74.28, 76.71, 77.84, 47.76, 71.12, 30.99),
    "FedNTD": (96.62, 67.25, 70.47, 75.21, 76.46, 85.30, 52.72, 65.00, 52.63),
    "FedSAM": (96.12, 51.85, 60.90, 69.29, 72.98, 65.85, 45.91, 67.32, 49.62),
    "FedASAM": (97.08, 52.08, 63.24, 70.95, 74.74, 79.48, 43.15, 59.47, 49.46),
    "FedSOL": (97.15, 66.72, 69.88, 75.82, 77.79, 85.18, 55.17, 73.85, 53.42),
}
LDA = {
    "FedAvg": (96.11, 42.27, 56.13, 67.32, 73.90, 55.36, 36.49, 65.98, 42.78),
    "FedProx": (96.05, 50.58, 59.80, 68.39, 72.87, 72.40, 40.09, 70.44, 52.25),
    "FedNova": (88.24, 10.00, 10.00, 64.67, 70.04, 53.07, 21.89, 38.94, 15.03),
    "Scaffold": (94.18, 10.00, 10.00, 71.92, 75.49, 21.46, 16.89, 18.07, 32.04),
    "FedNTD": (96.97, 58.08, 63.16, 71.56, 74.91, 79.25, 50.22, 74.26, 44.55),
    "FedSAM": (95.72, 36.14, 52.14, 64.83, 70.74, 13.27, 36.70, 66.64, 44.07),
    "FedASAM": (96.60, 43.12, 57.00, 67.45, 73.91, 60.25, 36.93, 69.45, 42.73),
    "FedSOL": (97.44, 60.01, 64.13, 71.94, 75.60, 83.92, 55.07, 78.88, 53.40),
}
SHARDS = (2, 2, 3, 5, 10, 2, 2, 2, 2)
"""s per column; not printed for MNIST, SVHN, CINIC-10 and the MedMNIST sets: [U] 2, the authors' config default."""
ALPHAS = (0.1, 0.05, 0.1, 0.3, 0.5, 0.1, 0.1, 0.1, 0.1)
"""α per column; not printed for MNIST, SVHN, CINIC-10 and the MedMNIST sets: [U] 0.1, the authors' config default
(Table 4's FedProx 'Base' values are Table 2's LDA ones: SVHN 72.40, CINIC-10 40.09, CIFAR-10 59.80 at α = 0.1)."""
DATASETS = ("mnist", "cifar10", "cifar10", "cifar10", "cifar10", "svhn", "cinic10", "pathmnist", "tissuemnist")
WIDE = {"federation.clients": 200, "federation.fraction": 0.05}
"""§4.1 and App. B Table 7: CINIC-10, PathMNIST and TissueMNIST over 200 clients, 5 % a round."""

OPTIMISER = {"training.batch_size": 50, "training.lr": 0.01, "training.momentum": 0.9, "training.weight_decay": 1e-5,
             "training.lr_decay": 0.99}
"""Every row's client optimiser (§4.1, App. B.5 configs)."""
PAPER = Scale(
    settings={
        "federation.clients": 100, "federation.fraction": 0.1, "federation.rounds": 300,
        "training.local_epochs": 5, **OPTIMISER, "metrics.every": 10,
    },
    per_dataset={
        # the authors' loaders (train_tools/preprocessing/*/loader.py): MNIST adds Cutout(16) too, which App. B.2
        # does not list; SVHN has none
        "mnist": {"federation.rounds": 200, "data.augment": "crop_flip_cutout"},
        "svhn": {"data.augment": "crop_flip"},
        "cifar10": {"data.augment": "crop_flip_cutout"},
        "cinic10": {**WIDE, "data.augment": "reflect_crop_flip"},  # 300 rounds
        "pathmnist": {**WIDE, "federation.rounds": 200, "data.augment": "flip"},
        "tissuemnist": {**WIDE, "federation.rounds": 200, "data.augment": "flip"},
    },
    note="100 clients × 0.1 (CINIC-10, PathMNIST, TissueMNIST 200 × 0.05), 300 rounds (MNIST, PathMNIST, "
         "TissueMNIST 200), E = 5, B = 50, SGD lr 0.01 × 0.99^r, momentum 0.9, "
         "wd 1e-5, FedAvg CNN",
)
QUICK = Scale(
    settings={
        "data.subsample": 0.1, "federation.clients": 20, "federation.fraction": 0.25, "federation.rounds": 10,
        "training.local_epochs": 2, **OPTIMISER, "metrics.every": 5,
    },
    substitute="fmnist",
    note="10 % of the data (stratified) over 20 clients × 0.25 (~300 training samples each, 5 per round), "
         "10 rounds, E = 2, the paper's optimiser, FedAvg CNN; FMNIST stands in for every dataset",
)
COMMON = {"model.name": "fedavg_cnn", "metrics.protocols": ["global"]}
UNKNOWNS = (
    "MNIST, SVHN, CINIC-10, PathMNIST and TissueMNIST columns: s and α not printed; s = 2, α = 0.1 (the "
    "authors' configs' defaults)",
    "SVHN rounds: 300 (§4.1 and docs/methods.md §3; App. B Table 7 says 200)",
    "MNIST and TissueMNIST kept 1-channel (the paper converts them to RGB); the FedAvg CNN's first conv takes 1 "
    "channel",
    "FedSOL's ρ: 1.0 (docs/methods.md; App. B.5's value is not printed — Table 5's head-only ρ = 1.5 equals "
    "Table 2's CIFAR-10 α = 0.1 value 64.13, so the authors may have used 1.5 there)",
    "FedASAM's η: 0.2 (fltune's default; App. B.5 gives only ρ = 1.0)",
)


FEDSOL = Paper(name="FedSOL", cite="Lee et al. 2024", scales={"paper": PAPER, "quick": QUICK}, unknowns=UNKNOWNS,
               value="test accuracy of the final server model (%)")


def cell(row: str, dataset: str, column: str, paper: float, partition: dict[str, Any],
         extra: dict[str, Any] | None = None, method_row: str | None = None) -> Cell:
    """A cell: ``method_row``'s method and hyperparameters (default: ``row``'s) on ``partition``, then ``extra``
    (which may name another method), compared on global accuracy."""
    method, params = ROWS[method_row or row]
    settings = {**COMMON, **partition, "method.name": method, **params, **(extra or {})}
    return Cell(row=row, dataset=dataset, column=column, paper=paper, metric="acc_global", settings=settings)


def sharding(s: int) -> dict[str, Any]:
    """The authors' sharding (``class_shards``): each class cut into its own s·N/C shards."""
    return {"partition.kind": "class_shards", "partition.shards_per_client": s}


def lda(alpha: float) -> dict[str, Any]:
    """FedML's per-class Dirichlet(α) over clients (``dirichlet``)."""
    return {"partition.kind": "dirichlet", "partition.alpha": alpha}


def table2() -> PaperTable:
    """Both halves of Table 2: Sharding (s) then LDA (α) columns, per dataset in the paper's order."""
    cells = [cell(row, DATASETS[i], f"Sharding s={SHARDS[i]}", SHARDING[row][i], sharding(SHARDS[i]))
             for row in ROWS for i in range(len(DATASETS))]
    cells += [cell(row, DATASETS[i], f"LDA α={ALPHAS[i]:g}", LDA[row][i], lda(ALPHAS[i]))
              for row in ROWS for i in range(len(DATASETS))]
    return FEDSOL.table(2, "accuracy (%) under Sharding (s) and LDA (α) partitions", cells)


# Table 5 (CIFAR-10, LDA α = 0.1) per scope and ρ; ρ = 0 perturbs nothing (FedAvg, Table 2's 56.13): printed once.
TABLE5 = {
    "All (full)": ("all", {0.0: 56.13, 0.5: 61.17, 1.0: 64.16, 1.5: 64.38, 2.0: 63.94}),
    "Body (partial)": ("body", {0.5: 60.98, 1.0: 62.95, 1.5: 63.94, 2.0: 63.80}),
    "Head (partial)": ("head", {0.5: 62.65, 1.0: 63.62, 1.5: 64.13, 2.0: 63.25}),
}


def table5() -> PaperTable:
    """Partial perturbation: FedSOL with ``method.scope`` all / body / head at each ρ. The FLOPs column (relative
    cost 2 / 1.96 / 1.33) is not registered: fltune counts a method's passes, not the share of the model a partial
    perturbation touches."""
    cells = [cell(row, "cifar10", f"ρ={rho:g}", value, lda(0.1), {"method.scope": scope, "method.rho": rho}, "FedSOL")
             for row, (scope, values) in TABLE5.items() for rho, value in values.items()]
    return FEDSOL.table(
        5, "accuracy (%) perturbing all, the body or the head (CIFAR-10, LDA α = 0.1)", cells,
        unknowns=("Table 5's partition: CIFAR-10 LDA α = 0.1 (its ρ = 0 value is Table 2's FedAvg there)",),
    )


# Table 3 as printed: per architecture and row, CIFAR-10, SVHN, PathMNIST.
TABLE3 = {
    "Vgg11": {"FedAvg": (41.30, 50.02, 61.79), "FedProx": (40.45, 31.07, 63.47), "FedNTD": (60.55, 56.62, 69.82),
              "FedSOL": (56.39, 74.74, 78.38)},
    "Res18": {"FedAvg": (49.92, 76.98, 57.91), "FedProx": (59.00, 82.09, 75.84), "FedNTD": (57.79, 78.50, 76.87),
              "FedSOL": (66.32, 85.97, 80.59)},
    "SL-ViT": {"FedAvg": (35.48, 53.94, 72.44), "FedProx": (38.73, 58.25, 74.10), "FedNTD": (47.59, 61.46, 71.65),
               "FedSOL": (47.95, 67.19, 77.96)},
}
TABLE3_DATASETS = ("cifar10", "svhn", "pathmnist")
ARCHITECTURES = {
    "Vgg11": {"model.name": "vgg11"},
    "Res18": {"model.name": "resnet18", "model.options": {"running_stats": False}},
    "SL-ViT": {"model.name": "sl_vit"},
}
"""The authors' models (``train_tools/models/{vgg,resnet,small_vit}.py``, via ``create_models``): VGG-11 without
BatchNorm; ResNet-18 with ``track_running_stats=False``; SL-ViT: patch side min(H/4, 16), dim 192, depth 9, 12 heads."""


def table3() -> PaperTable:
    """Four rows on three architectures: a column per (dataset, architecture), Table 2's settings otherwise."""
    cells = [cell(row, dataset, arch, values[i], lda(0.1), ARCHITECTURES[arch])
             for arch, rows in TABLE3.items() for row, values in rows.items()
             for i, dataset in enumerate(TABLE3_DATASETS)]
    return FEDSOL.table(
        3, "accuracy (%) on VGG-11, ResNet-18 and SL-ViT", cells,
        unknowns=(
            "Table 3's partition: not printed; LDA α = 0.1, the authors' config default (and Tables 4–5's)",
            "SL-ViT on 28×28 PathMNIST: patches of 7 on the 28×28 image, as the code's create_models builds it "
            "(App. B.1 says the images are resized)",
        ),
    )


def proximal(loss: str, usage: str) -> dict[str, Any]:
    """The ``proximal`` method with L_p = ``loss`` used as ``usage`` (β = 1 with base: [U])."""
    return {"method.name": "proximal", "method.loss": loss, "method.usage": usage}


def table1() -> PaperTable:
    """§2.3: the proximal loss as an auxiliary loss (Base, Eq. 2) or by gradient projection (Eq. 3), on
    CIFAR-10 LDA α = 0.1 (its L2 Base value is Table 2's FedProx there); L2 Base is FedProx's row."""
    cells = [
        cell("None (FedAvg)", "cifar10", "Base", 59.80, lda(0.1), method_row="FedAvg"),
        cell("L2 Distance", "cifar10", "Base", 59.80, lda(0.1), method_row="FedProx"),
        cell("L2 Distance", "cifar10", "Projection", 56.35, lda(0.1), proximal("l2", "projection"), "FedAvg"),
        cell("KL-Divergence", "cifar10", "Base", 60.31, lda(0.1), proximal("kl", "base"), "FedAvg"),
        cell("KL-Divergence", "cifar10", "Projection", 50.88, lda(0.1), proximal("kl", "projection"), "FedAvg"),
    ]
    return FEDSOL.table(
        1, "accuracy (%) using a proximal loss as a loss or by projection", cells,
        unknowns=(
            "Table 1's setting: CIFAR-10, LDA α = 0.1 (not printed; its L2 Base value is Table 2's FedProx "
            "there, 59.80)",
            "its None (FedAvg) value is printed as 59.80, FedProx's; Table 2 prints 56.13 for FedAvg there",
            "KL Base: CE + β·KL with β = 1 (not printed); the projection and the KL Base are not in the "
            "authors' code, the projection is Eq. 3 over all parameters as one vector",
        ),
        row_settings={
            "None (FedAvg)": "fedavg",
            "L2 Distance": "Base: fedprox, μ 1 (Table 2's row); Projection: proximal, loss l2 (Eq. 3)",
            "KL-Divergence": "Base: proximal, loss kl, β 1 [U] (Eq. 2); Projection: proximal, loss kl (Eq. 3); "
                             "KL at T = 3 against the global model, as FedSOL's",
        },
    )


# Table 9 (App. D) as printed: per row and τ (fine-tuning epochs), CIFAR-10, SVHN, TissueMNIST.
TABLE9 = {
    "Local-only": {None: (84.7, 87.4, 82.4)},
    "FedAvg": {1: (84.1, 86.6, 82.2), 5: (88.9, 92.1, 89.2)},
    "PerFedAvg": {1: (80.5, 64.1, 82.3), 5: (86.3, 72.4, 88.8)},
    "FedBabu": {1: (84.6, 88.7, 85.7), 5: (89.2, 92.7, 90.5)},
    "kNN-Per": {1: (85.7, 86.4, 86.5), 5: (89.7, 92.8, 91.4)},
    "FedSoL-FT": {1: (87.5, 92.5, 88.1), 5: (90.5, 95.0, 91.6)},
}
PERSONALISED = {
    # row: its method and the authors' configs/personalized/*.json parameters
    "Local-only": {"method.name": "local_only", "federation.fraction": 1.0, "federation.rounds": 200,
                   "training.local_epochs": 1},
    "FedAvg": {"method.name": "fedavg"},
    "PerFedAvg": {"method.name": "perfedavg", "method.beta": 0.01},
    "FedBabu": {"method.name": "fedbabu"},
    "kNN-Per": {"method.name": "knnper", "method.capacity": 500, "method.k": 5, "method.weight": 0.5,
                "method.scale": 1.0},
    "FedSoL-FT": {"method.name": "fedsol"},
}
"""Local-only is one 200-epoch local run with the lr × 0.99 an epoch (``configs/personalized/localonly.json``):
200 rounds of one epoch on every client, each keeping its whole model, at the rounds' decayed lr."""
ALIGNED = {**lda(0.1), "partition.test_per_client": 1000, "metrics.protocols": ["global", "personalized"]}
"""Every Table 9 config's partition (LDA α = 0.1, 100 clients) and the code's per-client ``test_align`` split: 1000
test samples in the client's label proportions (``train_tools/preprocessing/datasetter.py``)."""
ROW_TEXT = {
    "Local-only": "local_only: every client's whole model stays its own (no averaging)",
    "FedAvg": "fedavg, then the whole model fine-tuned on CE",
    "PerFedAvg": "perfedavg, β 0.01 (first-order MAML, as the code); fine-tuned by its own MAML steps",
    "FedBabu": "fedbabu (head frozen at init), then the whole model fine-tuned on CE",
    "kNN-Per": "knnper: FedAvg, the whole model fine-tuned, then scored with a kNN over its training "
               "features (capacity 500, k 5, weight 0.5, scale 1)",
    "FedSoL-FT": "fedsol (Table 2's), then the whole model fine-tuned on CE without perturbation",
}
"""Each Table 9 row's settings, for every τ of it."""


def table9() -> PaperTable:
    """App. D: personalised accuracy after fine-tuning the whole final model τ epochs on each client (the code's
    ``finetune``: plain CE, Per-FedAvg by its own MAML steps), on its label-aligned test split."""
    cells, labels = [], {}
    for row, by_tau in TABLE9.items():
        for tau, values in by_tau.items():
            tuned = {"training.finetune_epochs": tau, "training.finetune_params": "all"} if tau else {}
            label = f"{row} τ={tau}" if tau else row
            labels[label] = row
            metric = "acc_personalized_ft" if tau else "acc_personalized"
            cells += [Cell(row=label, dataset=dataset, column="LDA α=0.1", paper=value, metric=metric,
                           settings={**COMMON, **ALIGNED, **PERSONALISED[row], **tuned})
                      for dataset, value in zip(("cifar10", "svhn", "tissuemnist"), values, strict=True)]
    return FEDSOL.table(
        9, "personalised accuracy (%) after τ epochs of fine-tuning", cells, source="App. D, Table 9",
        value="mean over clients of the fine-tuned model's accuracy on the client's own test split (%)",
        scales={"paper": PAPER,
                "quick": QUICK.model_copy(update={"per_row": {"Local-only": {"federation.rounds": 10}}})},
        unknowns=(
            "Table 9's setting: not printed; LDA α = 0.1 over 100 clients, 300 rounds, E = 5, the authors' "
            "configs/personalized/*.json (SVHN and TissueMNIST as in Table 2)",
            "τ: the code fine-tunes min(E, 5) epochs; τ = 1 is read as one epoch of the same fine-tuning",
            "fine-tuning lr: the server's decayed lr after the last round (0.01 · 0.99^300), as the code's "
            "downloaded optimiser holds it",
            "Local-only: 200 rounds of one epoch on every client (the code: one 200-epoch run), so its "
            "momentum restarts each epoch",
            "the code's personalised evaluation is commented out of algorithms/BaseServer.py; Table 9 is read "
            "as its finetune() after the last round on every client",
        ),
        row_settings={label: ROW_TEXT[row] for label, row in labels.items()},
    )


TABLES = [build() for build in (table1, table2, table3, table5, table9)]
