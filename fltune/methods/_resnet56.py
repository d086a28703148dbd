"""Shared base (nothing registered) of StochDepth, GradAug and FedAlign, built on ResNet-56's width-ω and
stochastic-depth API (FedAlign §3.2, §4): ``model.name: auto`` resolves to ``resnet56``, any other fails once."""

from __future__ import annotations

from typing import cast

from torch import nn

from fltune.methods.base import Method
from fltune.methods.objective import Batch
from fltune.models.resnet56 import ResNet56


class ResNet56Method(Method):
    """A method whose local objective needs :class:`~fltune.models.resnet56.ResNet56`."""

    default_model = "resnet56"

    def adapt_model(self, model: nn.Module) -> ResNet56:
        return self.require_model(model, ResNet56, "ResNet-56's slimmable stages", "auto, resnet56")

    @staticmethod
    def resnet(batch: Batch) -> ResNet56:
        """The client's model, which ``adapt_model`` has already checked is a ResNet56."""
        return cast(ResNet56, batch.module())
