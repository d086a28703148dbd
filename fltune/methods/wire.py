"""Weights on the wire: model states between torch tensors on a device and numpy arrays (Ray's object
store, the client store), one copy per dtype each way."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

State = dict[str, np.ndarray]
"""Model weights on the wire: state_dict names → numpy arrays (what one ``ray.put`` ships)."""


def dtype_groups(dtypes: Iterable[Any]) -> list[list[int]]:
    """Positions of equal dtypes in order of first appearance: what one host-device copy can move."""
    groups: dict[Any, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        groups.setdefault(dtype, []).append(i)
    return list(groups.values())


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors on ``device`` (views of one buffer per dtype), one copy per dtype, as each copy
    from pageable memory waits for the GPU's queue."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(arrays)
    for rows in dtype_groups(array.dtype for array in arrays):
        flat = torch.from_numpy(np.concatenate([arrays[i].reshape(-1) for i in rows])).to(device)
        for i, part in zip(rows, flat.split([arrays[i].size for i in rows])):
            out[i] = part.view(arrays[i].shape)
    return out


def to_numpy(state: dict[str, torch.Tensor], keys: set[str] | None = None) -> State:
    """A (sub)state_dict as CPU numpy, one copy per dtype; each array owns its bytes, so a client store keeps
    no other tensor's alive."""
    tensors = [(k, v.detach()) for k, v in state.items() if keys is None or k in keys]
    out: State = {}
    for rows in dtype_groups(v.dtype for _, v in tensors):
        flat = torch.cat([tensors[i][1].reshape(-1) for i in rows]).cpu().numpy()
        for i, part in zip(rows, np.split(flat, np.cumsum([tensors[i][1].numel() for i in rows])[:-1])):
            out[tensors[i][0]] = part.reshape(tensors[i][1].shape).copy()
    return {k: out[k] for k, _ in tensors}

