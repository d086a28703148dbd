"""A command with tracking off never imports MLflow (or Optuna, unless it searches); one that logs to a new
sqlite store checks it without importing MLflow (its logging thread does, later), and an existing one for
being an MLflow store of this MLflow's schema, also without importing it; any other store is asked once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fltune.config import TrackingConfig
from fltune.errors import FLTuneError
from fltune.tracking.paths import check_reachable, check_tracking, mlruns_dir, outputs_dir, schema_head
from fltune.tracking.mlflow_log import open_store
from tests.tune.test_cluster import free_port

IMPORTS = """
import sys
from fltune.cli import main
from fltune.compare import command as compare
from fltune.config import TrackingConfig
from fltune.reproduce import command as reproduce, job
from fltune.tracking.paths import check_tracking
from fltune.tune import spec
check_tracking(TrackingConfig(enabled=False))
print(sorted(name for name in ("mlflow", "optuna") if name in sys.modules))
"""


def test_the_commands_load_without_mlflow_or_optuna_when_tracking_is_off():
    """A node with only the training stack (the GPU boxes issue 12 was measured on) runs ``reproduce``
    with ``tracking.enabled=false``: the store check and the job's modules leave MLflow unimported."""
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


SQLITE = """
import sys
from fltune.config import TrackingConfig
from fltune.tracking.paths import check_tracking
check_tracking(TrackingConfig(enabled=True, uri=sys.argv[1]))
print("mlflow" in sys.modules)
"""


def test_a_sqlite_store_is_not_asked_and_mlflow_not_imported_before_the_run(tmp_path):
    """The default store: nothing to ask (``open_store`` creates it when the run logs), and MLflow's ~3.5 s of
    imports stay off the command's main thread, before its start-up."""
    uri = f"sqlite:///{tmp_path / 'later' / 'mlflow.db'}"
    out = subprocess.run([sys.executable, "-c", SQLITE, uri], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert list((tmp_path / "later").iterdir()) == []  # its folder is made, the store not yet


@pytest.mark.parametrize(("where", "expected"), [
    ("file/mlflow.db", "its folder {tmp}/file: Not a directory; allowed: a folder this user can create and write"),
    ("folder", "{tmp}/folder is a folder; allowed: sqlite:///<folder>/<file>.db"),
])
def test_a_sqlite_store_that_cannot_be_written_is_one_line_before_any_work(tmp_path, where, expected):
    """Else the run trained its first round and its logging thread ended it with a traceback."""
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    uri = f"sqlite:///{tmp_path / where}"
    with pytest.raises(FLTuneError) as err:
        check_tracking(TrackingConfig(enabled=True, uri=uri))
    assert str(err.value) == f"tracking.uri {uri}: " + expected.format(tmp=tmp_path)


def test_a_store_that_does_not_answer_is_one_line_at_once(tmp_path: Path) -> None:
    """MLflow's client would retry a refused connection for minutes (4 min 23 s measured) before a traceback."""
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    before = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    with pytest.raises(FLTuneError, match=rf"^tracking.uri {refused}: Connection refused; allowed: "):
        check_reachable(refused)
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") == before  # the run's own logging retries as usual
    with pytest.raises(FLTuneError, match="tracking.uri file:.*filesystem tracking backend"):
        check_reachable((tmp_path / "mlruns").as_uri())  # MLflow ≥ 3.13 refuses the file store


def test_job_outputs_go_beside_the_sqlite_store_the_user_chose(tmp_path: Path) -> None:
    assert outputs_dir(TrackingConfig(uri=f"sqlite:///{tmp_path}/runs/mlflow.db")) == tmp_path / "runs"
    assert outputs_dir(TrackingConfig(uri="http://localhost:5000")) == mlruns_dir()
def other_schema(db: Path) -> None:
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE notes (text TEXT)")


def newer_schema(db: Path) -> None:
    """A store a newer MLflow migrated past every revision this one knows."""
    open_store(f"sqlite:///{db}", "fltune")
    with sqlite3.connect(db) as store:
        store.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")


@pytest.mark.parametrize(("make", "found"), [
    (lambda db: db.write_bytes(b"\x00" * 4096), "is not an SQLite database (file is not a database)"),
    (other_schema, "is an SQLite database of another schema (tables: notes)"),
    (newer_schema, "is an MLflow store of schema revision ffffffffffff, and MLflow "),
])
def test_a_store_mlflow_cannot_use_is_one_line_naming_what_was_found(tmp_path: Path, make, found: str) -> None:
    db = tmp_path / "mlflow.db"
    make(db)
    uri = f"sqlite:///{db}"
    with pytest.raises(FLTuneError) as err:
        check_tracking(TrackingConfig(enabled=True, uri=uri))
    assert str(err.value).startswith(f"tracking.uri {uri}: {db} {found}")
    assert str(err.value).endswith(f"; move it aside (mv {db} {db}.bad) or point --set "
                                   "tracking.uri=sqlite:///<other folder>/mlflow.db elsewhere")


def test_an_mlflow_store_of_this_mlflow_and_an_empty_file_pass(tmp_path: Path) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    open_store(f"sqlite:///{tmp_path / 'mlflow.db'}", "fltune")
    for name in ("empty.db", "mlflow.db"):
        check_tracking(TrackingConfig(enabled=True, uri=f"sqlite:///{tmp_path / name}"))


def test_the_schema_head_read_from_the_scripts_is_mlflows_own() -> None:
    from mlflow.store.db.utils import _get_latest_schema_revision

    assert schema_head() == _get_latest_schema_revision()


def test_checking_an_existing_store_imports_no_mlflow(tmp_path: Path) -> None:
    """The check runs on the command's main thread before any work: MLflow's import would come first."""
    db = tmp_path / "mlflow.db"
    open_store(f"sqlite:///{db}", "fltune")
    check = ("import sys; from fltune.config import TrackingConfig; from fltune.tracking.paths import check_tracking; "
             f"check_tracking(TrackingConfig(enabled=True, uri='sqlite:///{db}')); print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
