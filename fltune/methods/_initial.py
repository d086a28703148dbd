"""The initial global model as a client's own model before it has one (a shared base; nothing registered). Some authors'
code copies the initial global model into every client's kept model before round 1 (MOON's ``prev_models`` in
``mmendiet/FedAlign:methods/moon.py``, Ditto's ``model_local`` in
``haozzh/FedCR:models/distributed_training_utils_ditto.py``), so a client first sampled later starts from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torch import Tensor

from fltune.methods.base import ClientContext, Method, ServerContext, ServerUpdate, State, holders

INITIAL = "initial"
"""Server-state and payload key of the initial model."""


class InitialStandIn(Method):
    """A method whose clients may start their kept model (state key ``kept``) from the initial model."""

    kept: str
    """The client-state key of the model the initial one stands in for."""
    first: str
    """The parameter choosing the kept model's start: ``global`` (the round's) or ``initial``."""

    def init_server_state(self, global_state: State) -> dict[str, Any]:
        state = super().init_server_state(global_state)
        if getattr(self.params, self.first) != "initial":
            return state
        return {**state, INITIAL: {k: v.copy() for k, v in global_state.items()}}

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """The base's; once every client has its own, the initial model is dropped and no longer sent."""
        update = super().aggregate(ctx)
        if INITIAL not in update.server_state or holders(ctx.client_store, self.kept) < ctx.num_clients:
            return update
        return replace(update, server_state={k: v for k, v in update.server_state.items() if k != INITIAL})

    def initial_model(self, ctx: ClientContext) -> Mapping[str, Tensor] | None:
        """The initial model for a client without a kept model."""
        if self.kept in ctx.state or INITIAL not in ctx.server_tensors:
            return None
        return ctx.server_tensors[INITIAL]
