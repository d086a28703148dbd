"""Shared base of the methods whose local objective needs a VIB net's q(z|x) (FedCR, SimFAFL, FedSR).

Not a method itself (nothing is registered here). ``model.name: auto`` resolves through
:meth:`VIBMethod.model_for` to FedCR's nets (the MLP on EMNIST/MNIST, the CNN elsewhere), and any
other model fails once, at model construction, with one line naming ``model.name``.

All three methods come from FedCR's code base (``haozzh/FedCR``), whose server averages models without
sample weights (``average``); they do the same. Under SimFAFL's partitions every client holds the same
number of samples, so the two agree there.
"""

from __future__ import annotations

from typing import ClassVar, cast

from torch import nn

from fltune.methods.base import ClientContext, Method
from fltune.models.vib import VIBNet

VIB_MODELS = ("vib_cnn", "vib_mlp")
_MLP_DATASETS = frozenset({"emnist_letters", "mnist"})
"""Datasets FedCR/SimFAFL train with the fully connected net (EMNIST-L; MNIST by analogy **[U]**)."""


class VIBMethod(Method):
    """A method built on :class:`~fltune.models.vib.VIBNet`; updates weigh 1 each (FedCR's ``average``)."""

    default_model: ClassVar[str | None] = "vib_cnn"
    weighted_by_samples: ClassVar[bool] = False

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        return "vib_mlp" if dataset in _MLP_DATASETS else "vib_cnn"

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return self.require_model(model, VIBNet, "a VIB model", f"auto, {', '.join(VIB_MODELS)}")

    @staticmethod
    def net(ctx: ClientContext) -> VIBNet:
        """The client's model, which ``adapt_model`` has already checked is a VIBNet."""
        return cast(VIBNet, ctx.model)
