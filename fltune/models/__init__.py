"""fltune.models: architectures split into body and head (docs/methods.md §1), registered by name on import."""

from fltune.models import convnets, resnet, resnet56, vgg, vib, vit  # noqa: F401  (imported for their registrations)
from fltune.models.base import InShape, SplitModel, split_keys
from fltune.models.registry import MODELS, build_model, default_model, register_model

__all__ = [
    "MODELS",
    "InShape",
    "SplitModel",
    "build_model",
    "default_model",
    "register_model",
    "split_keys",
]
