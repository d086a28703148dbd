"""Shared bases (nothing registered) of the partially personalised methods (docs/methods.md §2, SimFAFL
Table 2 baselines): a client keeps one part of the model (``personal_keys``, stored in ``state["personal"]``
by ``Method.client_result``); a client never sampled starts from, and is evaluated with, the global one."""

from __future__ import annotations

from typing import Any

from torch import nn

from fltune.errors import FLTuneError
from fltune.methods.base import Method


def part_keys(model: nn.Module, part: str) -> set[str]:
    """State-dict keys of the model's ``body`` or ``head`` (buffers included)."""
    return {k for k in model.state_dict() if k.startswith(f"{part}.")}


class PersonalHead(Method):
    """Each client keeps its own head; only the body is uploaded and averaged (FedPer, FedRep, FedCR ...)."""

    def personal_keys(self, model: nn.Module) -> set[str]:
        return part_keys(model, "head")


class FeatureAligned(PersonalHead):
    """A personal linear head over features aligned to the server's class targets (FedPAC's prototypes,
    centroids), broadcast whole; any other head fails at model construction."""

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model = super().adapt_model(model)
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise FLTuneError(f"model.name: {self.name} needs a model whose head is one linear layer; this "
                              f"model's head is a {type(head).__name__}")
        return model

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        return dict(server_state)


def weight_layers(model: nn.Module) -> list[set[str]]:
    """The model's layers in forward order as state-dict keys, one per conv or linear map as LG-FedAvg's and
    FedCR's ``weight_keys``; a 1-d weight (a norm layer) joins the layer before it."""
    keys = set(model.state_dict())
    layers: list[set[str]] = []
    for name, module in model.named_modules():
        params = dict(module.named_parameters(recurse=False))
        if not params:
            continue
        own = {f"{name}.{k}".lstrip(".") for k in [*params, *dict(module.named_buffers(recurse=False))]} & keys
        weight = params.get("weight")
        if layers and (weight is None or weight.dim() == 1):
            layers[-1] |= own
        else:
            layers.append(own)
    return layers
