"""Local-only training (docs/methods.md §2; FedSOL Table 9's "Local-only" row): no federation at all.

Every client trains its own model on its own data with plain CE and keeps all of it (``personal_keys`` is the
whole state), so nothing is averaged and the server's model stays the initial one. What it is for: the floor a
personalised method must beat, each client's model scored on its own held-out split.
"""

from torch import nn

from fltune.methods import register
from fltune.methods.base import Method


@register
class LocalOnly(Method):
    """Local-only: L = CE on client i's data from the common initial model; the whole model stays on client i.

    FedSOL's code (``Lee-Gihun/FedSOL:algorithms/localonly``) trains each client once for 200 epochs with its lr
    decayed by 0.99 an epoch; here a round is a stretch of local epochs, so ``federation.fraction: 1`` with
    ``local_epochs: 1`` and ``training.lr_decay: 0.99`` over 200 rounds takes the same steps at the same rates.
    The momentum buffer starts afresh each round, where the code keeps one optimiser for all 200 epochs."""

    name = "local_only"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0

    def personal_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict())
