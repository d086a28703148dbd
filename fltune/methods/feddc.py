"""FedDC (Gao et al., 2022; docs/methods.md §2): FedDyn-style local drift plus SCAFFOLD-style gradient correction."""

from fltune.methods import register
from fltune.methods._drift import ControlVariates
from fltune.methods.base import ClientContext
from fltune.methods.feddyn import FedDyn


@register
class FedDC(FedDyn, ControlVariates):
    """FedDC: L = CE + (α/2)‖θ − (θ_g − h_k)‖² + ⟨θ, c − c_k⟩ (``gaoliang13/FedDC``, ``train_model_FedDC``).
    FedDyn's drift plus SCAFFOLD's correction; c_k ← c_k − c + (θ_g − θ_k)/(K_eff·lr_0) with lr_0 = ``training.lr``
    undecayed, as the code divides by the rate it was given (``beta = 1/n_minibatch/learning_rate`` in
    ``gaoliang13/FedDC:utils_methods_FedDC.py`` and MAN Table 1's copy,
    ``vcl-iisc/fedMAN:man_code_sam/utils_methods_FedDC.py``). [U] α is not scaled by client size (see FedDyn)."""

    name = "feddc"
    passes_per_step = 1.0
    stored_models = 4.0  # the local model, θ_g, the drift h_k and the correction c_k (c is broadcast)

    def correction_lr(self, ctx: ClientContext) -> float:
        return ctx.initial_lr or ctx.lr
