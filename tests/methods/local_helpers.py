"""Independent references for the local-learning method tests (SAM family, drift, MAN, FedSOL, ...).

The helpers' tiny MLP is written out here as plain torch ops on a dict of parameters, so a test computes
the expected loss or gradient from the paper's equation without going through any fltune code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fltune.engine.functional import client_backward
from fltune.engine.local import add_correction
from fltune.methods.base import ClientContext, Method

Params = dict[str, Tensor]


def params_of(model: nn.Module) -> Params:
    """Detached copies of the model's parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def mlp(params: Params, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The tiny MLP by hand: (logits, [post-ReLU activation of each hidden layer])."""
    h1 = torch.relu(x.flatten(1) @ params["body.fc1.linear.weight"].T + params["body.fc1.linear.bias"])
    h2 = torch.relu(h1 @ params["body.fc2.linear.weight"].T + params["body.fc2.linear.bias"])
    return h2 @ params["head.weight"].T + params["head.bias"], [h1, h2]


def ce(params: Params, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(mlp(params, x)[0], y)


def grad_of(loss: Callable[[Params], Tensor], params: Params) -> Params:
    """∇loss at ``params`` (zeros for parameters the loss does not use)."""
    leaves = {n: v.detach().clone().requires_grad_(True) for n, v in params.items()}
    grads = torch.autograd.grad(loss(leaves), list(leaves.values()), allow_unused=True)
    return {n: torch.zeros_like(v) if g is None else g for (n, v), g in zip(leaves.items(), grads)}


def norm(tensors: Params) -> Tensor:
    return torch.sqrt(sum((t**2).sum() for t in tensors.values()))


def shifted(base: Params, eps: Params) -> Params:
    return {n: v + eps.get(n, torch.zeros_like(v)) for n, v in base.items()}


def engine_grads(method: Method, ctx: ClientContext, x: Tensor, y: Tensor) -> tuple[Tensor, Params]:
    """What the engine's loop leaves in ``.grad`` for one batch (before clipping): (loss, gradients)."""
    ctx.model.zero_grad(set_to_none=True)
    loss, _ = client_backward(method)(ctx, x, y)
    add_correction(method, ctx)
    return loss, {n: p.grad.detach().clone() for n, p in ctx.model.named_parameters()}


def assert_close(actual: Params, expected: Params, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    assert actual.keys() == expected.keys()
    for name in actual:
        torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=atol, msg=name)


def move_away(model: nn.Module, scale: float = 0.05, seed: int = 1) -> dict[str, Tensor]:
    """Perturb the model's parameters randomly; returns the state before the move (the 'global' model)."""
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return global_state
