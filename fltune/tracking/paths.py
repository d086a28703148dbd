"""Where fltune's MLflow store lives, and the check that it answers, without importing MLflow: a command
run with ``tracking.enabled=false`` never loads it (MLflow adds ~73 MiB to a driver, and a node
that only trains need not have it), and one that logs to sqlite loads it off the main thread."""

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


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check_tracking(tracking: TrackingConfig) -> None:
    """Before a command starts any work: the store it will log to answers (``store.check_reachable``).

    A sqlite store (the default) is a local file that ``store.open_store`` creates on first use: it is not
    asked, and MLflow is not imported here. Its imports take ~3.5 s on 2 cores, which on the command's main
    thread came before anything else started; a run imports it on its logging thread while round 1 trains."""
    uri = tracking.uri or default_uri()
    if tracking.enabled and sqlite_path(uri) is None:
        from fltune.tracking.store import check_reachable

        check_reachable(uri)
