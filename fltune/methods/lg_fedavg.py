"""LG-FedAvg (Liang et al., 2020; docs/methods.md §2, SimFAFL Table 2): personal bodies, a shared head.

"Think locally, act globally": each client learns its own representation and only the task head is
averaged (n_k-weighted). **[U]** The whole body is personal; FedCR's code shares the last two layers for
its CNNs (``w_glob_keys`` [3, 4]), here the split is the model's own body/head boundary.
"""

from fltune.methods import register
from fltune.methods._personal import PersonalBody


@register
class LGFedAvg(PersonalBody):
    """LG-FedAvg: L = CE(head(body_i(x)), y); head ← Σ_k n_k head_k / Σ_k n_k, body_i stays on client i."""

    name = "lg_fedavg"
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0
    batchable = True
