"""FedAvg (McMahan et al., 2017; docs/methods.md §2): local cross-entropy, n_k-weighted average of the full state.

All behaviour is the :class:`~fltune.methods.base.Method` default."""

from fltune.methods import register
from fltune.methods.base import Method


@register
class FedAvg(Method):
    """FedAvg: L = CE(f(x; w), y); server w ← Σ_k n_k w_k / Σ_k n_k."""

    name = "fedavg"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0  # one forward+backward per batch
