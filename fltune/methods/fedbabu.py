"""FedBABU (Oh, Kim & Yun, ICLR 2022; docs/methods.md §2, SimFAFL Table 2): body only, head frozen at init.

All clients learn the body against the same fixed random head, which the -FT phase adapts per client at
the end. This is the paper's algorithm, not FedCR's code, which runs its FedBABU exactly like FedPer.
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
