"""What a round's clients start from: the round's input, and its copies to the training device, made once per
distinct array for every client a process trains."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fltune.methods.wire import State, to_device


@dataclass(frozen=True)
class RoundInput:
    """What every client of a round starts from (shared by all clients a worker trains)."""

    round: int
    seed: int
    lr: float
    global_state: State
    server: dict[str, Any]
    copies: dict[str, DeviceServer] = field(default_factory=dict, init=False, repr=False, compare=False)
    """``server`` on each device this process trains the round on (:meth:`server_on`)."""

    def server_on(self, device: torch.device) -> DeviceServer:
        """``server``'s arrays as tensors on ``device``, copied once per round and process."""
        return self.copies.setdefault(str(device), DeviceServer(self.server, device))

    def __getstate__(self) -> dict[str, Any]:
        """Ray ships a round without its device copies: they stay in the process that made them."""
        return {**self.__dict__, "copies": {}}


def load_state(model: nn.Module, state: State) -> None:
    """Copy numpy weights into the model (arrays from Ray's object store are read-only), one copy per dtype."""
    model.load_state_dict(state_on_device(state, next(iter(model.state_dict().values())).device))


class DeviceServer(Mapping[str, Any]):
    """A round's server payload as tensors on one device, each entry copied at its first read and kept for
    every client the worker trains (a copy from pageable memory waits for the GPU). Shared: read only."""

    def __init__(self, server: dict[str, Any], device: torch.device) -> None:
        self.server, self.device = server, device
        self.copied: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self.copied:
            value = self.server[key]
            arrays = value if isinstance(value, dict) else {key: value}
            tensors = dict(zip(arrays, to_device(list(arrays.values()), self.device)))
            self.copied[key] = tensors if isinstance(value, dict) else tensors[key]
        return self.copied[key]

    def __contains__(self, key: object) -> bool:
        return key in self.server  # no copy

    def __iter__(self) -> Iterator[str]:
        return iter(self.server)

    def __len__(self) -> int:
        return len(self.server)


def state_on_device(state: State, device: torch.device) -> dict[str, torch.Tensor]:
    """``state`` on ``device`` in one copy per dtype; of the global weights, ``ClientContext.global_state``."""
    return dict(zip(state, to_device(list(state.values()), device)))


def device_states(
    states: Sequence[State], device: torch.device, host_global: State, device_global: dict[str, torch.Tensor],
) -> list[dict[str, torch.Tensor]]:
    """Each of ``states`` as tensors on ``device``: an entry that is the very array of ``host_global`` is its
    twin in ``device_global``; every other distinct array goes over in one copy with the rest."""
    others: dict[int, np.ndarray] = {}
    for state in states:
        others.update((id(v), v) for k, v in state.items() if host_global.get(k) is not v)
    moved = dict(zip(others, to_device(list(others.values()), device)))
    return [
        {k: device_global[k] if host_global.get(k) is v else moved[id(v)] for k, v in state.items()}
        for state in states
    ]


def load_changed(model: nn.Module, state: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> None:
    """Load the entries of ``state`` that are not the tensors loaded last (``loaded``, updated), provided
    nothing else writes the model: clients evaluated in turn share the global weights."""
    changed = {k: v for k, v in state.items() if loaded.get(k) is not v}
    if changed:
        model.load_state_dict(changed, strict=len(changed) == len(state))
    loaded.update(state)

