"""What a method's one local objective, ``Method.local_loss(batch)``, reads, and the loss terms methods share. Client by
client, a :class:`Batch` holds the model's own parameters and no mask, so :class:`Forward` runs the module itself; K
clients at once (engine/batched.py), the same function runs inside a ``vmap`` on padded batches and stacked parameters,
``mask`` marking the real samples."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

if TYPE_CHECKING:  # base.py imports this module
    from fltune.methods.base import ClientContext

Tensors = dict[str, torch.Tensor]

NoiseShapes = dict[str, tuple[int, int]]
"""Per key, (S, d): the objective reads S × d standard normal draws per sample of a batch (VIB's ε)."""


class Forward:
    """The model as a function of its parameters: ``forward(weights, x)`` → logits; :meth:`part` runs
    ``body``/``head`` alone. With :attr:`own` it runs the module itself, so forward hooks fire (MAN's)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tied = _ties_tensors(model)
        self.own: Tensors = dict(model.named_parameters())

    def __call__(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        if weights is self.own:
            return self.model(x)
        return functional_call(self.model, weights, (x,), tie_weights=self.tied)

    def part(self, name: str, weights: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Submodule ``name`` on ``x`` with the entries of ``weights`` under ``name.`` (a VIB loss's (μ, σ))."""
        module = self.model.get_submodule(name)
        if weights is self.own:
            return module(x)
        prefix = f"{name}."
        own = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
        return functional_call(module, own, (x,), tie_weights=self.tied)


def _ties_tensors(model: nn.Module) -> bool:
    """Whether a tensor sits under two names: only then need ``functional_call`` walk for ties (costly)."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return len(named) != len({id(t) for _, t in named})


@dataclass(frozen=True)
class Batch:
    """One batch as a method's objective reads it.
    ``weights``: every parameter (frozen ones too). ``mask``: 1 on the real samples, None when all are real. ``noise``:
    draws of ``Method.noise``, batch axis first. ``client``: set only when trained on its own; an objective reading it
    declares ``Method.pure_loss = False``. ``record``: per-sample tensors for ``Method.record_step`` (FedCR's μ, σ)."""

    forward: Forward
    weights: Tensors
    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor | None = None
    inputs: Mapping[str, Tensors] = field(default_factory=dict)
    noise: Tensors = field(default_factory=dict)
    global_weights: Mapping[str, torch.Tensor] = field(default_factory=dict)
    client: ClientContext | None = None
    record: Tensors = field(default_factory=dict)


def draw_noise(
    shapes: NoiseShapes, n: int, device: torch.device, generator: torch.Generator | None = None,
) -> Tensors:
    """Draws of ``shapes`` for ``n`` samples, [n, S, d] each, drawn [S, n, d] as ``VIBNet.sample`` does."""
    return {key: torch.randn((s, n, d), device=device, generator=generator).transpose(0, 1)
            for key, (s, d) in shapes.items()}


def squared_distance(weights: Iterable[tuple[str, torch.Tensor]], anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ_n ‖p_n − anchor_n‖² over (name, tensor) pairs: FedProx's and FedDyn's penalties."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in weights)


def batch_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of per-sample ``values`` over the real samples (mask 1) of a padded batch; ``mask`` None is
    ``values.mean()`` itself, so the client-by-client path keeps its bits."""
    if mask is None:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean CE over the real samples; ``F.cross_entropy`` when unpadded. Padded, −log softmax at the label
    is written out: the same floats without ``ignore_index``'s ops, wasted in a vmapped step."""
    if mask is None:
        return F.cross_entropy(logits, y)
    return batch_mean(-logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).squeeze(-1), mask)
