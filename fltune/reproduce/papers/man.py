"""MAN (Yashwanth et al. 2023) Table 1 (accuracy and rounds to the target), Table 2 and supplementary Table 6
(top eigenvalue and trace) and supplementary Table 5 (CIFAR-10): six FL methods with and without the MAN regulariser.

Protocol (§4, supp. §7, the authors' code ``vcl-iisc/fedMAN``): ``COMMON``, ``OPTIMISER`` and ``PAPER``; each
base's own settings in ``IID_PARAMS`` and ``TINY*``; a paper number is a mean over 3 seeds (``--seeds 3``).

Tiny-ImageNet as the authors' code runs it (``vcl-iisc/fedMAN:code/run_exp.sh``: ``--dataset_name=TinyImageNet
--model_name=ConvNet``; ``utils_dataset.py``): the 100,000 training images over 100 clients, the 10,000 validation
images as the test set, ImageNet's normalisation, FedDyn's flip and half-time crop at 64×64, and MAN's term as that
``ConvNet`` computes it (``TinyImageNetCNN``)."""

from __future__ import annotations

from typing import Any

from fltune.reproduce.table import HESSIAN_AT_END, Cell, Paper, PaperTable, Scale

BASES = {"FedAvg": "fedavg", "FedSAM": "fedsam", "FedASAM": "fedasam", "FedDyn": "feddyn", "FedDC": "feddc",
         "FedSpeed": "fedspeed"}
"""Paper name → fltune method; the '+MAN' row of each is ``<method>+man`` (MAN composed onto the base)."""
COLUMNS = {"δ=0.3": {"partition.kind": "dirichlet_prior", "partition.alpha": 0.3},
           "δ=0.6": {"partition.kind": "dirichlet_prior", "partition.alpha": 0.6},
           "iid": {"partition.kind": "iid"}}
IID_PARAMS = {"fedasam": {"method.rho": 0.1}, "fedspeed": {"method.rho": 0.01}}
"""Supp. §7: FedASAM ρ = 0.1 and FedSpeed ρ = 0.01 for iid; non-iid ρ (0.5, 0.1) and FedSAM's 0.05,
FedDyn/FedDC's α = 0.01, FedASAM's η = 0.2 and MAN's ζ = 0.15 are fltune's defaults."""
TINY = {"model.name": "tinyimagenet_cnn"}
"""Every Tiny-ImageNet cell: the authors' ``ConvNet`` (supp. Table 4, ``run_exp.sh``'s ``--model_name``)."""
TINY_MAN = {"method.zeta": 0.1}
"""Tiny-ImageNet's +MAN rows: ζ = 0.1, §4's value and the ``--mu_mean`` the authors' ``EXPERIMENTS.md`` says they
used ("0.15 for CIFAR100 and 0.1 for Tiny-Imagenet"; the code halves it, as fltune's ``halve`` default does)."""
TINY_IID_FEDSAM = {"FedSAM": {"method.rho": 0.03}, "FedSAM+MAN": {"method.rho": 0.01}}
"""Supp. §7: FedSAM ρ = 0.03 and FedSAM+MAN ρ = 0.01 only for Tiny-ImageNet's iid partition."""

# Table 1, CIFAR-100 as printed: per column (accuracy, std over 3 seeds, rounds to 50 % or None = "500+").
TABLE1 = {
    "FedAvg": ((40.90, 0.62, None), (40.39, 0.59, None), (39.40, 0.84, None)),
    "FedAvg+MAN": ((52.00, 0.36, 206), (52.42, 0.23, 210), (52.59, 0.25, 224)),
    "FedSAM": ((43.44, 0.11, None), (43.36, 0.24, None), (41.31, 0.27, None)),
    "FedSAM+MAN": ((51.59, 0.48, 326), (52.62, 0.40, 281), (52.85, 0.13, 301)),
    "FedASAM": ((46.00, 0.10, None), (45.48, 0.08, None), (44.18, 0.61, None)),
    "FedASAM+MAN": ((51.23, 0.20, 313), (51.89, 0.09, 351), (52.41, 0.43, 296)),
    "FedDyn": ((49.29, 0.30, None), (49.91, 0.41, 486), (50.04, 0.22, None)),
    "FedDyn+MAN": ((55.27, 0.12, 145), (55.63, 0.37, 143), (55.83, 0.56, 157)),
    "FedDC": ((52.02, 0.79, 294), (52.64, 0.24, 304), (53.25, 0.86, 289)),
    "FedDC+MAN": ((55.21, 0.32, 144), (55.40, 0.30, 129), (56.77, 0.31, 156)),
    "FedSpeed": ((50.95, 0.02, 392), (51.33, 0.17, 390), (50.95, 0.51, 439)),
    "FedSpeed+MAN": ((55.23, 0.15, 163), (55.84, 0.11, 153), (55.89, 0.41, 163)),
}
# Table 1, Tiny-ImageNet as printed (rounds to 28 %).
TABLE1_TINY = {
    "FedAvg": ((25.35, 1.16, None), (24.41, 0.41, None), (23.75, 0.99, None)),
    "FedAvg+MAN": ((28.09, 0.26, 437), (28.90, 0.21, 194), (29.11, 0.12, 182)),
    "FedSAM": ((26.23, 0.68, None), (26.04, 0.20, None), (23.97, 0.83, None)),
    "FedSAM+MAN": ((32.16, 0.20, 104), (32.60, 0.92, 87), (31.40, 0.30, 82)),
    "FedASAM": ((27.50, 0.09, None), (27.05, 0.16, None), (23.96, 0.43, None)),
    "FedASAM+MAN": ((32.50, 0.05, 140), (32.41, 0.32, 136), (31.70, 0.81, 93)),
    "FedDyn": ((29.23, 0.06, 295), (28.99, 0.55, 308), (29.41, 1.33, 350)),
    "FedDyn+MAN": ((32.00, 0.57, 132), (32.44, 0.27, 110), (32.31, 0.38, 108)),
    "FedDC": ((31.44, 0.43, 170), (31.42, 0.36, 193), (31.21, 0.43, 201)),
    "FedDC+MAN": ((35.70, 0.21, 73), (36.07, 0.23, 66), (36.53, 0.03, 61)),
    "FedSpeed": ((31.12, 0.61, 211), (31.10, 0.27, 228), (29.65, 0.11, 363)),
    "FedSpeed+MAN": ((34.32, 0.63, 108), (35.49, 0.07, 78), (33.02, 0.55, 98)),
}
# Table 2, CIFAR-100 as printed: (top eigenvalue, trace) at δ = 0.3, then δ = 0.6 (FedDC's printed the same for both).
TABLE2 = {
    "FedAvg": ((51.49, 8744), (53.39, 9056)),
    "FedAvg+MAN": ((43.80, 4397), (42.00, 4747)),
    "FedSAM": ((32.46, 4909), (35.32, 5160)),
    "FedSAM+MAN": ((29.29, 2709), (30.05, 2918)),
    "FedDyn": ((51.03, 6400), (47.03, 6717)),
    "FedDyn+MAN": ((44.84, 3964), (38.44, 3966)),
    "FedDC": ((35.13, 3578), (35.13, 3578)),
    "FedDC+MAN": ((32.99, 2974), (32.99, 2974)),
}
# Supplementary Table 6, CIFAR-100 as printed; its FedASAM(+MAN) figures are, to the digit, Table 2's FedAvg(+MAN).
SUPP6 = {
    "FedASAM": ((51.49, 8744), (53.39, 9056)),
    "FedASAM+MAN": ((43.80, 4397), (42.00, 4747)),
    "FedSpeed": ((47.31, 6463), (49.75, 6519)),
    "FedSpeed+MAN": ((40.41, 3806), (37.64, 3674)),
}
# Supplementary Table 5, CIFAR-10, in its printed column order δ = 0.6, δ = 0.3, iid (means; ± over 3 seeds).
SUPP5_COLUMNS = ("δ=0.6", "δ=0.3", "iid")
SUPP5 = {
    "FedAvg": (79.34, 80.19, 81.44), "FedAvg+MAN": (82.53, 83.35, 84.18),
    "FedSAM": (80.42, 81.40, 82.54), "FedSAM+MAN": (81.56, 82.54, 84.19),
    "FedASAM": (79.90, 80.83, 82.27), "FedASAM+MAN": (80.81, 81.85, 84.22),
    "FedDyn": (82.00, 82.53, 84.16), "FedDyn+MAN": (83.84, 84.63, 84.80),
    "FedDC": (83.10, 83.64, 84.8), "FedDC+MAN": (83.27, 83.59, 85.08),
    "FedSpeed": (84.06, 84.24, 85.14), "FedSpeed+MAN": (84.37, 84.82, 85.95),
}

COMMON = {"model.name": "feddyn_cnn", "metrics.protocols": ["all_model"], "metrics.target_metric": "acc_all_model",
          "federation.sampling": "bernoulli"}
"""Every cell: FedDyn's CNN, the all-client average model (FedDyn's protocol, §5), and each client drawn with
probability ``fraction`` as the authors' ``train_*`` do (``act_list <= act_prob``), not a fixed number a round."""
OPTIMISER = {"training.local_epochs": 5, "training.batch_size": 50, "training.lr": 0.1, "training.momentum": 0.0,
             "training.lr_decay": 0.998, "training.weight_decay": 1e-3, "training.grad_clip": 10.0}
AUGMENT = {"data.augment": "flip_crop_half"}
"""The authors' (FedDyn's) CIFAR augmentation (``vcl-iisc/fedMAN:code/utils_dataset.py``): a flip with p = 1/2,
then with p = 1/2 a crop of the normalised image zero-padded by 4."""
PAPER = Scale(
    settings={"federation.clients": 100, "federation.fraction": 0.1, "federation.rounds": 500, **OPTIMISER,
              "metrics.every": 1, "metrics.target": 0.5, **AUGMENT},
    per_dataset={"tinyimagenet": {"metrics.target": 0.28}},
    note="100 clients, each in a round with probability 0.1, 500 rounds, E = 5, B = 50, SGD lr 0.1 × 0.998^r "
         "(no momentum), wd 1e-3, clip 10, FedDyn CNN (Tiny-ImageNet: the authors' ConvNet), FedDyn's code's flip "
         "and half-time crop; accuracy of the all-client average model, rounds to 50 % (Tiny-ImageNet 28 %)",
)
QUICK = Scale(
    settings={"data.subsample": 0.05, "federation.clients": 10, "federation.fraction": 0.3,
              "federation.rounds": 12, **OPTIMISER, "training.local_epochs": 1, "metrics.every": 1,
              "metrics.target": 0.6},
    substitute="fmnist",
    note="5 % of the data (stratified) over 10 clients × 0.3 (~300 training samples each, 3 a round on average), "
         "12 rounds, E = 1, the paper's optimiser and models, target 60 % instead of 50 %; FMNIST stands in "
         "for CIFAR-100, CIFAR-10 and Tiny-ImageNet; 1 seed unless --seeds",
)
SCALES = {"paper": PAPER, "quick": QUICK}
HESSIAN_QUICK = {"metrics.hessian.batches": 4, "metrics.hessian.max_iter": 30, "metrics.hessian.tol": 0.01}
UNKNOWNS = (
    "momentum: none (the FedDyn code MAN builds on uses plain SGD; the paper names none)",
    "ζ = 0.15 for every base and CIFAR-10 too (§4; supp. §7 says 'ζ = 0.6 by default' for FedAvg+MAN)",
    "MAN's ζ/2 as in the authors' code (method.halve, fltune's default)",
    "Tiny-ImageNet's ζ = 0.1, as §4 and the authors' EXPERIMENTS.md give it; the repository's run_exp.sh scripts "
    "pass --mu_mean=0.2 (--set method.zeta=0.2 for that)",
    "Tiny-ImageNet: its class order is that of the training folders' names (the code loads a prepared "
    "tinyimagenet.pt whose order it does not give)",
    "FedSpeed's λ = 0.1 (fltune's default; supp. §7's β = γ = 1 make its ESAM plain SAM)",
    "rounds-to-target under the same all-model protocol as the accuracy, evaluated every round",
    "Hessian (Table 2): of the final global model's training loss on 10 batches of 50 training samples, "
    "λ_max by power iteration and the trace by Hutchinson (docs/methods.md §4)",
)


MAN = Paper(name="MAN", cite="Yashwanth et al. 2023", scales=SCALES, unknowns=UNKNOWNS)


def cell(row: str, dataset: str, column: str, paper: float | None, metric: str = "acc_all_model", label: str = "",
         **fields: Any) -> Cell:
    """``<base>`` or ``<base>+man`` on the column's partition with supp. §7's iid radii (Tiny-ImageNet: also the
    authors' ConvNet, ζ and FedSAM's iid radii), compared on ``metric``; ``label`` follows the column's name."""
    base = BASES[row.removesuffix("+MAN")]
    name = f"{base}+man" if row.endswith("+MAN") else base
    params = IID_PARAMS.get(base, {}) if column == "iid" else {}
    if dataset == "tinyimagenet":
        params = {**params, **TINY, **(TINY_MAN if row.endswith("+MAN") else {}),
                  **(TINY_IID_FEDSAM.get(row, {}) if column == "iid" else {})}
    return Cell(row=row, dataset=dataset, column=column + label, paper=paper, metric=metric,
                settings={**COMMON, **COLUMNS[column], "method.name": name, **params}, **fields)


def table1() -> PaperTable:
    """Accuracy and rounds-to-target per (row, dataset, δ): two cells that share one run."""
    cells = []
    for dataset, printed in (("cifar100", TABLE1), ("tinyimagenet", TABLE1_TINY)):
        for row, entries in printed.items():
            for column, (acc, _std, rounds) in zip(COLUMNS, entries):
                cells += [cell(row, dataset, column, acc),
                          cell(row, dataset, column, rounds, "rounds_to_target", " rounds", factor=1.0,
                               paper_text=None if rounds else "500+")]
    return MAN.table(
        1, "accuracy (%) and rounds to the target with and without MAN (CIFAR-100, Tiny-ImageNet)", cells,
        value="accuracy of the all-client average model after the last round (%); rounds to 50 % on "
        "CIFAR-100, 28 % on Tiny-ImageNet (quick: 60 %), '500+' = never")


def hessian_table(number: int, title: str, printed: dict[str, Any], supplementary: bool = False) -> PaperTable:
    """Top Hessian eigenvalue and trace of the final global model, δ = 0.3 and 0.6 (CIFAR-100)."""
    cells = [made for row, entries in printed.items() for column, (eigen, trace) in zip(("δ=0.3", "δ=0.6"), entries)
             for made in (cell(row, "cifar100", column, eigen, "hessian_lambda_max", " top eigenvalue"),
                          cell(row, "cifar100", column, trace, "hessian_trace", " trace"))]
    scales = {"paper": PAPER.plus(HESSIAN_AT_END),
              "quick": QUICK.plus({**HESSIAN_AT_END, **HESSIAN_QUICK}, "; Hessian on 4 batches, ≤ 30 iterations, "
                                  "tol 1e-2")}
    return MAN.table(number, title, cells, supplementary=supplementary, scales=scales, percent=False,
                     value="λ_max and trace of the final global model's loss Hessian")


def supp5() -> PaperTable:
    """CIFAR-10 accuracy with and without MAN, the paper's column order (δ = 0.6 first)."""
    cells = [cell(row, "cifar10", column, value)
             for row, values in SUPP5.items() for column, value in zip(SUPP5_COLUMNS, values)]
    return MAN.table(5, "accuracy (%) with and without MAN (CIFAR-10)", cells, supplementary=True,
                     value="accuracy of the all-client average model (%)",
                     unknowns=("CIFAR-10 runs: Table 1's settings (500 rounds; the supplement gives none of its own)",))


TABLES = [
    table1(),
    hessian_table(2, "top Hessian eigenvalue and trace with and without MAN (CIFAR-100)", TABLE2),
    supp5(),
    hessian_table(6, "top Hessian eigenvalue and trace of FedASAM and FedSpeed with and without MAN (CIFAR-100)",
                  SUPP6, supplementary=True),
]
