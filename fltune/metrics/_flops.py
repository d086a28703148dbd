"""FLOPs of the training process as FedAlign Table 5 counts them: the forward passes a method makes per
training sample (MOON's three models, GradAug's sub-networks, StochDepth's skipped blocks, FedAlign's
reduced-width last stage), apart from the backward passes.

Counted, not declared: :class:`TrainingFlops` counts what ``torch.utils.flop_counter.FlopCounterMode``
counts (its formulas: 2 FLOPs per multiply-add of every matmul and convolution) and keeps the ops run
inside autograd's backward apart. The engine wraps the first round's local training in it, on the workers,
so the figure is the real training's, averaged over every sampled client's batches — an expectation for the
stochastic methods. Later rounds run uncounted.

Counting loads no part of torch's compiler stack (:meth:`TrainingFlops._should_skip_dynamo`), so any training
process may meter, the driver's share of a local ``run`` included (engine/pool.py).
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
    """Whether the op overload has a composite decomposition, i.e. ``func.decompose`` would run something
    rather than return NotImplemented; asked once per op."""
    return _COMPOSITE in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)


class TrainingFlops(TorchDispatchMode):
    """``get_total_flops()``: forward and backward; ``forward_flops``: the forward passes alone.

    The count is ``FlopCounterMode``'s, op for op (its registry's formulas; an op with a composite
    decomposition counted as that decomposition), so the training's numbers stay the same too. It leaves
    out the per-module attribution, whose module hooks slow the metered round (``bench/flop_meter.py``).
    "Running in backward" is autograd's own flag, ``torch._C._current_graph_task_id() != -1``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.forward_flops = 0
        self.total_flops = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: ``__torch_dispatch__`` stays as written, not wrapped in ``torch._disable_dynamo``, the wrapper
        torch puts around a mode's dispatch by default (this classmethod is torch's switch for it). That wrapper
        imports ``torch._dynamo``, held for the process's life, and matters only when ``torch.compile`` traces
        code under the mode; a metered round trains client by client on the exact path, never compiled."""
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
