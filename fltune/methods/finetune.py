"""The -FT phase as a method of its own: fine-tuning is local training with one phase from a method's own client model,
so it wraps that method and runs through the engine's ``train_client`` unchanged."""

from __future__ import annotations

from torch import nn

from fltune.methods.base import ClientContext, Method, Phase


class FineTune(Method):
    """The final personal round (FedAvg-FT, FedSR-FT; docs/methods.md §2): from a method's client model, train
    its personal part (LG-FedAvg's lower layers), else its head, on plain CE, the rest frozen, as FedCR's
    ``train_cnn(last=True)``. With ``whole`` (``training.finetune_params: all``) every parameter, as FedSOL's
    ``algorithms/BaseClientTrainer.py finetune``.
    """

    def __init__(self, inner: Method, epochs: int, lr: float | None, whole: bool = False) -> None:
        super().__init__(inner.params)  # the wrapped method's hyperparameters (Per-FedAvg's β)
        self.inner, self.epochs, self.lr, self.whole = inner, epochs, lr, whole

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
