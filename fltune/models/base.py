"""The body/head split every fltune model follows (docs/methods.md §1).

Personalised methods keep one part per client (FedPer/FedCR/FedPAC: head; LG-FedAvg: its lower layers), FedSOL can
perturb one part only, and MAN regularises hidden activations; so the split and the activation points
are part of the model's contract rather than something each method rediscovers.
"""

from torch import Tensor, nn

InShape = tuple[int, int, int]
"""(channels, height, width) of one input sample."""


class SplitModel(nn.Module):
    """``head(body(x))``; every parameter and buffer key starts with ``body.`` or ``head.``.

    ``body`` is the feature extractor and must return flat ``[B, ·]`` outputs (``features_of`` makes them the
    ``[B, feature_dim]`` features: as they are, or a VIB net's z from its (μ, σ)); ``head`` is the
    task branch mapping them to logits. Subclasses (VIB nets, slimmable nets) may override ``forward``,
    ``features_of`` or ``activation_points`` but keep the two-part naming; ``features`` stays
    ``features_of(body(x))``, so that a functional loss running the body alone gets the same features.
    """

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
        """The features from the body's output: the output itself. A functional loss that runs the body
        alone (``Forward.part``) goes through here to get what :meth:`features` gives (a VIB net's z)."""
        return body_out

    @property
    def activation_points(self) -> list[nn.Module]:
        """The ReLU module of every hidden layer, in forward order (MAN Eq. 15-18 regularises their outputs).

        Derived as the body's ``nn.ReLU`` instances in registration order, which is forward order for every
        model here (tests/models checks that each fires, in this order). Logits are never included:
        the head holds no ReLU.
        """
        return [m for m in self.body.modules() if isinstance(m, nn.ReLU)]

    @property
    def variance_points(self) -> list[nn.Module]:
        """Points whose output's per-unit variance over the batch MAN adds to its term besides the squared
        activations: none here. Only a model built after code that adds such a term lists any (the authors'
        Tiny-ImageNet ConvNet, :class:`~fltune.models.convnets.TinyImageNetCNN`)."""
        return []


def split_keys(model: nn.Module) -> tuple[list[str], list[str]]:
    """(body keys, head keys) of ``model.state_dict()``, buffers included (they are averaged too, §2).

    Raises ValueError on a key in neither part: it would silently escape both the shared and the
    personal state of a personalised method.
    """
    keys = list(model.state_dict())
    body = [k for k in keys if k.startswith("body.")]
    head = [k for k in keys if k.startswith("head.")]
    stray = sorted(set(keys) - set(body) - set(head))
    if stray:
        raise ValueError(f"state_dict keys outside body./head.: {stray}")
    return body, head
