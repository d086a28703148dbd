"""FLOPs of the training process as FedAlign Table 5 counts them: the forward passes a method makes per
training sample (MOON's three models, GradAug's sub-networks, StochDepth's skipped blocks, FedAlign's
reduced-width last stage), apart from the backward passes.

Counted, not declared: :class:`TrainingFlops` is ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per
multiply-add of every matmul and convolution) that also keeps the ops run outside autograd's backward
apart. The engine wraps the first round's local training in it, on the workers, so the figure is the
real training's, averaged over every sampled client's batches — an expectation for the stochastic methods.
Counting slows that one round's training by ~1.2× (FedAvg CNN, 1 CPU thread: 1.46 s → 1.72 s for 30
steps of 32); later rounds run uncounted.
"""

from __future__ import annotations

from typing import Any

from torch.utils.flop_counter import FlopCounterMode


class TrainingFlops(FlopCounterMode):
    """``get_total_flops()``: forward and backward; ``forward_flops``: the forward passes alone.

    ``_count_flops`` is FlopCounterMode's per-op hook and ``mod_tracker.is_bw`` its documented flag for
    "running in backward" (``torch._C._current_graph_task_id() != -1``, exact for ops of a backward).
    """

    def __init__(self) -> None:
        super().__init__(display=False)
        self.forward_flops = 0

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if func_packet in self.flop_registry and not self.mod_tracker.is_bw:
            self.forward_flops += self.flop_registry[func_packet](*args, **kwargs, out_val=out)
        return super()._count_flops(func_packet, out, args, kwargs)

    def client_metrics(self) -> dict[str, float]:
        """As a worker-side meter (``Probe.client_meter``): the forward FLOPs of the client's training."""
        return {"forward_flops": float(self.forward_flops)}
