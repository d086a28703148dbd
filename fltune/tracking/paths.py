"""Where fltune's MLflow store lives, and the check that it answers, without importing MLflow: with
``tracking.enabled=false`` it is never loaded (a node that only trains need not have it), and a new sqlite
store loads it off the main thread (an existing one is checked first: ``check_store``)."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
from contextlib import closing
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
    """Where a job writes its result folders: beside its sqlite store, so results stay together wherever
    ``tracking.uri`` puts them; ``mlruns_dir`` for any other store."""
    db = sqlite_path(tracking.uri or default_uri())
    return mlruns_dir() if db is None else db.parent


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check_tracking(tracking: TrackingConfig) -> None:
    """Before a command starts any work: the store it will log to answers (``check_reachable``).

    A sqlite store (the default) is not asked through MLflow, whose slow import a run does on its logging
    thread while round 1 trains. Its folder is made now, so an unwritable or full one fails here in one line;
    a file already there must be an MLflow store (``check_store``)."""
    uri = tracking.uri or default_uri()
    if not tracking.enabled:
        return
    db = sqlite_path(uri)
    if db is None:
        check_reachable(uri)
    elif db.is_dir():
        raise FLTuneError(f"tracking.uri {uri}: {db} is a folder; allowed: sqlite:///<folder>/<file>.db")
    else:  # sqlite makes the file, and fltune its lock file beside it, on the logging thread
        make_out(str(db.parent), f"tracking.uri {uri}: its folder")
        check_store(db, uri)


def check_store(db: Path, uri: str) -> None:
    """The sqlite file at ``db``, if any, is an SQLite database holding MLflow's tables at this MLflow's
    schema head; else MLflow would fail at its first write, after the work began. A new or empty file MLflow
    sets up itself. Imports no MLflow (``schema_head``)."""
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
    """The schema revision this MLflow's migrations end at, read from its alembic scripts' text: the one
    ``revision`` no script names as ``down_revision``. Not via alembic, which executes every migration (some
    import MLflow); MLflow's own answer is the fallback when there is not exactly one head."""
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


def check_reachable(uri: str) -> None:
    """One request to the (non-sqlite) store at ``uri``, MLflow's HTTP retries off: an unreachable or
    unsupported store is one line naming ``tracking.uri``, not minutes of retries after the run started."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT
    from mlflow.tracking import MlflowClient

    quick = {MLFLOW_HTTP_REQUEST_MAX_RETRIES.name: "0", MLFLOW_HTTP_REQUEST_TIMEOUT.name: "10"}
    before = {key: os.environ.get(key) for key in quick}
    os.environ.update(quick)
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:  # whatever stops the client (HTTP, a missing database driver) makes it unusable
        raise FLTuneError(f"tracking.uri {uri}: {_reason(err)}; allowed: a reachable MLflow tracking server "
                          "or database, or sqlite:///path/mlflow.db (the default)") from None
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _reason(err: Exception) -> str:
    """What went wrong, in a few words: a missing package, the OS error, else the first sentence."""
    if isinstance(err, ImportError):
        return f"needs the Python package {err.name or err}"
    text = str(err)
    oserror = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if oserror:
        return oserror.group(1).strip()
    return text.split(". ")[0].strip()[:200]
