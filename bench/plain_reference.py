"""A plain-PyTorch FedAvg run, the independent reference that ``bench/whole_command.py`` times ``fltune run`` against.

It imports nothing from fltune (its last line says so, and the bench's test checks it), so none of fltune's
imports or start-up are paid on both sides of the ratio. The work equals the command's: FashionMNIST from
the same idx files (``/usr/share/datasets/fashion-mnist``, Debian's ``dataset-fashion-mnist``, read with
gzip and numpy: torchvision's reader wants the files unpacked in its own folder layout), an IID split of its
own (100 clients × 600), McMahan et al.'s FedAvg CNN (the layers of fltune's ``fedavg_cnn``), SGD lr 0.01
momentum 0.9, B 50, E 1, 10 clients a round, their sample-weighted average in float64 (FedAvg, McMahan et
al. 2017, Algorithm 1), the global model on the test set in batches of 100 after every round, 2 torch
threads. Equal accuracy is not required; equal work is.

Lines (``bench/whole_command.py`` reads their arrival times as the phases): ``imported``, ``data``, ``model``,
``round r/R acc_global=… loss=…`` each round, ``independent <True|False>`` (no module of fltune loaded).

    python bench/plain_reference.py [--rounds 5] [--per-round 10] [--threads 2] [--data DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

print("imported", flush=True)

DATA = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # FashionMNIST's published pixel mean and std on the [0, 1] scale
CLIENTS, PER_CLIENT = 100, 600
EVAL_BATCH = 100


def read_idx(path: Path) -> torch.Tensor:
    """An idx file of unsigned bytes (``.gz`` or plain) as a uint8 tensor of its declared shape."""
    raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.from_numpy(np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape).copy())


def load(folder: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images [N, 1, 28, 28], train labels, test images, test labels), images uint8, labels int64."""

    def one(stem: str) -> torch.Tensor:
        path = next((p for p in (folder / f"{stem}.gz", folder / stem) if p.exists()), None)
        if path is None:
            sys.exit(f"plain_reference: {folder / stem}(.gz) not found; apt-get install dataset-fashion-mnist")
        return read_idx(path)

    return (one("train-images-idx3-ubyte").unsqueeze(1), one("train-labels-idx1-ubyte").long(),
            one("t10k-images-idx3-ubyte").unsqueeze(1), one("t10k-labels-idx1-ubyte").long())


def cnn() -> nn.Module:
    """McMahan et al.'s CNN for 28 × 28 grey images: two 5 × 5 conv blocks (32, 64 channels, padding 2, ReLU,
    2 × 2 max-pool), a 3136 → 512 dense layer with ReLU and a 512 → 10 linear head (1,663,370 parameters)."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 32, 5, padding=2), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(32, 64, 5, padding=2), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), fc=nn.Linear(7 * 7 * 64, 512), relu3=nn.ReLU(), head=nn.Linear(512, 10),
    ))


def scaled(x: torch.Tensor) -> torch.Tensor:
    """uint8 images → float32 normalised by the dataset's mean and std (per batch, as the command does)."""
    return x.float().div_(255).sub_(MEAN).div_(STD)


def train_round(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, split: torch.Tensor, clients: torch.Tensor,
    state: dict[str, torch.Tensor], gen: torch.Generator, lr: float = 0.01, batch: int = 50,
) -> dict[str, torch.Tensor]:
    """One FedAvg round: each client trains one epoch from ``state``; the sample-weighted float64 average of
    their weights comes back."""
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
    weight = 0
    for cid in clients.tolist():
        model.load_state_dict(state)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        idx = split[cid][torch.randperm(split.shape[1], generator=gen)]
        for s in range(0, len(idx), batch):
            chunk = idx[s:s + batch]
            opt.zero_grad()
            F.cross_entropy(model(scaled(x[chunk])), y[chunk]).backward()
            opt.step()
        for k, v in model.state_dict().items():
            total[k] += len(idx) * v.double()
        weight += len(idx)
    return {k: (v / weight).to(state[k].dtype) for k, v in total.items()}


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on all of ``x``, in batches of ``EVAL_BATCH``."""
    model.eval()
    correct, loss = 0, 0.0
    for s in range(0, len(y), EVAL_BATCH):
        logits = model(scaled(x[s:s + EVAL_BATCH]))
        loss += float(F.cross_entropy(logits, y[s:s + EVAL_BATCH], reduction="sum"))
        correct += int((logits.argmax(1) == y[s:s + EVAL_BATCH]).sum())
    return correct / len(y), loss / len(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=10, help="clients a round (of 100)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the four FashionMNIST idx(.gz) files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 1 <= args.per_round <= CLIENTS or args.rounds < 1 or args.threads < 1:
        parser.error(f"allowed: --rounds ≥ 1, --threads ≥ 1, --per-round 1..{CLIENTS}")
    torch.set_num_threads(args.threads)
    x, y, test_x, test_y = load(args.data)
    gen = torch.Generator().manual_seed(args.seed)
    split = torch.randperm(len(y), generator=gen)[:CLIENTS * PER_CLIENT].view(CLIENTS, PER_CLIENT)
    print("data", flush=True)
    torch.manual_seed(args.seed)
    model = cnn()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    print("model", flush=True)
    for r in range(1, args.rounds + 1):
        clients = torch.randperm(CLIENTS, generator=gen)[:args.per_round]
        state = train_round(model, x, y, split, clients, state, gen)
        model.load_state_dict(state)
        acc, loss = evaluate(model, test_x, test_y)
        print(f"round {r}/{args.rounds} acc_global={acc:.4f} loss={loss:.4f}", flush=True)
    print(f"independent {not any(name.split('.')[0] == 'fltune' for name in sys.modules)}", flush=True)


if __name__ == "__main__":
    main()
