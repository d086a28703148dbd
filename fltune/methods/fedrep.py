"""FedRep (Collins et al., ICML 2021; docs/methods.md §2, SimFAFL Table 2): head epochs, then body epochs.

Only the body is uploaded. Epoch split as FedCR's ``models/distributed_training_utils.py`` (``head_eps =
local_eps - local_rep_ep``): E − ``body_epochs`` head epochs, then ``body_epochs``; where that code trains no
head epoch (E ≤ ``body_epochs``) the head keeps one here, so it is never left untrained.
"""

from pydantic import Field

from fltune.methods import register
from fltune.methods.base import ClientContext, Params, Phase
from fltune.methods.fedper import FedPer


class FedRepParams(Params):
    body_epochs: int = Field(1, ge=1, description="epochs on the body after the head (FedCR: local_rep_ep 1)")


@register
class FedRep(FedPer):
    """FedRep: head_i ← argmin CE with the body fixed, then body ← CE steps with head_i fixed."""

    name = "fedrep"
    Params = FedRepParams
    stored_models = 1.0  # the local model only
    passes_per_step = 1.0  # head and body epochs each take one pass per batch

    def phases(self, ctx: ClientContext) -> list[Phase]:
        head_epochs = max(ctx.epochs - self.params.body_epochs, 1)
        return [Phase(head_epochs, ("head.",)), Phase(self.params.body_epochs, ("body.",))]
