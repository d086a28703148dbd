"""TrainingFlops keeps the forward passes of a training step apart from its backward (FedAlign Table 5)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fltune.metrics._flops import TrainingFlops
from fltune.models import build_model


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


@pytest.mark.parametrize("model_name", ["fedavg_cnn", "vib_cnn"])
def test_the_count_is_flopcountermodes_and_the_training_the_same(model_name: str) -> None:
    """TrainingFlops counts what torch's FlopCounterMode counts (its formulas, its decompositions) over a
    training step of fltune's models, without its module tracking; the step's weights are the same bits."""
    def step(meter):
        torch.manual_seed(0)
        model = build_model(model_name, (1, 28, 28), 10)
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        with meter:
            torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
            F.cross_entropy(model(x), y).backward()
            torch.optim.SGD(model.parameters(), lr=0.1).step()
        return model.state_dict()

    ours, torchs = TrainingFlops(), FlopCounterMode(display=False)
    a, b = step(ours), step(torchs)
    assert ours.get_total_flops() == torchs.get_total_flops() > ours.forward_flops > 0
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_op_that_reaches_the_meter_whole_is_counted_through_its_decomposition() -> None:
    """Under inference mode ``F.linear`` reaches the meter as ``aten.linear``, which has no formula: as torch's
    FlopCounterMode does, the meter runs its decomposition and counts the matmul inside (2·5·8·4)."""
    layer = nn.Linear(8, 4)
    counter = TrainingFlops()
    with torch.inference_mode(), counter:
        layer(torch.randn(5, 8))
    assert counter.get_total_flops() == counter.forward_flops == 320
