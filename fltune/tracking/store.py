"""Opening the MLflow store, safe when many processes share a sqlite file (a server needs neither fix):

* **Creating it.** MLflow creates its schema without a lock (``SqlAlchemyStore.__init__``), so two processes
  race (``table … already exists``): :func:`open_store` holds a ``flock`` on ``<db>.lock`` meanwhile.
* **Writing.** sqlite answers "database is locked" at once, busy timeout or not, when a reader must become a
  writer while another process writes; MLflow rolls back (``TEMPORARILY_UNAVAILABLE``), so
  :class:`RetryingClient` repeats it.

A tracking server's client keeps what the server does not take on disk (``backlog.keeping``).
"""

from __future__ import annotations

import fcntl
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE, ErrorCode
from mlflow.tracking import MlflowClient

from fltune.tracking.backlog import keeping
from fltune.tracking.paths import sqlite_path

RETRY_FOR_S = 120.0
"""How long a write keeps retrying "database is locked" before the error reaches the user."""

_LOCKED = "database is locked"


class _DropLockedNoise(logging.Filter):
    """MLflow logs a full traceback for every "database is locked" before raising; we retry those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _LOCKED not in record.getMessage()


logging.getLogger("mlflow.store.db.utils").addFilter(_DropLockedNoise())


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock on ``<db>.lock`` for a sqlite store (a no-op for a server): one creator at a time."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def retrying(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` run again (with jittered backoff, up to :data:`RETRY_FOR_S`) while sqlite says it is locked."""

    @wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        deadline, pause = time.monotonic() + RETRY_FOR_S, 0.05
        while True:
            try:
                return call(*args, **kwargs)
            except MlflowException as err:
                locked = err.error_code == ErrorCode.Name(TEMPORARILY_UNAVAILABLE) and _LOCKED in str(err)
                if not locked or time.monotonic() > deadline:
                    raise
            time.sleep(pause * (0.5 + random.random()))  # jitter: processes that collided don't collide again
            pause = min(2 * pause, 2.0)

    return wrapper


class RetryingClient:
    """An ``MlflowClient`` whose every method retries "database is locked" (rolled back, hence safe to repeat)."""

    def __init__(self, client: MlflowClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        return retrying(value) if callable(value) else value


def open_store(uri: str, experiment: str, artifacts: str | None = None, tags: dict[str, str] | None = None,
               defaults: dict[str, str] | None = None) -> tuple[Any, str]:
    """A client of the store at ``uri`` and the id of ``experiment``, created if new (under
    :func:`store_lock`). ``tags`` are always set, ``defaults`` only where absent (a UI description stays). A
    server's client is a ``backlog.KeepingClient``."""
    tags, defaults = tags or {}, defaults or {}
    with store_lock(uri):
        client = keeping(RetryingClient(MlflowClient(uri)), uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return client, client.create_experiment(experiment, artifact_location=artifacts,
                                                    tags={**defaults, **tags})
        wanted = {**{k: v for k, v in defaults.items() if k not in found.tags}, **tags}
        for key, value in wanted.items():
            if found.tags.get(key) != value:
                client.set_experiment_tag(found.experiment_id, key, value)
        return client, found.experiment_id
