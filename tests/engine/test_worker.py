"""``engine.worker.skip_triton``: a process that sees no GPU imports torch's compiler stack and counts FLOPs
without Triton, with the same counts and without the counter's note about Triton kernels."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

COUNT = """
import json, sys
import torch
if {skip}:
    from fltune.engine.worker import skip_triton
    skip_triton()
import torch._dynamo
from fltune.metrics._flops import TrainingFlops
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 26 * 26, 10))
with TrainingFlops() as flops:
    model(torch.randn(8, 1, 28, 28)).sum().backward()
print(json.dumps([flops.get_total_flops(), flops.forward_flops, sys.modules.get("triton") is not None]))
"""


def count(skip: bool) -> tuple[list, str]:
    """(total FLOPs, forward FLOPs, Triton loaded) of one training step, and what the process wrote to stderr:
    in a fresh interpreter, since this one may hold Triton already."""
    proc = subprocess.run([sys.executable, "-c", COUNT.format(skip=skip)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="skip_triton is for processes that see no GPU")
def test_flops_counted_without_triton_are_the_same_and_the_counter_stays_quiet():
    pytest.importorskip("triton")  # torch's CUDA build: Triton is installed, and the compiler stack imports it
    (total, forward, loaded), _ = count(skip=False)
    (total_skipped, forward_skipped, loaded_skipped), err = count(skip=True)
    assert loaded and not loaded_skipped
    assert (total_skipped, forward_skipped) == (total, forward) > (0, 0)
    assert "triton" not in err.lower()
