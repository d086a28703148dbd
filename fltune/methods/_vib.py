"""Shared base of the methods whose local objective needs a VIB net's q(z|x) (FedCR, SimFAFL, FedSR).

Not a method itself (nothing is registered here). ``model.name: auto`` resolves through
:meth:`VIBMethod.model_for` to FedCR's nets (the MLP on EMNIST/MNIST, the CNN elsewhere), and any
other model fails once, at model construction, with one line naming ``model.name``.

All three methods come from FedCR's code base (``haozzh/FedCR``), whose server averages models without
sample weights (``average``); they do the same. Under SimFAFL's partitions every client holds the same
number of samples, so the two agree there.

Batched executor: a VIB loss is written once, with the batch's ``weight`` (None on the exact path, whose
bits it keeps), and evaluated on ``ctx.model.vib(x)`` there and on :func:`functional_vib` here; ε is drawn
per epoch by :meth:`VIBMethod.epoch_noise` from the client's own generator, on a CPU the same draws as the
exact path's per step from torch's global RNG, so a client alone in its group gets the exact path's ε bit
for bit.
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from fltune.methods.base import ClientContext, Forward, Method, Tensors, masked_cross_entropy
from fltune.methods.finetune import FineTune
from fltune.models.vib import VIBNet, VIBOutput, posterior, sampled_cross_entropy

VIB_MODELS = ("vib_cnn", "vib_mlp")
_MLP_DATASETS = frozenset({"emnist_letters", "mnist"})
"""Datasets FedCR/SimFAFL train with the fully connected net (EMNIST-L; MNIST by analogy **[U]**)."""


def vib_epoch_noise(
    net: VIBNet, counts: list[int], size: int, generator: torch.Generator, samples: int | None,
    device: torch.device,
) -> Tensors:
    """ε of an epoch's steps, ``[steps, size, S, dimZ]`` (S: ``samples``, None = the net's), in one draw cut step
    by step. The exact path draws ``[S, n, dimZ]`` per step (``VIBNet.sample``); on a CPU one draw of their total
    gives the same numbers in the same order whenever a step's S·n·dimZ is a multiple of 16 (torch's CPU normal
    fills 16 at a time; always so at dimZ = 512), so a client alone in its group keeps the exact path's ε bit for
    bit. On a GPU the one draw gives other numbers of the same distribution. Memory: the epoch's ε at once
    (Table 2's SimFAFL: 600 samples × 18 × 512 floats, 22 MB a client)."""
    eps = net.noise(sum(counts), samples, device=device, generator=generator)
    samples_, dim = eps.shape[0], eps.shape[2]
    flat, out = eps.view(-1), eps.new_zeros(len(counts), size, samples_, dim)
    full = next((s for s, n in enumerate(counts) if n < size), len(counts))  # the steps before a short one
    out[:full] = flat[:full * samples_ * size * dim].view(full, samples_, size, dim).transpose(1, 2)
    start = full * samples_ * size * dim
    for s, n in enumerate(counts[full:], start=full):
        out[s, :n] = flat[start:start + samples_ * n * dim].view(samples_, n, dim).transpose(0, 1)
        start += samples_ * n * dim
    return {"eps": out}


class VIBFineTune(FineTune):
    """The ``tune`` final round on a VIB net (FedCR's, SimFAFL's and FedSR's last round), batched too.

    The exact path's loss is plain CE of ``model(x)``: in training mode the head sees the mean of the net's S
    sampled z (``VIBNet.features``), ε from torch's global RNG. Batched, ε comes from :func:`vib_epoch_noise`
    (the net's S, as there), outside the vmap, and the same mean goes through the head."""

    def epoch_noise(self, ctx: ClientContext, counts: list[int], size: int, generator: torch.Generator) -> Tensors:
        return vib_epoch_noise(cast(VIBNet, ctx.model), counts, size, generator, None, ctx.device)

    def functional_loss(
        self, forward: Forward, params: Tensors, inputs: dict[str, Tensors], x: Tensor, y: Tensor, weight: Tensor,
    ) -> tuple[Tensor, Tensor]:
        _, _, z = functional_z(forward, params, x, inputs["noise"]["eps"])
        logits = forward.part("head", params, z.mean(0))
        return masked_cross_entropy(logits, y, weight), logits


class VIBMethod(Method):
    """A method built on :class:`~fltune.models.vib.VIBNet`; updates weigh 1 each (FedCR's ``average``)."""

    default_model: ClassVar[str | None] = "vib_cnn"
    weighted_by_samples: ClassVar[bool] = False
    vib_samples: ClassVar[int | None] = None
    """z samples per input in training; None: the net's S (FedSR: 1)."""
    tuner: ClassVar[type[FineTune] | None] = VIBFineTune

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        return "vib_mlp" if dataset in _MLP_DATASETS else "vib_cnn"

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return self.require_model(model, VIBNet, "a VIB model", f"auto, {', '.join(VIB_MODELS)}")

    @staticmethod
    def net(ctx: ClientContext) -> VIBNet:
        """The client's model, which ``adapt_model`` has already checked is a VIBNet."""
        return cast(VIBNet, ctx.model)

    def epoch_noise(self, ctx: ClientContext, counts: list[int], size: int, generator: torch.Generator) -> Tensors:
        """ε of an epoch's steps (:func:`vib_epoch_noise`), ``vib_samples`` per input."""
        return vib_epoch_noise(self.net(ctx), counts, size, generator, self.vib_samples, ctx.device)


def functional_vib(forward: Forward, params: Tensors, x: Tensor, eps: Tensor) -> VIBOutput:
    """``VIBNet.vib`` as a function of the parameters, with the step's ε (its share of ``epoch_noise``'s, batch
    axis first)."""
    mu, sigma, z = functional_z(forward, params, x, eps)
    return VIBOutput(mu, sigma, z, forward.part("head", params, z))


def functional_z(forward: Forward, params: Tensors, x: Tensor, eps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """μ, σ of q(z|x) and the sampled z ``[S, B, dimZ]`` as functions of the parameters, with the step's ε."""
    mu, sigma = posterior(forward.part("body", params, x))
    return mu, sigma, mu + sigma * eps.transpose(0, 1)


def vib_cross_entropy(logits: Tensor, y: Tensor, weight: Tensor | None = None) -> Tensor:
    """``sampled_cross_entropy`` (mean over S samples and the batch), over the real samples when ``weight``
    marks them."""
    if weight is None:
        return sampled_cross_entropy(logits, y)
    samples = logits.shape[0]
    return masked_cross_entropy(logits.flatten(0, 1), y.repeat(samples), weight.repeat(samples))
