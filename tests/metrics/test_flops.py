"""TrainingFlops keeps the forward passes of a training step apart from its backward (FedAlign Table 5), and
counts without loading torch's compiler stack."""

import subprocess
import sys

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


METERED_STEP = """
import sys
import torch
from fltune.engine.local import KeptSGD
from fltune.config import TrainingConfig
from fltune.metrics._flops import TrainingFlops
from fltune.metrics.cost import forward_flops_per_sample
from fltune.models import build_model
model = build_model("fedavg_cnn", (1, 28, 28), 10)
optimizer = KeptSGD(list(model.parameters()), TrainingConfig(), 0.01)
with TrainingFlops() as meter:
    torch.nn.functional.cross_entropy(model(torch.randn(4, 1, 28, 28)), torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()
print(meter.forward_flops > 0, forward_flops_per_sample(model, (1, 28, 28)) > 0, "torch._dynamo" in sys.modules)
"""


def test_metering_a_training_step_and_counting_the_model_load_no_compiler_stack() -> None:
    """A metered exact-path step (KeptSGD) and the model's count leave ``torch._dynamo`` unloaded: torch wraps
    a dispatch mode's ``__torch_dispatch__`` in a dynamo-disabling wrapper that imports it (~0.9 s and
    ~150 MiB a process keeps), which ``TrainingFlops._should_skip_dynamo`` turns off. In a fresh interpreter,
    since this one may hold the compiler stack already."""
    out = subprocess.run([sys.executable, "-c", METERED_STEP], capture_output=True, text=True, check=True).stdout
    assert out.split()[-3:] == ["True", "True", "False"]
