"""What a method's one local objective, ``Method.local_loss(batch)``, reads, and the loss terms methods share. Client by
client, a :class:`Batch` holds the model's own parameters and no mask, so :class:`Forward` runs the module itself; K
clients at once (engine/batched.py), the same function runs inside a ``vmap`` on padded batches and stacked parameters,
``mask`` marking the real samples."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

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
        named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        self.tied = len(named) != len({id(t) for _, t in named})  # a tensor under two names: walk for ties (costly)
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


class ClientByClient(Exception):
    """Raised by :meth:`Batch.module` where clients are trained together."""


Objective = Callable[[Tensors], tuple[torch.Tensor, Any]]
"""Weights → (a scalar to differentiate, what else to return); :attr:`Batch.gradient`'s argument."""


@dataclass(frozen=True)
class Batch:
    """One batch as a method's objective and step read it: ``weights`` (every parameter), ``noise`` (``Method.noise``'s
    draws), ``record`` (per-sample tensors for ``Method.record_step``); for a ``Method.step``, the weights it trains
    (``trainable``), the round's ``lr`` and ``grad_clip``. ``mask`` (padded samples 0), ``client`` and ``gradient``
    are the engine's, the first two read through :meth:`mean` and :meth:`module`."""

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
    trainable: tuple[str, ...] = ()
    lr: float = 0.0
    grad_clip: float | None = None
    gradient: Callable[[Objective, Tensors], tuple[Tensors, torch.Tensor, Any]] | None = None
    """(∇objective at ``weights``, its value, the rest it returns), detached; zeros for an unused weight. By
    ``torch.func`` where clients are trained together, by autograd client by client: the same bits."""
    kept: dict[str, Tensors] = field(default_factory=dict)

    @property
    def trained(self) -> Tensors:
        """The weights the step trains, by name."""
        return {n: self.weights[n] for n in self.trainable}

    def at(self, weights: Mapping[str, torch.Tensor]) -> Batch:
        """This batch with ``weights`` in place of the current ones (the others as they are), a fresh ``record``."""
        return replace(self, weights={**self.weights, **weights}, record={})

    def loss_gradient(
        self, local_loss: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]], weights: Tensors,
    ) -> tuple[Tensors, torch.Tensor, torch.Tensor]:
        """(∇ of ``local_loss`` at ``weights``, the loss, the logits); the first pass's ``record`` is the step's."""

        def objective(trained: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors]]:
            seen = self.at(trained)
            loss, logits = local_loss(seen)
            return scalar_loss(seen, loss), (logits, seen.record)

        grads, loss, (logits, record) = self.gradient(objective, weights)
        for key, value in record.items():
            self.record.setdefault(key, value)
        return grads, loss, logits

    def keep(self, name: str, values: Tensors) -> None:
        """New values of the client's tensors ``inputs[name]`` (Ditto's v_k), which the engine keeps after the step."""
        self.kept[name] = values

    def module(self, name: str | None = None) -> nn.Module:
        """The client's model (``name`` None) or a module it keeps (``ctx.scratch[name]``), for an objective running one
        other than by :attr:`forward` (its hooks, a sub-network, torch's global RNG): never batched."""
        if self.client is None:
            raise ClientByClient("its objective reads the client's modules")
        return self.forward.model if name is None else self.client.scratch[name]

    def model(self, name: str) -> Forward:
        """The forward of the model ``name`` a client keeps (``ctx.scratch[name]``): client by client that module (its
        BatchNorm statistics its own); trained together, the model's functional forward (batched models hold no buffers)."""
        if self.client is None:
            return self.forward
        kept = self.client.scratch[name]
        return kept if isinstance(kept, Forward) else Forward(kept)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean of per-sample ``values`` (batch axis first) over the real samples; unpadded, ``values.mean()`` itself,
        so the client-by-client path keeps its bits."""
        return values.mean() if self.mask is None else self.real(values).sum() / self.size

    def cross_entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Mean CE of ``logits`` against ``y`` over the real samples: ``F.cross_entropy`` unpadded; padded, −log
        softmax at the label written out (the same floats without ``ignore_index``'s ops, wasted in a vmapped step).
        ``[S, B, C]`` logits (S draws per sample, a VIB net's) average over the draws too: VIB's Monte-Carlo −I(Z;Y)."""
        if logits.dim() == 3:
            mask = None if self.mask is None else self.mask.repeat(len(logits))
            return replace(self, y=self.y.repeat(len(logits)), mask=mask).cross_entropy(logits.flatten(0, 1))
        if self.mask is None:
            return F.cross_entropy(logits, self.y)
        return self.mean(-logits.log_softmax(-1).gather(-1, self.y.unsqueeze(-1)).squeeze(-1))

    def real(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (batch axis first) with the padded samples' rows zeroed; ``values`` itself when unpadded."""
        if self.mask is None:
            return values
        return values * self.mask.view(-1, *[1] * (values.dim() - 1))

    @property
    def size(self) -> int | torch.Tensor:
        """How many samples are real (a tensor, at least 1, when padded): a sum's divisor."""
        return len(self.y) if self.mask is None else self.mask.sum().clamp(min=1.0)


def scalar_loss(batch: Batch, loss: torch.Tensor) -> torch.Tensor:
    """``local_loss``'s loss as one number: a per-sample loss (1-D) is averaged by :meth:`Batch.mean`."""
    return batch.mean(loss) if loss.dim() == 1 else loss


def draw_noise(
    shapes: NoiseShapes, n: int, device: torch.device, generator: torch.Generator | None = None,
) -> Tensors:
    """Draws of ``shapes`` for ``n`` samples, [n, S, d] each, drawn [S, n, d] as ``VIBNet.sample`` does."""
    return {key: torch.randn((s, n, d), device=device, generator=generator).transpose(0, 1)
            for key, (s, d) in shapes.items()}


def squared_distance(weights: Iterable[tuple[str, torch.Tensor]], anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ_n ‖p_n − anchor_n‖² over (name, tensor) pairs: FedProx's and FedDyn's penalties."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in weights)


def global_norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """‖concat(tensors)‖₂ without concatenating: the norm of their norms, as ``clip_grad_norm_`` takes it."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))


def clipped(grads: Mapping[Any, torch.Tensor], max_norm: float) -> dict[Any, torch.Tensor]:
    """``grads`` scaled by ``clip_grad_norm_``'s factor min(1, max_norm / (‖g‖ + 1e-6)), its bits, with no ``.grad``
    or in-place write (vmap-safe): every path's one gradient clip."""
    scale = (max_norm / (global_norm(grads.values()) + 1e-6)).clamp(max=1.0)
    return {n: g * scale for n, g in grads.items()}


def sgd_step(
    weights: Mapping[Any, torch.Tensor], grads: Mapping[Any, torch.Tensor], lr: float,
    buffers: Mapping[Any, torch.Tensor | None] | None = None, momentum: float = 0.0, nesterov: bool = False,
    weight_decay: float = 0.0,
) -> tuple[dict[Any, torch.Tensor], dict[Any, torch.Tensor]]:
    """(new weights, new momentum buffers) of the weights with a gradient after one ``torch.optim.SGD`` step, through
    its float operations (so its bits), out of place: every path's one SGD step (the exact path's, the batched
    executor's on stacked clients, Ditto's personal one). A missing buffer starts as the gradient, as SGD's."""
    stepped, kept = {}, {}
    for n, g in grads.items():
        if weight_decay:
            g = g.add(weights[n], alpha=weight_decay)
        if momentum:
            buffer = (buffers or {}).get(n)
            buffer = kept[n] = g.clone() if buffer is None else buffer * momentum + g
            g = g.add(buffer, alpha=momentum) if nesterov else buffer
        stepped[n] = weights[n].add(g, alpha=-lr)
    return stepped, kept
