"""Shared bases (nothing registered) of the partially personalised methods (docs/methods.md §2, SimFAFL
Table 2 baselines): a client keeps one part of the model (``personal_keys``, stored in ``state["personal"]``
by ``Method.client_result``); a client never sampled starts from, and is evaluated with, the global one."""

from __future__ import annotations

from typing import Any

from torch import nn

from fltune.errors import FLTuneError
from fltune.methods.base import Method


class PersonalHead(Method):
    """Each client keeps its own head; only the body is uploaded and averaged (FedPer, FedRep, FedCR ...)."""

    def personal_keys(self, model: nn.Module) -> set[str]:
        return {k for k in model.state_dict() if k.startswith("head.")}


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
