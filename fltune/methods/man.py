"""MAN (Yashwanth et al., 2023; docs/methods.md §2): minimise hidden activations' norms for flatter minima.

A modifier, not a method of its own: ``<base>+man`` adds the term to any base's local loss (``fedavg+man``,
``feddyn+man``, ``fedsam+man`` ...), and ``man`` alone is FedAvg+MAN, the paper's main variant.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from pydantic import Field
from torch import Tensor, nn

from fltune.errors import FLTuneError
from fltune.methods import register, register_modifier
from fltune.methods.base import Params
from fltune.methods.compose import LossAndLogits, Modifier, compose
from fltune.methods.fedavg import FedAvg
from fltune.methods.objective import Batch


class MANParams(Params):
    zeta: float = Field(0.15, ge=0, description="weight ζ (CIFAR-100 0.15, Tiny-ImageNet 0.1; supp. §4: 0.1-1.5)")
    halve: bool = Field(
        True, description="use ζ/2 as the authors' code does (their ζ values are tuned with it); False: Eq. 15's ζ"
    )


@contextmanager
def first_activations(points: list[nn.Module]) -> Iterator[dict[nn.Module, Tensor]]:
    """Each point's output the first time it fires inside the block (graph kept), so a base that reruns
    the model (a sub-network pass) regularises its main pass alone; hooks live for one loss call only."""
    outputs: dict[nn.Module, Tensor] = {}

    def record(module: nn.Module, _inputs: tuple[Tensor, ...], output: Tensor) -> None:
        outputs.setdefault(module, output)

    handles = [point.register_forward_hook(record) for point in points]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def activation_norm(activations: Sequence[Tensor], variances: Sequence[Tensor] = ()) -> Tensor:
    """Eq. 16-18: L_act = Σ_l E‖a_l‖², the mean of a_l² over every axis; plus each of ``variances``' mean
    unbiased batch variance (the authors' Tiny-ImageNet code; a batch of one adds 0, not the code's NaN)."""
    squares = sum(a.pow(2).mean() for a in activations)
    return squares + sum(v.var(dim=0, correction=min(1, len(v) - 1)).mean() for v in variances)


@register_modifier
class MAN(Modifier):
    """MAN (Eq. 15): f_k = L_k + ζ·L_act over the model's ``activation_points`` (never the logits), from the base's own
    forward pass. [U] The authors' code (``vcl-iisc/fedMAN:code/utils_general.py``, ``(args.mu_mean/2)*loss_var_algo``)
    weights by ζ/2 and the paper's ζ were tuned with it, hence ``halve: true``. ζ = 0: the base's loss exactly."""

    name = "man"
    Params = MANParams

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """A model without activation points (a ViT has GELUs, no ReLU) would silently train the base alone."""
        if self.params.zeta and not (model.activation_points or model.variance_points):
            raise FLTuneError("model.name: man needs a model with hidden ReLU layers to regularise; this model "
                              "has none (every model but sl_vit has them)")
        return model

    def local_loss(self, batch: Batch, base_loss: Callable[[], LossAndLogits]) -> LossAndLogits:
        if self.params.zeta == 0:
            return base_loss()
        model = batch.module()  # its hooks would average padded rows in: client by client
        squared, varied = model.activation_points, model.variance_points
        with first_activations(list(dict.fromkeys([*squared, *varied]))) as outputs:
            loss, logits = base_loss()
        weight = self.params.zeta / 2 if self.params.halve else self.params.zeta
        term = activation_norm([outputs[p] for p in squared if p in outputs],
                               [outputs[p] for p in varied if p in outputs])
        return loss + weight * term, logits


FedAvgMAN = register(compose(FedAvg, MAN, name="man"))
"""``man``: FedAvg+MAN, the paper's main variant, registered so it runs (and is tuned) by that name."""
