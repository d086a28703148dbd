"""Compute and communication cost of a federated run (FedAlign Table 5 and appendix Table 8): FedAlign's claim is
accuracy *per unit of client resources*. Only the FLOP counters import torch, on the workers (``worker.skip_triton``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from fltune.engine.probes import ClientMeter, Probe, RoundView, RunView
from fltune.metrics.probe import register

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData


def training_flops() -> ClientMeter:
    """A fresh ``TrainingFlops`` meter (metrics/_flops.py), imported here, on the worker that opens it."""
    from fltune.metrics._flops import TrainingFlops

    return TrainingFlops()


FORWARD_BACKWARD_FACTOR = 3.0
"""Training FLOPs per sample = 3 × forward: backward costs about two forwards, activations and weights
(Kaplan et al. 2020)."""


def forward_flops_per_sample(model: nn.Module, input_shape: tuple[int, ...]) -> float:
    """Forward MFLOPs for one sample of shape ``input_shape`` (no batch dim), as FedAlign Table 5 lists.
    ``FlopCounterMode``'s formulas: 2 FLOPs per multiply-accumulate, element-wise ops ignored (MAC-based tools such as
    thop show about half)."""
    import torch

    from fltune.metrics._flops import TrainingFlops
    from fltune.metrics._hessian import eval_mode

    parameter = next(model.parameters())
    sample = torch.zeros((1, *input_shape), dtype=parameter.dtype, device=parameter.device)
    counter = TrainingFlops()
    with torch.no_grad(), eval_mode(model), counter:
        model(sample)
    return counter.get_total_flops() / 1e6


def parameter_count(model: nn.Module) -> int:
    """All parameters (trainable or not), FedAlign Table 5's "Param" of one model."""
    return sum(p.numel() for p in model.parameters())


def state_bits(state: Mapping[str, Any]) -> int:
    """Bits to send ``state`` (numpy arrays or tensors) at each entry's real dtype (FedAlign Table 8: 32 per
    float32 parameter)."""
    return 8 * sum(int(value.nbytes) for value in state.values())


class CostMeter:
    """Per-round and cumulative cost of a run (keys: :class:`CostProbe`'s ``metrics``). ``cost_cum_tflops`` = Σ samples
    × passes × :data:`FORWARD_BACKWARD_FACTOR` × forward FLOPs. FedAlign Table 8's "MFLOPs" is Table 5's per-sample
    forward × rounds (``cost_cum_forward_mflops``, from the training forward counted in round 1); its "Comm Cost (Gb)"
    is ``cost_cum_up_gbit``."""

    _rounds = 0
    """Rounds started (a class default, so meters pickled before this counter existed still load)."""
    _train_forward = 0.0
    """Measured training forward FLOPs per sample; 0 = not yet (also a class default, for old pickles)."""

    def __init__(self, forward_mflops_per_sample: float, clock: Callable[[], float] = perf_counter) -> None:
        self._flops_per_sample = forward_mflops_per_sample * 1e6
        self._clock = clock
        self._round_start = clock()
        self._flops = 0.0
        self._up_bits = self._down_bits = 0
        self._round_up_bits = self._round_down_bits = 0

    def start_round(self) -> None:
        """Start the round's clock and zero its up/down counters."""
        self._round_start = self._clock()
        self._round_up_bits = self._round_down_bits = 0
        self._rounds += 1

    def add_training(self, samples: int, passes: float = 1.0) -> None:
        """``samples`` trained on by one client; ``passes`` forward+backward passes each (2 for SAM-type)."""
        self._flops += samples * passes * FORWARD_BACKWARD_FACTOR * self._flops_per_sample

    def set_model_forward(self, mflops_per_sample: float) -> None:
        """The model's forward MFLOPs per sample, when it was not known at construction (``CostProbe``)."""
        self._flops_per_sample = mflops_per_sample * 1e6

    def set_training_forward(self, mflops_per_sample: float) -> None:
        """The method's forward MFLOPs per training sample, counted on its real training (metrics/_flops.py)."""
        self._train_forward = mflops_per_sample * 1e6

    def add_download(self, bits: int, clients: int = 1) -> None:
        """A broadcast of ``bits`` to each of ``clients`` clients."""
        self._round_down_bits += bits * clients
        self._down_bits += bits * clients

    def add_upload(self, bits: int) -> None:
        """One client's upload of ``bits``."""
        self._round_up_bits += bits
        self._up_bits += bits

    def round_metrics(self) -> dict[str, float]:
        """The current round's and the cumulative figures (keys in the class docstring)."""
        forward = self._train_forward or self._flops_per_sample
        return {
            "cost_round_s": self._clock() - self._round_start,
            "cost_cum_tflops": self._flops / 1e12,
            "cost_cum_comm_gbit": (self._up_bits + self._down_bits) / 1e9,
            "cost_cum_up_gbit": self._up_bits / 1e9,
            "cost_up_mbit_round": self._round_up_bits / 1e6,
            "cost_down_mbit_round": self._round_down_bits / 1e6,
            "cost_train_forward_mflops": forward / 1e6,
            "cost_cum_forward_mflops": self._rounds * forward / 1e6,
        }


def model_flops(cfg: ExperimentConfig, data: FederatedData, device: torch.device) -> float:
    """A ``ProbeTask``: :func:`forward_flops_per_sample` of the run's model, on the worker it runs on."""
    from fltune.engine.builders import build_model_for

    return forward_flops_per_sample(build_model_for(cfg, data).to(device), data.input_shape)


@register
class CostProbe(Probe):
    """Feeds a :class:`CostMeter` every round (diverged ones included); FedAlign Table 5's constants once."""

    name = "cost"
    order = 0
    metrics = {
        "cost_round_s": "wall seconds of the round (FedAlign Table 5 \"Time\")",
        "cost_cum_tflops": "training TFLOPs of all clients so far",
        "cost_cum_comm_gbit": "Gbit sent so far, both directions",
        "cost_cum_up_gbit": "Gbit uploaded so far (FedAlign Table 8 \"Comm Cost\")",
        "cost_up_mbit_round": "Mbit uploaded in the round",
        "cost_down_mbit_round": "Mbit downloaded in the round",
        "cost_train_forward_mflops": "forward MFLOPs the method spends per training sample (FedAlign Table 5)",
        "cost_cum_forward_mflops": "that figure times the rounds so far (FedAlign Table 8 \"MFLOPs\")",
    }
    constants = {
        "cost_forward_mflops": "the model's forward MFLOPs per sample",
        "cost_params": "parameters of one model",
        "cost_stored_params": "parameters a client stores (the method's models × the model's)",
    }

    def __init__(self, run: RunView) -> None:
        self.forward_mflops: float | None = None
        self.meter = CostMeter(0.0)  # the model's forward figure arrives with the first measure

    def model_mflops(self, run: RunView) -> float:
        """The model's forward MFLOPs per sample, counted once on a client worker (:func:`model_flops`)."""
        if self.forward_mflops is None:
            self.forward_mflops = run.compute([model_flops])[0]
            self.meter.set_model_forward(self.forward_mflops)
        return self.forward_mflops

    @classmethod
    def client_meter(cls, round_: int) -> Callable[[], ClientMeter] | None:
        """Round 1's training FLOPs over the method's real passes (MOON's three models, GradAug's nets)."""
        return training_flops if round_ == 1 else None

    def start_round(self) -> None:
        self.meter.start_round()

    def due(self, view: RoundView) -> bool:
        return True

    def measure(self, view: RoundView) -> dict[str, float]:
        """Communication and compute of the round (FedAlign Tables 5 and 8)."""
        inputs = view.inputs
        self.model_mflops(view.run)
        self.meter.add_download(state_bits(inputs.global_state) + state_bits(_arrays(inputs.server)), len(view.clients))
        for m in view.client_metrics.values():
            self.meter.add_training(int(m["samples"]), getattr(view.run.method, "passes_per_step", 0.0))
            self.meter.add_upload(view.upload_bits)
        forward = [m["forward_flops"] for m in view.client_metrics.values() if "forward_flops" in m]
        if forward:  # round 1 only
            samples = sum(m["samples"] for m in view.client_metrics.values())
            self.meter.set_training_forward(math.fsum(forward) / 1e6 / max(samples, 1.0))
        return _declared(self.meter.round_metrics(), view.run.method)

    def summary(self, run: RunView) -> dict[str, Any]:
        """The run's totals: the last round's cumulative figures."""
        last = run.history[-1] if run.history else {}
        return {k: v for k, v in last.items() if k.startswith("cost_cum")}

    def run_constants(self, run: RunView) -> dict[str, float]:
        params = parameter_count(run.model)
        return _declared({"cost_forward_mflops": self.model_mflops(run), "cost_params": float(params),
                          "cost_stored_params": params * getattr(run.method, "stored_models", 0.0)}, run.method)

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        """Every built-in declares both (tests/methods/test_cost_declarations.py): only a user's method, whose
        file imports torch anyway, is imported to look."""
        from fltune.catalog import method_names

        if cfg.method.name.split("+")[0] in method_names():
            return None
        from fltune.methods import get_method

        method, need = get_method(cfg.method.name), NEEDS.get(metric, "name")
        return None if hasattr(method, need) else f"{method.__name__} declares no {need}"

    @classmethod
    def omitted(cls, cfg: ExperimentConfig) -> list[str]:
        whys = {metric: why for metric in NEEDS if (why := cls.unmet(metric, cfg))}
        return [f"cost/{', '.join(whys)}: {'; '.join(whys.values())}"] if whys else []

    def state_dict(self) -> CostMeter:
        return self.meter

    def load_state_dict(self, state: CostMeter) -> None:
        self.meter = state


NEEDS = {"cost_cum_tflops": "passes_per_step", "cost_stored_params": "stored_models"}
"""The figures resting on a method's optional cost declaration: left out without it, never a silent 1."""


def _declared(figures: dict[str, float], method: object) -> dict[str, float]:
    """``figures`` less those resting on a declaration ``method`` lacks (:data:`NEEDS`)."""
    return {k: v for k, v in figures.items() if hasattr(method, NEEDS.get(k, "name"))}


def _arrays(tree: Any) -> dict[str, np.ndarray]:
    """The numpy arrays inside a server payload (for communication cost), keyed by path."""
    if isinstance(tree, np.ndarray):
        return {"": tree}
    if isinstance(tree, dict):
        return {f"{k}/{p}": a for k, v in tree.items() for p, a in _arrays(v).items()}
    return {}
