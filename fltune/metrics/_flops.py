"""Training FLOPs as FedAlign Table 5 counts them: the forward passes a method makes per training sample (MOON's three
models, GradAug's sub-networks), counted on round 1's real local training, not declared.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


@cache
def _has_decomposition(func: Any) -> bool:
    """Whether ``func.decompose`` would run a composite decomposition; asked once per op."""
    return _COMPOSITE in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)


class TrainingFlops(TorchDispatchMode):
    """``get_total_flops()``: forward and backward; ``forward_flops``: the forward passes alone. ``FlopCounterMode``'s
    count op for op (composite ops as their decomposition), without its per-module attribution, whose hooks slow the
    metered round. "In backward" is ``torch._C._current_graph_task_id() != -1``."""

    def __init__(self) -> None:
        super().__init__()
        self.forward_flops = 0
        self.total_flops = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: no ``torch._disable_dynamo`` wrapper around ``__torch_dispatch__`` (it imports ``torch._dynamo`` for
        the process's life, and matters only under ``torch.compile``, which a metered round never uses)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.ops.prim.device.default and _has_decomposition(func):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            flops = formula(*args, **kwargs, out_val=out)
            self.total_flops += flops
            if torch._C._current_graph_task_id() == -1:
                self.forward_flops += flops
        return out

    def get_total_flops(self) -> int:
        """Every counted FLOP, forward and backward (``FlopCounterMode.get_total_flops``)."""
        return self.total_flops

    def client_metrics(self) -> dict[str, float]:
        """As a worker-side meter (``Probe.client_meter``): the forward FLOPs of the client's training."""
        return {"forward_flops": float(self.forward_flops)}
