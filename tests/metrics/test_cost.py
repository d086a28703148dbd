"""Cost accounting (FedAlign Tables 5 and 8): FLOPs, parameters, bits, and the per-round meter."""

import numpy as np
import pytest
import torch
from torch import nn

from fltune.metrics.cost import CostMeter, forward_flops_per_sample, parameter_count, state_bits


def test_linear_flops_are_two_per_multiply_accumulate() -> None:
    """Linear(100, 10): 100·10 multiply-accumulates = 2000 FLOPs = 0.002 MFLOPs (bias add not counted)."""
    assert forward_flops_per_sample(nn.Linear(100, 10), (100,)) == pytest.approx(2 * 100 * 10 / 1e6)


def test_conv_flops_and_model_left_as_it_was() -> None:
    """Conv2d(1, 4, 3) on 1×8×8 gives 4×6×6 outputs of 9 MACs each: 2·4·36·9 = 2592 FLOPs; the tanh and
    the flatten add none, the Linear(144, 2) adds 2·144·2 = 576."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.Flatten(), nn.Dropout(), nn.Linear(144, 2))
    model.train()
    assert forward_flops_per_sample(model, (1, 8, 8)) == pytest.approx((2592 + 576) / 1e6)
    assert model.training and all(p.grad is None for p in model.parameters())


def test_parameter_count_counts_every_parameter() -> None:
    model = nn.Sequential(nn.Linear(100, 10), nn.BatchNorm1d(10))
    model[1].requires_grad_(False)
    assert parameter_count(model) == 100 * 10 + 10 + 2 * 10


def test_state_bits_use_each_entry_dtype() -> None:
    """12 float32 (384) + 5 float16 (80) + one int64 (64) = 528 bits."""
    state = {
        "w": np.zeros((3, 4), dtype=np.float32),
        "h": torch.zeros(5, dtype=torch.float16),
        "num_batches_tracked": torch.tensor(7),
    }
    assert state_bits(state) == 528


def test_meter_accumulates_rounds() -> None:
    """Forward 2 MFLOPs/sample. Round 1: a 1 Mbit broadcast to 4 clients, each trains 100 samples and
    uploads 1 Mbit → 4·100·3·2e6 = 2.4e9 FLOPs, 4 Mbit down, 4 Mbit up. Round 2: 2 clients, one of them
    SAM-type (2 passes) on 50 samples, uploads of 0.5 Mbit → +3·2e6·(50 + 2·50) = 0.9e9 FLOPs."""
    times = iter([0.0, 10.0, 12.5, 20.0, 21.0])
    meter = CostMeter(forward_mflops_per_sample=2.0, clock=lambda: next(times))

    meter.start_round()
    meter.add_download(1_000_000, clients=4)
    for _ in range(4):
        meter.add_training(100)
        meter.add_upload(1_000_000)
    assert meter.round_metrics() == pytest.approx({
        "cost_round_s": 2.5,
        "cost_cum_tflops": 2.4e-3,
        "cost_cum_comm_gbit": 8e-3,
        "cost_cum_up_gbit": 4e-3,
        "cost_up_mbit_round": 4.0,
        "cost_down_mbit_round": 4.0,
        "cost_train_forward_mflops": 2.0,  # the model's forward until the workers' count arrives
        "cost_cum_forward_mflops": 2.0,
    })

    meter.set_training_forward(6.0)  # e.g. MOON: three models' forward passes per training sample
    meter.start_round()
    meter.add_download(1_000_000, clients=2)
    meter.add_training(50)
    meter.add_training(50, passes=2)
    meter.add_upload(500_000)
    meter.add_upload(500_000)
    assert meter.round_metrics() == pytest.approx({
        "cost_round_s": 1.0,
        "cost_cum_tflops": 3.3e-3,
        "cost_cum_comm_gbit": 11e-3,
        "cost_cum_up_gbit": 5e-3,
        "cost_up_mbit_round": 1.0,
        "cost_down_mbit_round": 2.0,
        "cost_train_forward_mflops": 6.0,
        "cost_cum_forward_mflops": 12.0,  # FedAlign Table 8's "MFLOPs": training forward per sample × rounds
    })
