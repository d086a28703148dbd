"""Helpers for the study tests: tiny synthetic search spaces, the CLI as a subprocess, MLflow read-back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from mlflow.tracking import MlflowClient

from fltune.tracking.mlflow_log import mlflow_key
from fltune.tune.mlflow_runs import EVERY_ROUND

REPO = Path(__file__).resolve().parents[2]
STALE_CLASS = b"cfltune.tune.mlflow_runs\nMLflowStudyCallback\n."
"""A saved Tuner as an older fltune pickled it: its MLflow callback was a class this fltune removed."""
STALE_MODULE = b"cfltune.compare.job\nCompareJob\n."
"""One naming a module this fltune removed."""

TINY_BASE: dict[str, Any] = {
    "data": {"dataset": "synthetic"},
    "model": {"name": "mlp"},
    "partition": {"kind": "dirichlet_prior", "alpha": 0.5},
    "federation": {"clients": 4, "fraction": 0.5, "rounds": 3},
    "training": {"local_epochs": 1, "batch_size": 64},
    "metrics": {"protocols": ["global"]},
}
"""Two clients a round on the synthetic data: a round takes about a second on one CPU."""


def write_space(folder: Path, **changes: Any) -> Path:
    """A FedProx space over the tiny base; keyword arguments replace top-level keys."""
    space = {
        "method": "fedprox", "base": TINY_BASE,
        "params": {"method.mu": {"type": "loguniform", "low": 1.0e-4, "high": 1.0}},
        "objective": {"metric": "acc_global", "mode": "max", "reduce": "final"},
        "num_samples": 2, "sampler": {"name": "random", "seed": 0}, "scheduler": {"name": "none"},
        "max_concurrent": 2, "seeds": 1,
        **changes,
    }
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def tune_command(space: Path, storage: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "cli.py"), "tune", "--space", str(space), "--storage", str(storage),
            "--name", "study", *extra]


def start(cmd: list[str], log: Path, **env: str) -> subprocess.Popen:
    """The CLI in its own process group (so a test can end it and every Ray process it started), with
    Python's fault handler on: ``finished`` has a stuck one write every thread's stack to its log."""
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1", **env}, start_new_session=True)


def finished(proc: subprocess.Popen, log: Path, timeout: float) -> int:
    """``proc``'s exit status once it ends. One still running after ``timeout`` seconds is stuck: SIGABRT
    makes the fault handler write its threads' stacks to ``log``, its process group is killed, and the test
    fails with the log's end, where pytest's own time-out would kill the test and show only its own stack."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tail = log.read_text()[-20000:]
        raise AssertionError(f"still running after {timeout:.0f} s; its log ends:\n{tail}") from None


def study_runs(uri: str) -> tuple[Any, list[Any]]:
    """The single study parent run and its children."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fltune")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], children


def rounds_logged(uri: str, run_id: str) -> list[int]:
    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, mlflow_key(EVERY_ROUND))]
