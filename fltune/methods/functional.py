"""A method's local step as a pure function of one client's weights (``torch.func``), which
engine/batched.py runs inside a ``vmap``: its objective's gradient, or a :class:`WholeStep`'s own step; a
method that writes only ``Method.backward`` is trained client by client."""

from __future__ import annotations

from abc import ABC, abstractmethod

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.func import grad
from torch.utils._pytree import tree_map

from fltune.methods.base import ClientContext, Method
from fltune.methods.objective import Batch, Forward, Tensors


@dataclass(frozen=True)
class FunctionalBatch:
    """One client's step inside the batched executor's vmap: its padded batch (``mask`` marks real samples),
    its tensors and noise, its phase's fixed parameters, and the round's shared global weights and lr."""

    forward: Forward
    names: tuple[str, ...]
    frozen: Tensors
    inputs: dict[str, Tensors]
    noise: Tensors
    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    global_weights: Tensors
    lr: float
    grad_clip: float | None = None
    """``training.grad_clip`` (:attr:`ClientContext.grad_clip`)."""
    client: ClientContext | None = None
    """The client's context when trained on its own (:meth:`WholeStep.backward`), where a step reads its own
    modules (FedSOL's global copy, Ditto's model) and their BN statistics; None inside the batched executor."""

    def full(self, trainable: Mapping[str, torch.Tensor]) -> Tensors:
        """Every parameter, in the model's order: ``trainable`` where given, the frozen value elsewhere."""
        return {n: trainable[n] if n in trainable else self.frozen[n] for n in self.names}

    def gradient(
        self, objective: Callable[[Tensors], tuple[torch.Tensor, Any]], weights: Tensors,
    ) -> tuple[Tensors, torch.Tensor, Any]:
        """:func:`gradient`, by torch.func inside the batched executor's vmap, by autograd client by client."""
        return gradient(objective, weights, functional=self.client is None)

    def batch(self, trainable: Mapping[str, torch.Tensor]) -> Batch:
        """The objective's :class:`Batch` at ``trainable`` (the frozen parameters as they are)."""
        return Batch(self.forward, self.full(trainable), self.x, self.y, self.mask, self.inputs, self.noise,
                     self.global_weights, self.client)


class FunctionalStep(NamedTuple):
    """One client's functional step (a pytree, so vmap stacks it): ``grads`` for the engine's clip and step;
    ``loss``/``logits``/``record`` at the weights stepped from; ``carry``, new values of the
    ``ClientContext.inputs`` that evolve step by step (Ditto's model), copied back to the client at the end."""

    grads: Tensors
    loss: torch.Tensor
    logits: torch.Tensor
    carry: dict[str, Tensors] = {}
    record: Tensors = {}

    def replaced(self, grads: Tensors | None = None, carry: dict[str, Tensors] | None = None) -> FunctionalStep:
        """Other gradients or carried inputs (not ``_replace``: torch 2.11's dynamo fails on it in a compiled step)."""
        return FunctionalStep(self.grads if grads is None else grads, self.loss, self.logits,
                              self.carry if carry is None else carry, self.record)


class WholeStep(Method, ABC):
    """A method whose per-batch step is more than its objective's gradient, written once as the pure
    :meth:`functional_step`; client by client, :meth:`backward` runs it at the model's own weights (unpadded,
    ``client`` set, BN statistics updated in place) and writes ``.grad``."""

    @abstractmethod
    def functional_step(self, weights: Tensors, batch: FunctionalBatch) -> FunctionalStep:
        """One client's step at its trainable ``weights``: gradient, loss and logits, carried inputs."""

    def backward(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        own = {n: p.detach() for n, p in ctx.forward.own.items()}
        trained = {n: p for n, p in ctx.forward.own.items() if p.requires_grad}
        batch = FunctionalBatch(ctx.forward, tuple(own), own, ctx.inputs, self.batch(ctx, x, y).noise, x, y, None,
                                ctx.global_state, ctx.lr, ctx.grad_clip, ctx)
        step = self.functional_step({n: own[n] for n in trained}, batch)
        if step.record:
            self.record_step(ctx, y, step.record)
        for name, param in trained.items():
            param.grad = step.grads[name]
        with torch.no_grad():
            for key, values in step.carry.items():
                for name, tensor in ctx.inputs[key].items():
                    tensor.copy_(values[name])
        return step.loss, step.logits


def has_functional_step(method_cls: type[Method]) -> bool:
    """Whether a method's local step has this pure form: ``pure_loss`` and a step that is the objective's
    gradient or a :class:`WholeStep`'s (not a composite, not Per-FedAvg's restore)."""
    owner = next(klass for klass in method_cls.__mro__ if "backward" in vars(klass))
    return method_cls.pure_loss and owner in (Method, WholeStep)


def local_step(method: Method, weights: Tensors, batch: FunctionalBatch) -> FunctionalStep:
    """One client's step: a :class:`WholeStep`'s, else the objective's gradient; plus ``gradient_correction``."""
    whole = isinstance(method, WholeStep)
    out = method.functional_step(weights, batch) if whole else objective_step(method, weights, batch)
    correction = method.gradient_correction(weights, batch.inputs)
    return out.replaced(grads={n: g + correction[n] for n, g in out.grads.items()}) if correction else out


def objective_step(method: Method, weights: Tensors, batch: FunctionalBatch) -> FunctionalStep:
    """The gradient of ``method.local_loss`` at ``weights``, with the loss, logits and record there."""

    def objective(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors]]:
        seen = batch.batch(p)
        loss, logits = method.local_loss(seen)
        return loss, (logits, seen.record)

    grads, loss, (logits, record) = batch.gradient(objective, weights)
    return FunctionalStep(grads, loss, logits, record=record)


def gradient(
    objective: Callable[[Tensors], tuple[torch.Tensor, Any]], weights: Tensors, functional: bool = True,
) -> tuple[Tensors, torch.Tensor, Any]:
    """(∇objective at ``weights``, its value, its aux), the last two detached; zeros for an unused weight.
    ``functional``: ``torch.func.grad`` (runs inside ``vmap``); else autograd on leaf views, where the forward
    may update BN statistics in place (torch.func refuses that). Both give the same bits."""
    if not functional:
        leaves = {n: w.detach().requires_grad_() for n, w in weights.items()}
        loss, aux = objective(leaves)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        detached = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, aux)
        return ({n: torch.zeros_like(w) if g is None else g for (n, w), g in zip(leaves.items(), grads, strict=True)},
                loss.detach(), detached)

    def value(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        loss, aux = objective(p)
        return loss, (loss.detach(), aux)

    grads, (loss, aux) = grad(value, has_aux=True)(weights)
    return grads, loss, aux


def global_norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """‖concat(tensors)‖₂ without concatenating: the norm of their norms, as ``clip_grad_norm_`` takes it."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))


def clip_scale(tensors: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_``'s factor min(1, max_norm / (‖g‖ + 1e-6)), with no ``.grad`` or in-place write (vmap-safe)."""
    return (max_norm / (global_norm(tensors) + 1e-6)).clamp(max=1.0)
