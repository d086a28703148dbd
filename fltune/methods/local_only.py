"""Local-only training (docs/methods.md §2; FedSOL Table 9's "Local-only" row): no federation at all.

Every client keeps its whole model, so the server's stays the initial one: the floor a personalised method must beat.
"""

from torch import nn

from fltune.methods import register
from fltune.methods.base import Method


@register
class LocalOnly(Method):
    """Local-only: L = CE on client i's data from the common initial model; the whole model stays on client i.
    FedSOL's code (``Lee-Gihun/FedSOL:algorithms/localonly``) trains 200 epochs at lr decayed 0.99 an epoch: here
    ``federation.fraction: 1``, ``local_epochs: 1``, ``training.lr_decay: 0.99`` over 200 rounds, except that the
    momentum buffer restarts each round."""

    name = "local_only"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0

    def personal_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict())
