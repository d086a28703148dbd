"""Shared by the engine's tests: counting the aten ops a piece of the engine dispatches, and its scalar reads."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """The aten ops run under it (after vmap's batching rules: what reaches the kernels, on a GPU about one
    launch each), in ``count``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def counts(self, func: Any) -> bool:
        """Whether ``func`` is one of the ops counted: all of them."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += self.counts(func)
        return func(*args, **(kwargs or {}))


class ScalarReads(OpCount):
    """How many scalars were read from a tensor under it (``float``, ``int``, ``.item()``: each a host sync on
    a GPU), in ``count``. ``tolist`` dispatches no op, so a whole-tensor read is not counted."""

    def counts(self, func: Any) -> bool:
        return func is torch.ops.aten._local_scalar_dense.default
