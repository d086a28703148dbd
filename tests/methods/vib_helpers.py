"""A tiny VIB net for the VIB methods' tests (FedCR, SimFAFL, FedSR): 1×4×4 inputs, dimZ 2, S = 4."""

import torch

from fltune.models import build_model
from fltune.models.vib import VIBNet


def tiny_vib(seed: int = 0, num_classes: int = 3, samples: int = 4) -> VIBNet:
    torch.manual_seed(seed)
    return build_model("vib_mlp", (1, 4, 4), num_classes, dim_z=2, samples=samples)


def global_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as a round's global state (detached tensors, as the engine passes them)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def numpy_state(model: torch.nn.Module) -> dict:
    """The model's weights as the server holds them (numpy)."""
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
