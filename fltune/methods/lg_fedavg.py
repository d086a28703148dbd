"""LG-FedAvg (Liang et al., 2020; docs/methods.md §2, SimFAFL Table 2): personal lower layers, shared top layers.

Only the model's last ``global_layers`` layers are averaged (``pliang279/LG-FedAvg:main_lg.py``
``num_layers_keep``); default 2, as FedCR's code behind SimFAFL Table 2 (``haozzh/FedCR:main_fed.py``
``w_glob_keys``). A layer is a conv or linear map, a norm layer counting with the one before it.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from fltune.errors import FLTuneError
from fltune.methods import register
from fltune.methods.base import Method, Params


def weight_layers(model: nn.Module) -> list[set[str]]:
    """The model's layers in forward order as state-dict keys, as LG-FedAvg's and FedCR's ``weight_keys``."""
    keys = set(model.state_dict())
    layers: list[set[str]] = []
    for name, module in model.named_modules():
        params = dict(module.named_parameters(recurse=False))
        if not params:
            continue
        own = {f"{name}.{k}".lstrip(".") for k in [*params, *dict(module.named_buffers(recurse=False))]} & keys
        weight = params.get("weight")
        if layers and (weight is None or weight.dim() == 1):
            layers[-1] |= own
        else:
            layers.append(own)
    return layers


class LGFedAvgParams(Params):
    global_layers: int = Field(2, ge=1, description="the model's last k layers are shared and averaged, the rest "
                               "stay on each client (LG-FedAvg code: num_layers_keep; FedCR's runs: 2)")


@register
class LGFedAvg(Method):
    """LG-FedAvg: L = CE(f(x; θ_i^local, θ^global), y); the last ``global_layers`` layers θ^global ←
    Σ_k n_k θ_k^global / Σ_k n_k, the layers below them stay on client i."""

    name = "lg_fedavg"
    Params = LGFedAvgParams
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """A count that leaves no layer on the clients fails here, in one line."""
        layers = len(weight_layers(model))
        if self.params.global_layers >= layers:
            raise FLTuneError(f"method.global_layers: {self.params.global_layers}; allowed: 1 to {layers - 1} "
                              f"(the model has {layers} layers, and at least one must stay on each client)")
        return model

    def personal_keys(self, model: nn.Module) -> set[str]:
        shared = set().union(*weight_layers(model)[-self.params.global_layers:])
        return set(model.state_dict()) - shared
