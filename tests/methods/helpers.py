"""Helpers for method tests: a hand-built ClientContext around a tiny model, and a server step checked to be
a pure function of its inputs; no Ray involved."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from fltune.engine.transfer import DeviceServer
from fltune.methods.base import ClientContext, Method, ServerContext, ServerUpdate
from fltune.models import build_model


def tiny_model(seed: int = 0, num_classes: int = 3) -> nn.Module:
    """An MLP on 1×4×4 inputs: small enough to compute every term by hand or with autograd."""
    torch.manual_seed(seed)
    return build_model("mlp", (1, 4, 4), num_classes)


def tiny_batch(seed: int = 0, n: int = 6, num_classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=gen), torch.randint(0, num_classes, (n,), generator=gen)


def make_ctx(
    model: nn.Module, *, global_state: dict[str, torch.Tensor] | None = None, state: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None, client_id: int = 0, lr: float = 0.1, epochs: int = 1,
    batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None, grad_clip: float | None = None,
) -> ClientContext:
    """A ClientContext as the engine would build it; global weights default to the model's own."""
    if global_state is None:
        global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = batches if batches is not None else [tiny_batch()]

    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(data)

    return ClientContext(
        client_id=client_id, model=model, global_state=global_state, state=dict(state or {}),
        server_tensors=DeviceServer(dict(server or {}), torch.device("cpu")),
        num_samples=sum(len(y) for _, y in data), epochs=epochs, lr=lr,
        device=torch.device("cpu"), batches=epoch, grad_clip=grad_clip,
    )


def loss_of(method: Method, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``method``'s objective on ``(x, y)`` for the client's own model, as a client trained on its own sees it."""
    return method.local_loss(method.batch(ctx, x, y))


def pure_aggregate(method: Method, ctx: ServerContext) -> ServerUpdate:
    """``method.aggregate(ctx)``, failing if the call changed any of its inputs (byte-compared pickles)."""
    before = pickle.dumps(ctx)
    update = method.aggregate(ctx)
    assert pickle.dumps(ctx) == before, f"{method.name}.aggregate modified its inputs"
    return update
