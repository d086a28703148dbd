"""Name → model builder registry. An architecture is one file registering with ``@register_model``, its import in
``fltune.models`` and its name in ``fltune.catalog.MODELS`` (the torch-free list the config checks). A user's builder
needs none of that: ``model.name`` names it by reference or as a plug-in (``fltune.plugins``)."""

from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import TypeAdapter, ValidationError

from fltune import catalog
from fltune.errors import FLTuneError
from fltune.models.base import InShape, SplitModel
from fltune.plugins import EXPECTED, resolve, unknown

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
    """Decorator adding ``builder`` to :data:`MODELS` under ``name``."""

    def add(builder: ModelBuilder) -> ModelBuilder:
        if name in MODELS or name not in catalog.MODELS:
            raise ValueError(f"model {name!r} registered twice or missing from fltune.catalog.MODELS")
        MODELS[name] = builder
        return builder

    return add


def build_model(name: str, in_shape: InShape, num_classes: int, **kwargs: Any) -> SplitModel:
    """A fresh model; deterministic given the caller's ``torch.manual_seed``."""
    builder = MODELS.get(name) or resolve("model", name)
    if builder is None:
        raise unknown("model", name, sorted(MODELS))
    try:
        model = builder(tuple(in_shape), num_classes, **checked_options(builder, kwargs))
    except TypeError as err:  # an option the builder does not take
        raise FLTuneError(f"model.options: {name!r} does not take {sorted(kwargs)}: {err}") from None
    except ValueError as err:
        shape = tuple(in_shape)
        raise FLTuneError(f"model.name: {name!r} cannot take inputs of shape {shape}: {err}") from err
    if not isinstance(model, SplitModel):
        raise FLTuneError(f"model.name: {name!r} built a {type(model).__name__}; expected {EXPECTED['model']}")
    return model


def checked_options(builder: ModelBuilder, options: dict[str, Any]) -> dict[str, Any]:
    """``model.options`` validated against the builder's annotations (pydantic's lax rules), so a wrong value
    is one line, not a model silently built with it; unknown options are left for the call to refuse."""
    hints = get_type_hints(builder)
    checked = {}
    for key, value in options.items():
        if key not in hints:
            checked[key] = value
            continue
        try:
            checked[key] = TypeAdapter(hints[key]).validate_python(value)
        except ValidationError:
            expected = getattr(hints[key], "__name__", str(hints[key]))
            raise FLTuneError(f"model.options.{key}: {value!r} is not a valid {expected}") from None
    return checked


def default_model(dataset: str) -> str:
    """The model the papers use for ``dataset`` when the config names none (docs/methods.md §1, §3)."""
    if dataset not in _DEFAULT_MODELS:
        raise FLTuneError(
            f"model.name: no default model for dataset {dataset!r}; set model.name to one of: "
            f"{', '.join(sorted(MODELS))}"
        )
    return _DEFAULT_MODELS[dataset]
