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
    """Positions of equal dtypes, in order of first appearance: what one copy between host and device can
    carry at once (``to_numpy``, ``to_device``)."""
    groups: dict[Any, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        groups.setdefault(dtype, []).append(i)
    return list(groups.values())


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors on ``device`` (views of one buffer per dtype), in one copy per dtype: each copy
    from pageable host memory waits for everything the GPU has queued. Copies change no bits."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(arrays)
    for rows in dtype_groups(array.dtype for array in arrays):
        flat = torch.from_numpy(np.concatenate([arrays[i].reshape(-1) for i in rows])).to(device)
        for i, part in zip(rows, flat.split([arrays[i].size for i in rows])):
            out[i] = part.view(arrays[i].shape)
    return out


def to_numpy(state: dict[str, torch.Tensor], keys: set[str] | None = None) -> State:
    """Detach a (sub)state_dict to CPU numpy for the wire or the client store, in one copy per dtype (each
    copy waits for the GPU). Each array is a copy of its part of the buffer, so a client store keeps no
    other tensor's bytes alive."""
    tensors = [(k, v.detach()) for k, v in state.items() if keys is None or k in keys]
    out: State = {}
    for rows in dtype_groups(v.dtype for _, v in tensors):
        flat = torch.cat([tensors[i][1].reshape(-1) for i in rows]).cpu().numpy()
        for i, part in zip(rows, np.split(flat, np.cumsum([tensors[i][1].numel() for i in rows])[:-1])):
            out[tensors[i][0]] = part.reshape(tensors[i][1].shape).copy()
    return {k: out[k] for k, _ in tensors}

