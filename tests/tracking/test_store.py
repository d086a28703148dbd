"""The MLflow store under concurrent commands: real processes, real Ray, real sqlite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient

from fltune.tracking.mlflow_log import RetryingClient, open_store
from tests.tune.test_cluster import ISOLATED, free_port, start_node, stop_node

REPO = Path(__file__).resolve().parents[2]
TINY = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "--clients", "4", "--fraction", "1",
        "--rounds", "2", "--local-epochs", "1", "--workers", "1", "--set", "resources.cpus_per_worker=0.25"]


def _start_runs(uri: str, seeds: range, address: str) -> list[subprocess.Popen]:
    """``python cli.py run`` once per seed, all at once, joining one Ray node (several Ray start-ups at once
    on a busy machine can exceed Ray's own start-up timeout, which is not what this test is about)."""
    env = {**os.environ, **ISOLATED, "MLFLOW_TRACKING_URI": uri, "RAY_ADDRESS": address}
    return [subprocess.Popen([sys.executable, "cli.py", "run", *TINY, "--seed", str(seed)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for seed in seeds]


@pytest.fixture()
def ray_node(tmp_path: Path) -> Iterator[str]:
    """A one-CPU Ray head of this test's own on a free loopback port; its address."""
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    address = f"127.0.0.1:{free_port()}"
    node = start_node(["--head", f"--port={address.split(':')[1]}", f"--temp-dir={temp}",
                       "--include-dashboard=false"], tmp_path / "head.log")
    try:
        yield address
    finally:
        stop_node(node)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # four real commands; on a loaded machine each can take minutes
@pytest.mark.extended
def test_concurrent_runs_on_a_fresh_then_an_existing_store_all_finish(ray_node: str, mlflow_uri: str) -> None:
    for batch in (range(2), range(2, 4)):  # the first pair creates the store, the second shares it
        procs = _start_runs(mlflow_uri, batch, ray_node)
        errors = [proc.communicate()[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], "\n".join(e[-2000:] for e in errors)
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("fltune").experiment_id])
    assert sorted(run.data.tags["seed"] for run in runs) == [str(s) for s in range(4)]
    assert {run.info.status for run in runs} == {"FINISHED"}


def test_open_store_creates_the_experiment_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    _, first = open_store(uri, "exp")
    client, again = open_store(uri, "exp")
    assert first == again and sorted(e.name for e in client.search_experiments()) == ["Default", "exp"]


def test_locked_database_is_retried_and_other_errors_are_not() -> None:
    calls: list[int] = []

    def locked_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise MlflowException("(sqlite3.OperationalError) database is locked", TEMPORARILY_UNAVAILABLE)
        return "written"

    assert RetryingClient(SimpleNamespace(write=locked_twice)).write() == "written" and len(calls) == 3

    def bad_value() -> None:
        calls.append(1)
        raise MlflowException("bad", INVALID_PARAMETER_VALUE)

    calls.clear()
    with pytest.raises(MlflowException, match="bad"):
        RetryingClient(SimpleNamespace(write=bad_value)).write()
    assert len(calls) == 1
