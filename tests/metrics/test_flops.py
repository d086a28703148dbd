"""TrainingFlops keeps the forward passes of a training step apart from its backward (FedAlign Table 5)."""

import torch
from torch import nn

from fltune.metrics._flops import TrainingFlops


def test_forward_passes_are_counted_apart_from_backward() -> None:
    """Linear(8, 4) on a batch of 5 (inputs need no gradient): a forward is 2·5·8·4 = 320 FLOPs, its backward
    the weight gradient, 320 more. The student runs twice, a frozen teacher (as MOON's and FedNTD's models)
    once: 3 × 320 forward, 2 × 320 backward — the teacher adds no backward FLOPs."""
    torch.manual_seed(0)
    student, teacher = nn.Linear(8, 4), nn.Linear(8, 4).requires_grad_(False)
    x = torch.randn(5, 8)
    counter = TrainingFlops()
    with counter:
        loss = student(x).square().mean() + (student(x) - teacher(x)).square().mean()
        loss.backward()
    assert counter.forward_flops == 3 * 320
    assert counter.get_total_flops() == 3 * 320 + 2 * 320


def test_a_no_grad_pass_is_all_forward() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    counter = TrainingFlops()
    with counter, torch.no_grad():
        model(torch.zeros(1, 1, 6, 6))
    conv = 2 * (2 * 4 * 4) * (1 * 3 * 3)  # 2 FLOPs × outputs × multiply-adds per output
    assert counter.forward_flops == counter.get_total_flops() == conv + 2 * 32 * 3
