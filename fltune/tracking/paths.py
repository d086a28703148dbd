"""Where fltune's MLflow store lives, and the check that it answers, without importing MLflow (a node that
only trains need not have it; a run imports it off the main thread)."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from importlib.metadata import version
from pathlib import Path

from fltune.config import TrackingConfig
from fltune.errors import FLTuneError
from fltune.folders import make_out

REPO = Path(__file__).resolve().parents[2]


def mlruns_dir() -> Path:
    """``<repo>/mlruns`` inside the source checkout, else ``./mlruns`` under the current directory."""
    cwd = Path.cwd().resolve()
    inside = (REPO / "pyproject.toml").exists() and (cwd == REPO or REPO in cwd.parents)
    return (REPO if inside else cwd) / "mlruns"


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def outputs_dir(tracking: TrackingConfig) -> Path:
    """Where a job writes its result folders: beside its sqlite store, else ``mlruns_dir``."""
    db = sqlite_path(tracking.uri or default_uri())
    return mlruns_dir() if db is None else db.parent


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check_tracking(tracking: TrackingConfig) -> None:
    """Before a command starts any work: the store it will log to answers (``check_reachable``). A sqlite store is not
    asked through MLflow (slow to import); its folder is made now, so an unwritable one fails here in one line, and a
    file there must be an MLflow store (``check_store``)."""
    uri = tracking.uri or default_uri()
    if not tracking.enabled:
        return
    db = sqlite_path(uri)
    if db is None:
        check_reachable(uri)
    elif db.is_dir():
        raise FLTuneError(f"tracking.uri {uri}: {db} is a folder; allowed: sqlite:///<folder>/<file>.db")
    else:  # the file itself is made on the logging thread
        make_out(str(db.parent), f"tracking.uri {uri}: its folder")
        check_store(db, uri)


def check_store(db: Path, uri: str) -> None:
    """The file at ``db``, if any and not empty, is an MLflow store at this MLflow's schema head; else MLflow
    would fail at its first write, after the work began. Imports no MLflow."""
    if not db.is_file() or db.stat().st_size == 0:
        return
    try:
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=20)) as store:
            tables = {row[0] for row in store.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            found = (store.execute("SELECT version_num FROM alembic_version").fetchone() or ("none",))[0] \
                if "alembic_version" in tables else None
    except sqlite3.DatabaseError as err:
        if "locked" in str(err):  # another command writes to it: a store that answers
            return
        raise _not_a_store(uri, db, f"is not an SQLite database ({err})") from None
    if not tables:
        return
    if found is None or "experiments" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise _not_a_store(uri, db, f"is an SQLite database of another schema (tables: {shown})")
    expected = schema_head()
    if found != expected:
        raise _not_a_store(uri, db, f"is an MLflow store of schema revision {found}, and MLflow {version('mlflow')} "
                                    f"reads {expected} (`mlflow db upgrade {uri}` upgrades an older one)")


def schema_head() -> str:
    """This MLflow's schema head, from its alembic scripts' text (alembic would execute every migration, some
    importing MLflow); MLflow's own answer when there is not exactly one head."""
    package = importlib.util.find_spec("mlflow").submodule_search_locations[0]  # found, not imported
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in (Path(package) / "store" / "db_migrations" / "versions").glob("*.py"):
        text = script.read_text()
        revisions.update(re.findall(r'^revision = "(\w+)"', text, re.M))
        for line in re.findall(r"^down_revision = (.*)$", text, re.M):
            parents.update(re.findall(r'"(\w+)"', line))
    heads = revisions - parents
    if len(heads) == 1:
        return heads.pop()
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _not_a_store(uri: str, db: Path, what: str) -> FLTuneError:
    """The line for a file at ``db`` that MLflow cannot use: what it is, and what to do."""
    return FLTuneError(f"tracking.uri {uri}: {db} {what}; move it aside (mv {db} {db}.bad) or point "
                       "--set tracking.uri=sqlite:///<other folder>/mlflow.db elsewhere")


QUICK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
"""MLflow's HTTP settings for one try at a server (MLflow reads them at each request)."""


@contextmanager
def one_try() -> Iterator[None]:
    """MLflow's HTTP requests meanwhile tried once (``QUICK``), the settings put back after."""
    before = {key: os.environ.get(key) for key in QUICK}
    os.environ.update(QUICK)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_reachable(uri: str) -> None:
    """One request to a non-sqlite store, HTTP retries off: a bad ``tracking.uri`` is one line at once."""
    from mlflow.tracking import MlflowClient

    try:
        with one_try():
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:  # whatever stops the client (HTTP, a missing database driver) makes it unusable
        raise FLTuneError(f"tracking.uri {uri}: {reason(err)}; allowed: a reachable MLflow tracking server "
                          "or database, or sqlite:///path/mlflow.db (the default)") from None


def reason(err: Exception) -> str:
    """What went wrong, in a few words: a missing package, a timeout, the OS error, else the first sentence."""
    if isinstance(err, ImportError):
        return f"needs the Python package {err.name or err}"
    text = str(err)
    if "timed out" in text:  # urllib3's "Read timed out. (read timeout=10)" inside MLflow's wrapping
        return "timed out"
    oserror = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if oserror:
        return oserror.group(1).strip()
    return text.split(". ")[0].strip()[:200]
