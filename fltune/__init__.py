"""fltune: run, tune and compare federated-learning methods for non-IID data.

Rooms (data flows one way): config -> data -> engine(method) -> metrics -> tracking.

The Python API (``fltune.api``); ``import fltune`` loads no torch or Ray, the rest is imported on first use::

    import fltune
    result = fltune.run(fltune.Config(method="fedprox", **{"federation.rounds": 2}))
    result.history  # one dict per round
"""

import importlib as _importlib

from fltune.api import CompareResult, JobResult, RunResult, compare, load_model, reproduce, run, tune
from fltune.errors import FLTuneError

__version__ = "0.1.0"

_LAZY = {"Config": ("fltune.config", "ExperimentConfig"), "Method": ("fltune.methods.base", "Method"),
         "Params": ("fltune.methods.base", "Params"), "SplitModel": ("fltune.models.base", "SplitModel"),
         "UserDataset": ("fltune.data.datasets", "UserDataset")}
"""The API's classes whose modules import pydantic or torch, loaded when first read (PEP 562)."""

__all__ = sorted(["CompareResult", "FLTuneError", "JobResult", "RunResult", "compare", "load_model", "reproduce",
                  "run", "tune", *_LAZY])


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'fltune' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(_importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    """The public API only (``dir(fltune)``), then ``__version__``."""
    return [*__all__, "__version__"]
