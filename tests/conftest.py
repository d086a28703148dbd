"""Shared fixtures: one real local Ray for the session, a real MLflow sqlite store per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason="real FMNIST missing: apt-get install dataset-fashion-mnist",
)


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray with 2 CPUs, shared by the engine tests and shut down at the end.

    ``address="local"``: always a new instance of the tests' own, never one found through $RAY_ADDRESS or
    another user's ``ray start`` on the same machine (whose CPUs and load are not ours to count on).
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture()
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh sqlite MLflow store under tmp_path, also exported for subprocesses."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(autouse=True)
def _partition_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep partition caches of tests out of the user's home."""
    monkeypatch.setenv("FLTUNE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
