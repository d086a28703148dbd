"""A real ``mlflow server`` on loopback, as docs/cluster.md recommends for a team: started, stopped and started
again on the same port and database by a test, so tracking meets a server that goes away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fltune.tracking import backlog
from tests.tune.test_cluster import free_port


class TrackingServer:
    """``mlflow server`` over a sqlite file in ``folder``, in its own process group (its workers go with it)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.proc: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> None:
        """Start it and wait until ``/health`` answers (a new database's schema takes a few seconds)."""
        log = self.folder / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}",
             "--artifacts-destination", str(self.folder / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            cwd=self.folder, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                assert self.proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not answer"
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop it and every process it started; its port refuses connections afterwards."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture()
def fresh_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's tracking clients and backlog folder as a new command starts with them (and MLflow's HTTP
    limits as ``backlog.keeping`` sets them, put back after the test)."""
    for key, value in backlog.HTTP_LIMITS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(backlog, "_clients", {})
    monkeypatch.setattr(backlog, "_folder", [])


@pytest.fixture()
def mlflow_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_backlog: None) -> Iterator[TrackingServer]:
    """A running tracking server, exported as ``MLFLOW_TRACKING_URI`` (subprocesses too), stopped at the end."""
    server = TrackingServer(tmp_path / "server")
    server.start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    yield server
    server.stop()
