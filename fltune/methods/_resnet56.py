"""Shared base of the methods built on ResNet-56's width-ω and stochastic-depth API (FedAlign §3.2, §4).

Not a method itself (nothing is registered here): StochDepth, GradAug and FedAlign subclass it, so that
``model.name: auto`` resolves to ``resnet56`` and any other model fails once, at model construction, with
one line naming ``model.name`` instead of an AttributeError deep inside a Ray worker.
"""

from __future__ import annotations

from typing import cast

from torch import nn

from fltune.errors import FLTuneError
from fltune.methods.base import ClientContext, Method
from fltune.models.resnet56 import ResNet56


class ResNet56Method(Method):
    """A method whose local objective needs :class:`~fltune.models.resnet56.ResNet56`."""

    default_model = "resnet56"

    def adapt_model(self, model: nn.Module) -> ResNet56:
        if not isinstance(model, ResNet56):
            raise FLTuneError(
                f"model.name: method {self.name!r} needs model.name=resnet56 (or auto); "
                f"got a {type(model).__name__} without ResNet-56's slimmable stages"
            )
        return model

    @staticmethod
    def resnet(ctx: ClientContext) -> ResNet56:
        """The client's model, which ``adapt_model`` has already checked is a ResNet56."""
        return cast(ResNet56, ctx.model)
