"""FedPer (Arivazhagan et al., 2019; docs/methods.md §2, SimFAFL Table 2): a shared body, a personal head."""

from torch import nn

from fltune.methods import register
from fltune.methods.base import Method


@register
class FedPer(Method):
    """FedPer: L = CE(head_i(body(x)), y); body ← Σ_k n_k body_k / Σ_k n_k, head_i stays on client i."""

    name = "fedper"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0

    def personal_keys(self, model: nn.Module) -> set[str]:
        """The head, stored in ``state["personal"]`` by ``Method.client_result`` (FedRep, FedCR, SimFAFL and FedPAC keep
        it too); a client never sampled starts from, and is evaluated with, the global one."""
        return {k for k in model.state_dict() if k.startswith("head.")}
