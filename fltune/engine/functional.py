"""A method's step as a pure function of one client's weights (``torch.func``), which engine/batched.py runs inside a
``vmap``, and the same step client by client for a method with its own ``Method.step`` (SAM's two passes, Ditto's
second model): the engine's side of ``Batch.gradient`` and ``Batch.keep``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import CodeType
from typing import Any, NamedTuple

import torch
from torch.func import grad
from torch.utils._pytree import tree_map

from fltune.methods.base import ClientContext, Method
from fltune.methods.objective import Batch, Objective, Tensors


class FunctionalStep(NamedTuple):
    """One client's step (a pytree, so vmap stacks it): ``grads`` for the engine's clip and step; ``loss``/``logits``/
    ``record`` at the weights stepped from; ``kept``, new values of the client's kept tensors (``Batch.keep``)."""

    grads: Tensors
    loss: torch.Tensor
    logits: torch.Tensor
    kept: dict[str, Tensors]
    record: Tensors


def batchable(method_cls: type[Method]) -> bool:
    """Whether the batched executor can run the method's step: no ``backward`` of its own and an objective reading
    no module of a client."""
    return not own_backward(method_cls) and not reads_modules(method_cls)


def own_backward(method_cls: type[Method]) -> bool:
    """Whether the method fills ``.grad`` by a ``backward`` of its own (Proximal's projection, Per-FedAvg's restore),
    which autograd alone runs."""
    return next(klass for klass in method_cls.__mro__ if "backward" in vars(klass)) is not Method


def reads_modules(method_cls: type[Method]) -> bool:
    """Whether the method's ``local_loss`` or ``step`` calls ``Batch.module`` (a client's hooks, sub-networks, frozen
    copies: only client by client), read off their code, their inner functions, the method's functions they call and
    what they close over (a composite's modifier). Should a call escape this reading, ``Batch.module`` raises ``ClientByClient`` in the batched step."""
    todo: list[Any] = [vars(k)[n] for k in method_cls.__mro__[:-1] for n in HOOKS if n in vars(k)]
    seen: set[CodeType] = set()
    while todo:
        item = todo.pop()
        if isinstance(item, type):
            todo += [vars(item)[n] for n in HOOKS if n in vars(item)]
            continue
        code = getattr(item, "__code__", item)
        if not isinstance(code, CodeType) or code in seen:
            continue
        seen.add(code)
        if "module" in code.co_names:
            return True
        todo += [c for c in code.co_consts if isinstance(c, CodeType)]
        todo += [cell.cell_contents for cell in getattr(item, "__closure__", None) or ()]
        todo += [getattr(method_cls, n) for n in code.co_names if callable(getattr(method_cls, n, None))]
    return False


HOOKS = ("local_loss", "step")  # what the batched executor runs per batch


def client_backward(method: Method) -> Callable[[ClientContext, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """What fills ``.grad`` for one batch client by client: a ``step`` of the method's own (:func:`step_client`), else
    its ``backward``."""
    return partial(step_client, method) if type(method).step is not Method.step else method.backward


def local_step(method: Method, batch: Batch) -> FunctionalStep:
    """One client's step inside the batched executor's vmap, plus ``gradient_correction``."""
    grads, loss, logits = method.step(batch)
    correction = method.gradient_correction(batch.trained, batch.inputs)
    if correction:
        grads = {n: g + correction[n] for n, g in grads.items()}
    return FunctionalStep(grads, loss, logits, dict(batch.kept), dict(batch.record))


def step_client(method: Method, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A method's own ``step`` client by client, as ``Method.backward`` would run it: at the model's own weights (unpadded,
    BN statistics updated in place), ``.grad`` written, kept tensors copied back into ``ctx.inputs``."""
    own = {n: p.detach() for n, p in ctx.forward.own.items()}
    trained = tuple(n for n, p in ctx.forward.own.items() if p.requires_grad)
    batch = replace(method.batch(ctx, x, y), weights=own, trainable=trained, lr=ctx.lr, grad_clip=ctx.grad_clip,
                    gradient=autograd_gradient)
    grads, loss, logits = method.step(batch)
    if batch.record:
        method.record_step(ctx, y, batch.record)
    for name in trained:
        ctx.forward.own[name].grad = grads[name]
    with torch.no_grad():
        for key, values in batch.kept.items():
            for name, tensor in ctx.inputs[key].items():
                tensor.copy_(values[name])
    return loss, logits


def autograd_gradient(objective: Objective, weights: Tensors) -> tuple[Tensors, torch.Tensor, Any]:
    """:meth:`Batch.gradient` by autograd on leaf views, where the forward may update BN statistics in place (torch.func
    refuses that); the same bits as :func:`functional_gradient`."""
    leaves = {n: w.detach().requires_grad_() for n, w in weights.items()}
    loss, aux = objective(leaves)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    detached = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, aux)
    return ({n: torch.zeros_like(w) if g is None else g for (n, w), g in zip(leaves.items(), grads, strict=True)},
            loss.detach(), detached)


def functional_gradient(objective: Objective, weights: Tensors) -> tuple[Tensors, torch.Tensor, Any]:
    """:meth:`Batch.gradient` by ``torch.func.grad`` (runs inside ``vmap``)."""

    def value(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        loss, aux = objective(p)
        return loss, (loss.detach(), aux)

    grads, (loss, aux) = grad(value, has_aux=True)(weights)
    return grads, loss, aux
