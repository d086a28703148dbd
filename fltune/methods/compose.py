"""Modifiers: a loss term any base method takes on by name, ``<base>+<modifier>`` (MAN on FedAvg, FedDyn, FedSAM, ...),
built on demand by :func:`compose` rather than a file per combination; SAM-type bases get the term in both passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from fltune.errors import FLTuneError
from fltune.methods.base import Method, Params
from fltune.methods.objective import Batch

LossAndLogits = tuple[torch.Tensor, torch.Tensor]


class Modifier:
    """An addition to a base's per-batch objective, with its own hyperparameters; ``local_loss`` gets the
    base's objective as a callable, to observe its forward pass (MAN's activations)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def local_loss(self, batch: Batch, base_loss: Callable[[], LossAndLogits]) -> LossAndLogits:
        """The base's (loss, logits) with this modifier's term added."""
        return base_loss()

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """The base's model, checked for what this modifier needs."""
        return model


def composite_params(base: type[Method], modifier: type[Modifier]) -> type[Params]:
    """The union of both Params models; a field both define would be ambiguous, so it is rejected."""
    clash = sorted(set(base.Params.model_fields) & set(modifier.Params.model_fields))
    if clash:
        raise FLTuneError(
            f"method.name: {base.name}+{modifier.name} cannot be combined: both define {', '.join(clash)}"
        )
    parts = list(dict.fromkeys((modifier.Params, base.Params)))  # base fields listed first
    bases = tuple(p for p in parts if not any(q is not p and issubclass(q, p) for q in parts))  # valid MRO
    doc = f"Hyperparameters of {base.name} and of {modifier.name}."
    return type(f"{base.__name__}{modifier.__name__}Params", bases, {"__doc__": doc})


def compose(base: type[Method], modifier: type[Modifier], name: str | None = None) -> type[Method]:
    """``base`` with ``modifier``'s term added to its local loss, named ``<base>+<modifier>`` unless ``name``."""
    params_cls = composite_params(base, modifier)
    mod_fields = list(modifier.Params.model_fields)

    def __init__(self: Method, params: Params | None = None) -> None:
        base.__init__(self, params if params is not None else params_cls())
        self.modifier = modifier(modifier.Params(**{f: getattr(self.params, f) for f in mod_fields}))

    def local_loss(self: Method, batch: Batch) -> LossAndLogits:
        return modifier.local_loss(self.modifier, batch, lambda: base.local_loss(self, batch))

    def adapt_model(self: Method, model: nn.Module) -> nn.Module:
        return self.modifier.adapt_model(base.adapt_model(self, model))

    doc = f"{base.name} with the {modifier.name} term added to its local loss.\n\n{base.__doc__ or ''}"
    namespace = {
        "name": name or f"{base.name}+{modifier.name}", "Params": params_cls, "__init__": __init__,
        "local_loss": local_loss, "adapt_model": adapt_model, "__doc__": doc,
    }
    return type(f"{base.__name__}With{modifier.__name__}", (base,), namespace)
