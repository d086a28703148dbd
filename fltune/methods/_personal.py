"""Shared bases of the partially personalised methods (docs/methods.md §2, SimFAFL Table 2 baselines).

Not methods themselves (nothing is registered here). A client keeps one part of the split model for
itself (``personal_keys``); the engine's default ``client_result``/``client_model_state`` then store that
part in ``state["personal"]`` and evaluate each client with it on top of the global weights. A client that
was never sampled holds no personal part yet and starts from (and is evaluated with) the global one.
"""

from __future__ import annotations

from torch import nn

from fltune.methods.base import Method


def part_keys(model: nn.Module, part: str) -> set[str]:
    """State-dict keys of the model's ``body`` or ``head`` (buffers included)."""
    return {k for k in model.state_dict() if k.startswith(f"{part}.")}


class PersonalHead(Method):
    """Each client keeps its own head; only the body is uploaded and averaged (FedPer, FedRep, FedCR ...)."""

    def personal_keys(self, model: nn.Module) -> set[str]:
        return part_keys(model, "head")


class PersonalBody(Method):
    """Each client keeps its own body; only the head is uploaded and averaged (LG-FedAvg)."""

    def personal_keys(self, model: nn.Module) -> set[str]:
        return part_keys(model, "body")
