"""The body/head split every fltune model follows (docs/methods.md §1). Personalised methods keep one part per client,
FedSOL can perturb one part only, and MAN regularises hidden activations; so the split and the activation points are
part of the model's contract."""

from torch import Tensor, nn

InShape = tuple[int, int, int]
"""(channels, height, width) of one input sample."""


class SplitModel(nn.Module):
    """``head(body(x))``; every parameter and buffer key starts with ``body.`` or ``head.``.
    ``body`` returns flat ``[B, ·]`` outputs that ``features_of`` makes the ``[B, feature_dim]`` features; ``head`` maps
    them to logits. Subclasses may override ``forward``, ``features_of`` or ``activation_points`` but keep the naming,
    and ``features`` stays ``features_of(body(x))``, so a body-only functional loss gets the same features."""

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
        """The features from the body's output (here: itself; a VIB net's z), for ``Forward.part``."""
        return body_out

    @property
    def activation_points(self) -> list[nn.Module]:
        """The ReLU module of every hidden layer in forward order (MAN Eq. 15-18): the body's ``nn.ReLU`` in
        registration order, which is forward order for every model here (tests/models checks it)."""
        return [m for m in self.body.modules() if isinstance(m, nn.ReLU)]

    @property
    def variance_points(self) -> list[nn.Module]:
        """Points whose per-unit batch variance MAN adds to its term: only in
        :class:`~fltune.models.convnets.TinyImageNetCNN`, after the authors' code."""
        return []


def split_keys(model: nn.Module) -> tuple[list[str], list[str]]:
    """(body keys, head keys) of ``model.state_dict()``, buffers included. Raises ValueError on a key in
    neither part: it would silently escape both the shared and the personal state."""
    keys = list(model.state_dict())
    body = [k for k in keys if k.startswith("body.")]
    head = [k for k in keys if k.startswith("head.")]
    stray = sorted(set(keys) - set(body) - set(head))
    if stray:
        raise ValueError(f"state_dict keys outside body./head.: {stray}")
    return body, head
