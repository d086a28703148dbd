"""A user's own code, written where a user would keep it (outside the package): a method, a dataset and a
model in files, and a plug-in package declaring them as entry points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SMOOTH = '''import torch.nn.functional as F
from pydantic import Field

import fltune


class SmoothParams(fltune.Params):
    eps: float = Field(0.1, ge=0, lt=1, description="label-smoothing weight")


class LabelSmooth(fltune.Method):
    """FedAvg with label-smoothed cross-entropy."""

    name = "label_smooth"
    Params = SmoothParams
    stored_models = 1.0
    passes_per_step = 1.0

    def local_loss(self, batch):
        logits = batch.forward(batch.weights, batch.x)
        per_sample = F.cross_entropy(logits, batch.y, reduction="none", label_smoothing=self.params.eps)
        return per_sample, logits  # per sample: the engine averages it over the batch
'''
"""FedAvg with label smoothing, L = CE(f(x), (1 − ε)·onehot(y) + ε/C), as docs/adding-a-method.md §6 shows it."""

DATA = '''"""Three blobs of 6x6 images and a one-layer model for them."""
import torch
from torch import nn

import fltune


def blobs(root, download):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(240) % 3
    x = torch.rand(240, 1, 6, 6, generator=g) * 0.4 + y.view(-1, 1, 1, 1) * 0.3
    return fltune.UserDataset(train=(x[:180], y[:180]), test=(x[180:], y[180:]), num_classes=3)


def small(in_shape, num_classes, hidden: int = 16):
    c, h, w = in_shape
    body = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU())
    return fltune.SplitModel(body, nn.Linear(hidden, num_classes), hidden)
'''

TINY: dict[str, Any] = {
    "data.dataset": "synthetic", "model.name": "mlp", "federation.clients": 4, "federation.fraction": 0.5,
    "federation.rounds": 2, "training.local_epochs": 1, "training.batch_size": 64, "metrics.protocols": ["global"],
}
"""Two clients a round on the synthetic data, as dotted fields."""


def write_method(folder: Path, module: str = "smooth") -> Path:
    """``smooth.py`` (class ``LabelSmooth``) in ``folder``; another ``module`` name where a test process may
    have imported a ``smooth`` already (fltune refuses a second module of one name)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(SMOOTH)
    return path


def write_space(folder: Path, method: str, **changes: Any) -> Path:
    """``space.yaml`` in ``folder``, tuning ``method``'s eps over the tiny setting (2 trials, 1 round, no
    MLflow)."""
    base: dict[str, Any] = {}
    for key, value in {**TINY, "federation.rounds": 1, "resources.workers": 1, "tracking.enabled": False}.items():
        section, field = key.split(".")
        base.setdefault(section, {})[field] = value
    space = {"method": method, "base": base, "params": {"method.eps": {"type": "uniform", "low": 0.0, "high": 0.3}},
             "objective": {"metric": "acc_global", "mode": "max", "reduce": "final"}, "num_samples": 2,
             "sampler": {"name": "random", "seed": 0}, "scheduler": {"name": "none"}, "max_concurrent": 2, "seeds": 1,
             **changes}
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def write_package(folder: Path) -> Path:
    """A plug-in distribution ``fltune-smooth`` (module ``fltune_smooth``) whose pyproject declares the
    method, the dataset and the model as entry points; the folder to ``pip install``."""
    source = folder / "fltune_smooth"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "methods.py").write_text(SMOOTH)
    (source / "data.py").write_text(DATA)
    (folder / "pyproject.toml").write_text('''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "fltune-smooth"
version = "0.1.0"

[project.entry-points."fltune.methods"]
smoothed = "fltune_smooth.methods:LabelSmooth"

[project.entry-points."fltune.datasets"]
blobs = "fltune_smooth.data:blobs"

[project.entry-points."fltune.models"]
blob_net = "fltune_smooth.data:small"
''')
    return folder
