"""The -FT phase as a method of its own: the same local loop, a different set of phases.

Why a method: fine-tuning a head is local training with one phase (head parameters only, plain
cross-entropy) started from a method's own client model, so it wraps that method and runs through the
engine's ``train_client`` unchanged (the personalised evaluation's ``finetune`` step).
"""

from __future__ import annotations

from typing import Any

from fltune.methods.base import ClientContext, Method, Phase, State


class FineTune(Method):
    """The -FT phase (FedAvg-FT, FedSR-FT, FedBABU, FedCR's last round; METHODS.md §2): starting from a
    method's client model, train only the head with plain cross-entropy, body frozen."""

    def __init__(self, inner: Method, epochs: int, lr: float | None) -> None:
        super().__init__()
        self.inner, self.epochs, self.lr = inner, epochs, lr

    def client_model_state(self, global_state: State, client_state: dict[str, Any]) -> State:
        return self.inner.client_model_state(global_state, client_state)

    def phases(self, ctx: ClientContext) -> list[Phase]:
        return [Phase(epochs=self.epochs, prefixes=("head.",), lr=self.lr)]
