"""Shared base (nothing registered) of the methods whose objective needs a VIB net's q(z|x): FedCR, SimFAFL,
FedSR. ``model.name: auto`` resolves to FedCR's nets (:meth:`VIBMethod.model_for`), any other fails once.

All three come from ``haozzh/FedCR``, whose server averages without sample weights (``average``), as here.
ε is ``batch.noise["eps"]``, so every executor draws it from the client's own seeded stream.
"""

from __future__ import annotations

from typing import ClassVar, cast

from torch import Tensor, nn

from fltune.methods.base import Method
from fltune.methods.finetune import FineTune
from fltune.methods.objective import Batch, NoiseShapes
from fltune.models.vib import VIBNet, VIBOutput, posterior

VIB_MODELS = ("vib_cnn", "vib_mlp")
_MLP_DATASETS = frozenset({"emnist_letters", "mnist"})
"""Datasets FedCR/SimFAFL train with the fully connected net (EMNIST-L; MNIST by analogy **[U]**)."""


class VIBFineTune(FineTune):
    """The ``tune`` round on a VIB net: plain CE of the head on the mean of S sampled z, ε declared as the
    objective's noise rather than drawn inside the forward."""

    vib_samples: ClassVar[int | None] = None

    def noise(self, model: nn.Module) -> NoiseShapes:
        """ε of the objective: ``vib_samples`` (None: the net's S) draws of z's width per input."""
        net = cast(VIBNet, model)
        return {"eps": (net.samples if self.vib_samples is None else self.vib_samples, net.feature_dim)}

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        _, _, z = functional_z(batch)
        logits = batch.forward.part("head", batch.weights, z.mean(0))
        return batch.cross_entropy(logits), logits


class VIBMethod(Method):
    """A method built on :class:`~fltune.models.vib.VIBNet`; updates weigh 1 each (FedCR's ``average``)."""

    default_model: ClassVar[str | None] = "vib_cnn"
    weighted_by_samples: ClassVar[bool] = False
    vib_samples: ClassVar[int | None] = None
    """z samples per input in training (``noise``); None: the net's S (FedSR: 1)."""
    tuner: ClassVar[type[FineTune] | None] = VIBFineTune

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        return "vib_mlp" if dataset in _MLP_DATASETS else "vib_cnn"

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return self.require_model(model, VIBNet, "a VIB model", f"auto, {', '.join(VIB_MODELS)}")

    noise = VIBFineTune.noise


def functional_vib(batch: Batch) -> VIBOutput:
    """``VIBNet.vib`` as a function of the batch's parameters, with its ε."""
    mu, sigma, z = functional_z(batch)
    return VIBOutput(mu, sigma, z, batch.forward.part("head", batch.weights, z))


def functional_z(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """μ, σ of q(z|x) and z ``[S, B, dimZ]`` as functions of the parameters, from ε ``[B, S, dimZ]``."""
    mu, sigma = posterior(batch.forward.part("body", batch.weights, batch.x))
    return mu, sigma, mu + sigma * batch.noise["eps"].transpose(0, 1)
