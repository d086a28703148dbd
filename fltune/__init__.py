"""fltune: run, tune and compare federated-learning methods for non-IID data.

Rooms (data flows one way): config -> data -> engine(method) -> metrics -> tracking.

The Python API (``fltune.api``), imported on first use so ``import fltune`` loads no torch or Ray::

    import fltune
    result = fltune.run(fltune.Config(method="fedprox", **{"federation.rounds": 2}))
    result.history  # one dict per round
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "run": "fltune.api", "RunResult": "fltune.api", "JobResult": "fltune.api", "load_model": "fltune.api",
    "Config": "fltune.config", "FLTuneError": "fltune.errors",
    "Method": "fltune.methods.base", "Params": "fltune.methods.base", "SplitModel": "fltune.models.base",
    "UserDataset": "fltune.data.plugin",
}
_NAMES = {"Config": "ExperimentConfig"}

__all__ = sorted([*_LAZY, "tune", "compare", "reproduce"])


def __getattr__(name: str) -> Any:
    """The API, imported when first read (PEP 562); ``tune`` & co. are callable packages (``api.CommandModule``)."""
    if name in ("tune", "compare", "reproduce"):
        return importlib.import_module(f"fltune.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'fltune' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), _NAMES.get(name, name))
