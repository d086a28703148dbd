"""FedPer (Arivazhagan et al., 2019; docs/methods.md §2, SimFAFL Table 2): a shared body, a personal head."""

from fltune.methods import register
from fltune.methods._personal import PersonalHead


@register
class FedPer(PersonalHead):
    """FedPer: L = CE(head_i(body(x)), y); body ← Σ_k n_k body_k / Σ_k n_k, head_i stays on client i."""

    name = "fedper"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0
