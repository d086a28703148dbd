"""Where fltune's MLflow store lives, and the check that it answers, without importing MLflow: a command
run with ``tracking.enabled=false`` never loads it (MLflow adds ~73 MiB to a driver, and a node
that only trains need not have it)."""

from __future__ import annotations

import os
from pathlib import Path

from fltune.config import TrackingConfig

REPO = Path(__file__).resolve().parents[2]


def mlruns_dir() -> Path:
    """``<repo>/mlruns`` when run from inside the source checkout, else ``./mlruns`` under the current
    directory (the installed ``fltune`` command run from a project folder keeps its runs there)."""
    cwd = Path.cwd().resolve()
    inside = (REPO / "pyproject.toml").exists() and (cwd == REPO or REPO in cwd.parents)
    return (REPO if inside else cwd) / "mlruns"


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def check_tracking(tracking: TrackingConfig) -> None:
    """Before a command starts any work: the store it will log to answers (``store.check_reachable``)."""
    if tracking.enabled:
        from fltune.tracking.store import check_reachable

        check_reachable(tracking.uri or default_uri())
