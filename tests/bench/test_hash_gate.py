"""bench/hash_gate.py: the gate finds the recorded bits on unchanged code, and other bits when the run changes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import needs_fmnist

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import hash_gate  # noqa: E402


@needs_fmnist
@pytest.mark.skipif(torch.cuda.is_available(), reason="the record holds CPU bits; this process evaluates on CUDA")
def test_gate_finds_the_record_and_a_changed_seed_differs(ray_session) -> None:
    """FedAvg and Ditto (whose personal models are hashed as client state) on the record's seed match it in
    every part where the record's CPU model is this one (torch's CPU kernels differ between models); on
    another seed every part but Ditto's empty server state differs, so the gate can fail."""
    record = json.loads(hash_gate.RECORD.read_text())
    found, _ = hash_gate.run_gate(["fedavg", "ditto"])
    if record["cpu"] == hash_gate.processor():
        assert hash_gate.compare(found, record["methods"]) == {"fedavg": "identical", "ditto": "identical"}
    other, _ = hash_gate.run_gate(["ditto"], seed=1)
    assert hash_gate.compare(other, found) == {"ditto": "DIFFERS (global, clients, metrics)"}


@pytest.mark.parametrize(("argv", "line"), [
    (["--only", "fedavg,nope"], "--only: nope is not a gate method; allowed: a comma-separated list of ditto,"),
    (["--record", "--only", "fedavg"], "--record: writes all 38 methods' hashes on one commit; allowed without"),
    (["--workers", "-1"], "--workers: -1; allowed: 0 (this process) or a positive count"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything runs: one line naming the flag and what it allows."""
    assert len(hash_gate.gate_methods()) == 38
    assert hash_gate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hash_gate: {line}") and "\n" not in err
