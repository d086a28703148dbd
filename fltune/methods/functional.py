"""A method's local step as a pure function of one client's parameters (``torch.func``), for executors
that train many clients at once (engine/batched.py runs it inside a ``vmap``): the gradient of its one
objective, or, where its step is more (it overrides ``Method.backward``: SAM's two passes, Ditto's second
model), its own ``functional_step(weights, batch)``; without one it is trained client by client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.func import grad

from fltune.methods.base import Method
from fltune.methods.objective import Batch, Forward, Tensors


@dataclass(frozen=True)
class FunctionalBatch:
    """One client's step inside the batched executor's vmap: its padded batch (``mask`` marks the real
    samples), its tensors (``ClientContext.inputs``) and noise, the parameters its phase keeps fixed, and
    what all clients of the round share: the global weights and the round's learning rate (``ctx.lr``)."""

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

    def full(self, trainable: Mapping[str, torch.Tensor]) -> Tensors:
        """Every parameter, in the model's order: ``trainable`` where given, the frozen value elsewhere."""
        return {n: trainable[n] if n in trainable else self.frozen[n] for n in self.names}

    def batch(self, trainable: Mapping[str, torch.Tensor]) -> Batch:
        """The objective's :class:`Batch` at ``trainable`` (the frozen parameters as they are)."""
        return Batch(self.forward, self.full(trainable), self.x, self.y, self.mask, self.inputs, self.noise,
                     self.global_weights)


class FunctionalStep(NamedTuple):
    """What one client's functional step gives the batched executor (a pytree, so vmap stacks it).

    ``grads``: the trainable parameters' gradient, which the engine clips and steps with SGD, as the exact
    path's ``.grad``. ``loss``/``logits``: at the weights stepped from, for the train metrics. ``carry``:
    new values of ``ClientContext.inputs`` entries that evolve step by step (Ditto's personal model); the
    engine keeps them for the client's next step and finally copies them into the client's own tensors.
    ``record``: the objective's ``Batch.record`` at the weights stepped from, for ``Method.record_step``.
    """

    grads: Tensors
    loss: torch.Tensor
    logits: torch.Tensor
    carry: dict[str, Tensors] = {}
    record: Tensors = {}

    def replaced(self, grads: Tensors | None = None, carry: dict[str, Tensors] | None = None) -> FunctionalStep:
        """This step with other gradients or carried inputs. ``_replace`` would do, but under
        ``resources.compile`` this runs inside the traced group step, and torch 2.11's dynamo failed an
        assertion on a NamedTuple built by ``_replace`` there; the constructor it traces."""
        return FunctionalStep(self.grads if grads is None else grads, self.loss, self.logits,
                              self.carry if carry is None else carry, self.record)


def has_functional_step(method_cls: type[Method]) -> bool:
    """Whether a method's local step has this pure form: its objective is pure (``Method.pure_loss``) and its
    per-batch step is that objective's gradient, or the class that last changed the step (``backward``) gives
    it as ``functional_step`` too. A ``<method>+<modifier>`` composite's objective
    is not pure; Per-FedAvg's step, a restore and a per-step lr, has no functional form."""

    def owner(hook: str) -> int:
        return next((i for i, klass in enumerate(method_cls.__mro__) if hook in vars(klass)), len(method_cls.__mro__))

    step = owner("backward")
    return method_cls.pure_loss and (method_cls.__mro__[step] is Method or owner("functional_step") <= step)


def local_step(method: Method, weights: Tensors, batch: FunctionalBatch) -> FunctionalStep:
    """One client's local step at its trainable ``weights``: the method's own ``functional_step`` where it has
    one, else its objective's gradient; plus its ``gradient_correction`` (the client-by-client path adds it
    to ``.grad`` after the step's passes)."""
    own = getattr(method, "functional_step", None)
    out = own(weights, batch) if own is not None else objective_step(method, weights, batch)
    correction = method.gradient_correction(weights, batch.inputs)
    return out.replaced(grads={n: g + correction[n] for n, g in out.grads.items()}) if correction else out


def objective_step(method: Method, weights: Tensors, batch: FunctionalBatch) -> FunctionalStep:
    """The gradient of ``method.local_loss`` at the trainable ``weights``, with the loss, logits and record
    there: the client-by-client path's ``local_loss(...).backward()``."""

    def objective(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors]]:
        seen = batch.batch(p)
        loss, logits = method.local_loss(seen)
        return loss, (logits, seen.record)

    grads, loss, (logits, record) = gradient(objective, weights)
    return FunctionalStep(grads, loss, logits, record=record)


def gradient(
    objective: Callable[[Tensors], tuple[torch.Tensor, Any]], weights: Tensors,
) -> tuple[Tensors, torch.Tensor, Any]:
    """(∇objective at ``weights``, its value, its auxiliary output), the last two detached: ``objective``
    returns (loss, aux). ``torch.func.grad`` gives zeros for a parameter the loss does not use."""

    def value(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        loss, aux = objective(p)
        return loss, (loss.detach(), aux)

    grads, (loss, aux) = grad(value, has_aux=True)(weights)
    return grads, loss, aux


def clip_scale(tensors: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s factor min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the norm over all of
    ``tensors`` (the norm of their norms, as torch takes it), without ``.grad`` or in-place writes, so it
    also runs inside the batched executor's vmap."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))
    return (max_norm / (total + 1e-6)).clamp(max=1.0)
