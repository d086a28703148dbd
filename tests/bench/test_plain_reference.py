"""bench/plain_reference.py: the whole-command bench's reference shares nothing with fltune but its work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from fltune.models.registry import build_model
from tests.conftest import needs_fmnist

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import plain_reference  # noqa: E402


def test_reference_cnn_is_fltunes_fedavg_cnn() -> None:
    """Equal work: fltune's FedAvg CNN's weights, loaded into the reference's CNN in order, give the very
    same function (same layers, shapes and order)."""
    ours = build_model("fedavg_cnn", (1, 28, 28), 10)
    ref = plain_reference.cnn()
    assert [tuple(v.shape) for v in ours.state_dict().values()] == [tuple(v.shape) for v in ref.state_dict().values()]
    ref.load_state_dict(dict(zip(ref.state_dict(), ours.state_dict().values())))
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(ref(x), ours(x), rtol=0, atol=0)


@needs_fmnist
def test_reference_process_loads_no_fltune_module() -> None:
    """Run as its own process (as the bench runs it), at one client for one round: it prints its phase
    lines and says that no module of fltune was loaded."""
    done = subprocess.run([sys.executable, str(BENCH / "plain_reference.py"), "--rounds", "1", "--per-round", "1"],
                          capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[:3] == ["imported", "data", "model"]
    assert lines[3].startswith("round 1/1 acc_global=")
    assert lines[-1] == "independent True"


def test_reference_refuses_bad_input_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "plain_reference.py"), "--per-round", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "--per-round 1..100" in done.stderr
