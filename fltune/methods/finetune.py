"""The -FT phase as a method of its own: the same local loop, a different set of phases.

Why a method: fine-tuning the personal part is local training with one phase (those parameters only, plain
cross-entropy) started from a method's own client model, so it wraps that method and runs through the
engine's ``train_client`` unchanged (the personalised evaluation's ``finetune`` step).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fltune.methods.base import ClientContext, Method, Phase
from fltune.methods.wire import State
class FineTune(Method):
    """The final personal round (FedAvg-FT, FedSR-FT, FedCR's last round; docs/methods.md §2): starting from a
    method's client model, train its personal part with plain cross-entropy, the shared part frozen.

    As FedCR's code does in its last round (``train_cnn(last=True)``: the averaged ``w_glob_keys`` frozen,
    the rest trained): a method whose personal part lies outside the head (LG-FedAvg's lower layers) tunes that
    part; every other method (none personal, a personal head, FedSR's per-client head extras) its head.

    With ``whole`` (``training.finetune_params: all``) it trains every parameter instead, as FedSOL's code
    fine-tunes every method before its personalised evaluation (``algorithms/BaseClientTrainer.py finetune``).
    """

    def __init__(self, inner: Method, epochs: int, lr: float | None, whole: bool = False) -> None:
        super().__init__()
        self.inner, self.epochs, self.lr, self.whole = inner, epochs, lr, whole

    def client_model_state(self, global_state: State, client_state: dict[str, Any]) -> State:
        return self.inner.client_model_state(global_state, client_state)

    def phases(self, ctx: ClientContext) -> list[Phase]:
        prefixes = None if self.whole else tuned_prefixes(self.inner, ctx.model)
        return [Phase(epochs=self.epochs, prefixes=prefixes, lr=self.lr)]


def tuned_prefixes(method: Method, model: nn.Module) -> tuple[str, ...]:
    """What :class:`FineTune` trains: the method's personal keys when some lie outside ``head.``, else the head."""
    personal = sorted(method.personal_keys(model))
    return tuple(personal) if any(not k.startswith("head.") for k in personal) else ("head.",)


def tuner_for(method: Method, epochs: int, lr: float | None, whole: bool = False) -> FineTune:
    """The ``tune`` final round of ``method``: its own tuner class (``Method.tuner``) or :class:`FineTune`."""
    return (method.tuner or FineTune)(method, epochs, lr, whole)
