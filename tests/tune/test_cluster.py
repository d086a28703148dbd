"""A study on a real two-node Ray cluster on this machine: trials are placed on both nodes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.tune import ExperimentAnalysis

from tests.tune.helpers import start, study_runs, tune_command, write_space

ISOLATED = {"RAY_AUTH_MODE": "disabled"}
"""Loopback-only test nodes; no token, so other Ray users' ~/.ray/auth_token cannot interfere."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_node(args: list[str], log: Path) -> subprocess.Popen:
    node = start(["ray", "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--block",
                  "--object-store-memory=200000000", "--disable-usage-stats", *args], log, **ISOLATED)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        assert node.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)
    return node


def stop_node(node: subprocess.Popen) -> None:
    """SIGTERM the node's own process group (never a global `ray stop`), SIGKILL what lingers."""
    for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(node.pid, sig)
            node.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture()
def two_nodes(tmp_path: Path) -> Iterator[str]:
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    address = f"127.0.0.1:{free_port()}"
    nodes = [start_node(["--head", f"--port={address.split(':')[1]}", f"--temp-dir={temp}",
                         "--include-dashboard=false"], tmp_path / "head.log")]
    try:
        nodes.append(start_node([f"--address={address}"], tmp_path / "worker.log"))
        yield address
    finally:
        for node in reversed(nodes):
            stop_node(node)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.extended
def test_study_on_two_nodes_uses_both(two_nodes: str, tmp_path: Path, mlflow_uri: str) -> None:
    space = write_space(tmp_path, num_samples=2, max_concurrent=2)
    driver = start(tune_command(space, tmp_path, "--set", "federation.rounds=1"), tmp_path / "tune.log",
                   RAY_ADDRESS=two_nodes, **ISOLATED)
    assert driver.wait(timeout=300) == 0, (tmp_path / "tune.log").read_text()
    trials = ExperimentAnalysis(str(tmp_path / "study")).trials
    placed = [t.last_result["worker_nodes"] for t in trials]
    assert len(placed) == 2 and len(set(placed)) == 2, placed  # one 1-CPU trial per 1-CPU node
    _, children = study_runs(mlflow_uri)
    assert {c.data.tags["fltune.worker_nodes"] for c in children} == set(placed)
