"""FedBABU (Oh, Kim & Yun, ICLR 2022; docs/methods.md §2, SimFAFL Table 2): body only, head frozen at init.

During federated training the head keeps its random initialisation on every client, so all clients learn
the body against the same fixed classifier; the engine's fine-tuning (-FT) phase adapts the head per
client at the end. Nothing is personal during training: the (unchanged) head is averaged with the body.
FedCR's code runs its FedBABU exactly like FedPer (SimFAFL Table 2 shows identical numbers for the two);
this is the paper's algorithm instead.
"""

from fltune.methods import register
from fltune.methods.base import ClientContext, Method, Phase


@register
class FedBABU(Method):
    """FedBABU: L = CE(head_0(body(x)), y) with only ``body.*`` trained; server as FedAvg."""

    name = "fedbabu"
    stored_models = 1.0  # the local model only (the head is frozen, not copied)
    passes_per_step = 1.0

    def phases(self, ctx: ClientContext) -> list[Phase]:
        return [Phase(epochs=ctx.epochs, prefixes=("body.",))]
