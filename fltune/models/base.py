"""The body/head split every fltune model follows (docs/methods.md §1): personalised methods keep one part per client,
FedSOL perturbs one part, and MAN regularises hidden activations."""

from torch import Tensor, nn

InShape = tuple[int, int, int]
"""(channels, height, width) of one input sample."""


class SplitModel(nn.Module):
    """``head(features_of(body(x)))``; every parameter and buffer key starts with ``body.`` or ``head.``. Subclasses
    keep ``features`` as ``features_of(body(x))``, so a body-only functional loss gets the same features."""

    def __init__(self, body: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.feature_dim = feature_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``[B, feature_dim]`` (what MOON projects and FedPAC matches to prototypes)."""
        return self.features_of(self.body(x))

    def features_of(self, body_out: Tensor) -> Tensor:
        """The features from the body's output (a VIB net's z), for ``Forward.part``."""
        return body_out

    @property
    def activation_points(self) -> list[nn.Module]:
        """The ReLU module of every hidden layer in forward order (MAN Eq. 15-18): the body's ``nn.ReLU`` in
        registration order, which is forward order for every model here (tests/models checks it)."""
        return [m for m in self.body.modules() if isinstance(m, nn.ReLU)]

    @property
    def variance_points(self) -> list[nn.Module]:
        """Points whose per-unit batch variance MAN adds (:class:`~fltune.models.convnets.TinyImageNetCNN`)."""
        return []


def split_keys(model: nn.Module) -> tuple[list[str], list[str]]:
    """(body keys, head keys), buffers included; a key in neither would silently escape both the shared and the personal
    state: ValueError."""
    keys = list(model.state_dict())
    body = [k for k in keys if k.startswith("body.")]
    head = [k for k in keys if k.startswith("head.")]
    stray = sorted(set(keys) - set(body) - set(head))
    if stray:
        raise ValueError(f"state_dict keys outside body./head.: {stray}")
    return body, head
