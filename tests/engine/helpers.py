"""Shared by the engine's tests: counting the aten ops a piece of the engine dispatches."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """The aten ops run under it (after vmap's batching rules: what reaches the kernels, on a GPU about one
    launch each), in ``count``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))
