"""Name → model builder registry.

Each model file registers its builders with ``@register_model``; ``fltune.models`` imports the files, so
adding an architecture (VIB nets, slimmable ResNet-56) means adding one file, one import and its name in
``fltune.catalog.MODELS`` (the torch-free list the config checks ``model.name`` against).
"""

from collections.abc import Callable
from typing import Any

from fltune import catalog
from fltune.errors import FLTuneError
from fltune.models.base import InShape, SplitModel

ModelBuilder = Callable[..., SplitModel]
"""``builder(in_shape, num_classes, **kwargs) -> SplitModel``; must draw parameters only from torch's RNG."""

MODELS: dict[str, ModelBuilder] = {}

_DEFAULT_MODELS = {
    # FedSOL trains its (FedAvg) CNN on the MNIST family; SimFAFL/FedCR's own VIB nets are opt-in.
    **dict.fromkeys(("mnist", "fmnist", "emnist_letters", "synthetic", "pathmnist", "tissuemnist"), "fedavg_cnn"),
    # MAN/FedDyn's CIFAR-100 CNN (MAN Table 4).
    **dict.fromkeys(("cifar10", "cifar100", "svhn", "cinic10"), "feddyn_cnn"),
    "tinyimagenet": "tinyimagenet_cnn",  # MAN Table 4
}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator adding ``builder`` to :data:`MODELS` under ``name`` (a duplicate name is a bug)."""

    def add(builder: ModelBuilder) -> ModelBuilder:
        if name in MODELS or name not in catalog.MODELS:
            raise ValueError(f"model {name!r} registered twice or missing from fltune.catalog.MODELS")
        MODELS[name] = builder
        return builder

    return add


def build_model(name: str, in_shape: InShape, num_classes: int, **kwargs: Any) -> SplitModel:
    """A fresh model; deterministic given the caller's ``torch.manual_seed``."""
    if name not in MODELS:
        raise FLTuneError(f"model.name: unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}")
    try:
        return MODELS[name](tuple(in_shape), num_classes, **kwargs)
    except TypeError as err:  # an option the builder does not take
        raise FLTuneError(f"model.options: {name!r} does not take {sorted(kwargs)}: {err}") from None
    except ValueError as err:
        shape = tuple(in_shape)
        raise FLTuneError(f"model.name: {name!r} cannot take inputs of shape {shape}: {err}") from err


def default_model(dataset: str) -> str:
    """The model the papers use for ``dataset`` when the config names none (docs/methods.md §1, §3)."""
    if dataset not in _DEFAULT_MODELS:
        raise FLTuneError(
            f"model.name: no default model for dataset {dataset!r}; set model.name to one of: "
            f"{', '.join(sorted(MODELS))}"
        )
    return _DEFAULT_MODELS[dataset]
