"""Tracking that survives its server. A tracking server (``http://…``, any store but a sqlite file) can restart,
flap or sit behind a proxy; the training it watches must neither stop for it nor lose its results.

MLflow retries a failed request for minutes (7 times, each try up to 120 s); fltune bounds that (:data:`HTTP_LIMITS`,
where the user set none). Once a call fails anyway, the store's :class:`KeepingClient` goes offline: writes are
appended to a JSON-lines :class:`Backlog` in the job's ``tracking-backlog/`` (a new run gets a stand-in id), reads
answer empty, and the backlog is replayed in order (:func:`replay`: stand-in ids mapped, recorded times kept) once
the server answers, at the command's end (:func:`outcome`) or by ``fltune sync``. MLflow's async logging cannot
stand in for the file: its queue lives in memory, covers ``log_batch`` alone and drops a batch the server refused.
A writer holds a ``flock`` on its file. MLflow is imported in the functions that talk to it (the CLI imports this
module for ``outcome``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fltune.folders import ReplaceOnClose
from fltune.text import counted
from fltune.tracking.paths import QUICK, mlruns_dir, one_try, reason

TEMPFAIL = 75
"""The exit status of a command that finished with tracking calls kept on disk (``EX_TEMPFAIL``)."""
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""MLflow's HTTP retries, bounded: 3 tries 10 s each, backoff 0 s then 2 s (+ up to 1 s of jitter); and its two
"View run/experiment" lines per ended run off (a stop is one line; fltune's summary names the run)."""
PROBE_EVERY_S = 60.0
"""How often an offline client tries the server again (one request, ``paths.one_try``)."""
FOLDER = "tracking-backlog"
WRITES = frozenset({"create_experiment", "set_experiment_tag", "create_run", "update_run", "set_terminated",
                    "delete_run", "log_batch", "log_text", "log_artifact"})
"""The client methods fltune writes with (``mlflow_log.Tracker``, ``mlflow_log.open_store``): these are kept."""
EMPTY: dict[str, Callable[[], Any]] = {"get_experiment_by_name": lambda: None, "search_runs": list,
                                       "get_metric_history": list, "search_experiments": list}
"""An offline client's answer to a read: nothing found (a study's curves figure is left out, a comparison
reads Tune's files)."""
STAMPED = {"create_run": "start_time", "set_terminated": "end_time"}
"""Kept calls whose time the server would otherwise set when they are sent."""

_folder: list[Path] = []
_clients: dict[str, KeepingClient] = {}


def keep_in(folder: str) -> None:
    """Keep this process's backlog in ``<folder>/tracking-backlog`` (a job's folder; a URI is no folder)."""
    if "://" not in folder:
        _folder[:] = [Path(folder)]


def backlog_folder() -> Path:
    """Where this process keeps its backlog: the job's folder (``keep_in``), else beside fltune's mlruns."""
    return (_folder[0] if _folder else mlruns_dir()) / FOLDER


def unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the store is away (no connection, a timeout, a 5xx answer), not that the call
    was wrong (a 4xx: raised as before)."""
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        return err.get_http_status_code() >= 500
    import requests

    return isinstance(err, (requests.RequestException, OSError))


def _say(line: str) -> None:
    from fltune.tracking.progress import console

    console.print(f"[yellow]tracking:[/] {line}", highlight=False)


# ---------------------------------------------------------------------------------------------- the file
class Backlog:
    """One process's calls the store did not take, in order: a header line (the store's URI), then one line per
    call, its arguments as JSON (``encode``); files logged go to ``<name>.files/``. ``<name>.sent`` holds how
    many lines were sent and the ids the server gave, so a replay cut short goes on where it stopped."""

    def __init__(self, path: Path, uri: str | None = None) -> None:
        """Open ``path`` for writing (with ``uri``: a new file) or for sending, under an exclusive ``flock``;
        ``BlockingIOError`` when another process holds it."""
        self.path, self.progress = path, path.with_suffix(".sent")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise
        if uri is not None:
            self._append({"uri": uri, "pid": os.getpid()})
        self.handle.seek(0)
        # a last line cut by a killed command (not ended by a newline) is left out
        self.lines = [json.loads(line) for line in self.handle.read().split("\n")[:-1] if line.strip()]
        saved = json.loads(self.progress.read_text()) if self.progress.exists() else {}
        self.sent, self.ids = int(saved.get("sent", 1)), dict(saved.get("ids", {}))

    @property
    def uri(self) -> str:
        return self.lines[0]["uri"]

    @property
    def waiting(self) -> int:
        """Calls not sent yet."""
        return len(self.lines) - self.sent

    def record(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], made: str | None = None) -> None:
        """Append one call; ``made``: the stand-in id it answered (a run's, an experiment's)."""
        if method == "log_artifact":
            args = (args[0], self._copy(Path(args[1])), *args[2:])
        entry = {"call": method, "args": encode(list(args)), "kwargs": encode(kwargs)}
        if made is not None:
            entry["made"] = made
        self._append(entry)

    def _append(self, entry: dict[str, Any]) -> None:
        self.handle.write(json.dumps(entry) + "\n")
        self.handle.flush()
        if "uri" not in entry:
            self.lines.append(entry)

    def _copy(self, source: Path) -> str:
        """A file or folder to log, copied beside the backlog (a temporary one is gone when it is sent)."""
        target = self.path.with_suffix(".files") / f"{len(self.lines)}" / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
        return str(target.relative_to(self.path.parent))

    def mark(self, sent: int) -> None:
        self.sent = sent
        with ReplaceOnClose(str(self.progress)) as out:
            out.write(json.dumps({"sent": sent, "ids": self.ids}).encode())

    def remove(self) -> None:
        """All sent: the file, its copies and its progress go."""
        self.progress.unlink(missing_ok=True)
        shutil.rmtree(self.path.with_suffix(".files"), ignore_errors=True)
        self.path.unlink(missing_ok=True)
        self.handle.close()


def encode(value: Any) -> Any:
    """MLflow's entities (``Metric``, ``Param``, ``RunTag``) as ``{"_": class, "v": fields}``; JSON as is."""
    from mlflow.entities import Metric, Param, RunTag

    if isinstance(value, Metric):
        return {"_": "Metric", "v": [value.key, value.value, value.timestamp, value.step]}
    if isinstance(value, (Param, RunTag)):
        return {"_": type(value).__name__, "v": [value.key, value.value]}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


def decode(value: Any, ids: dict[str, str]) -> Any:
    """``encode`` undone, every stand-in id replaced by the server's (a run's, its parent tag's, an experiment's)."""
    from mlflow import entities

    if isinstance(value, dict) and set(value) == {"_", "v"}:
        return getattr(entities, value["_"])(*decode(value["v"], ids))
    if isinstance(value, list):
        return [decode(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: decode(v, ids) for k, v in value.items()}
    return ids.get(value, value) if isinstance(value, str) else value


# ---------------------------------------------------------------------------------------------- replay
def replay(backlog: Backlog, client: Any) -> None:
    """Send ``backlog``'s waiting calls through ``client`` in order, marking each sent; an unreachable store
    raises (the rest waits); a call the store refuses (4xx) is skipped with a line, not retried forever."""
    for number in range(backlog.sent, len(backlog.lines)):
        entry = backlog.lines[number]
        args, kwargs = decode(entry["args"], backlog.ids), decode(entry["kwargs"], backlog.ids)
        try:
            answer = _send(client, entry["call"], args, kwargs, backlog.path.parent)
        except Exception as err:
            if unreachable(err):
                raise
            _say(f"the store refused a kept {entry['call']} ({reason(err)}); skipped")
            answer = None
        if "made" in entry and answer is not None:
            backlog.ids[entry["made"]] = answer
        backlog.mark(number + 1)


def _send(client: Any, call: str, args: list[Any], kwargs: dict[str, Any], folder: Path) -> str | None:
    """One kept call; the id it makes (a run's, an experiment's: found by name if it exists by now)."""
    if call == "create_run":
        return client.create_run(*args, **kwargs).info.run_id
    if call == "create_experiment":
        found = client.get_experiment_by_name(args[0])
        return found.experiment_id if found is not None else client.create_experiment(*args, **kwargs)
    if call == "log_artifact":
        args[1] = str(folder / args[1])
    getattr(client, call)(*args, **kwargs)
    return None


def end_left_running(backlog: Backlog, client: Any) -> int:
    """End KILLED the runs of a finished backlog still RUNNING (its command died before ending them); a run the
    server never created has no id of the server's and is passed over."""
    ids = {backlog.ids.get(e["made"], "") for e in backlog.lines[1:] if e["call"] == "create_run"}
    ids |= {decode(e["args"][0], backlog.ids) for e in backlog.lines[1:]
            if e["call"] not in ("create_run", "create_experiment", "set_experiment_tag")}
    ended = 0
    for run_id in {i for i in ids if i and not i.startswith("kept-")}:
        try:
            run = client.get_run(run_id)
        except Exception as err:
            if unreachable(err):
                raise
            continue  # deleted since
        if run.info.status == "RUNNING" and run.info.lifecycle_stage == "active":
            client.set_terminated(run_id, "KILLED")
            ended += 1
    return ended


# ---------------------------------------------------------------------------------------------- the client
class KeepingClient:
    """A store's client that never stops the job for the store: calls pass through while it answers; once one
    fails as ``unreachable`` the calls go to the process's :class:`Backlog` (writes) or answer empty (reads,
    ``EMPTY``), and the backlog is sent as soon as the store answers again."""

    def __init__(self, client: Any, uri: str) -> None:
        self._client, self.uri = client, uri
        self.backlog: Backlog | None = None
        self._probed = 0.0
        self._lock = threading.RLock()

    @property
    def waiting(self) -> int:
        return self.backlog.waiting if self.backlog is not None else 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if not callable(value) or (name not in WRITES and name not in EMPTY):
            return value  # a call fltune's tracking does not make keeps its own errors

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if self.backlog is not None and time.monotonic() - self._probed > PROBE_EVERY_S:
                    self.send()
                if self.backlog is None:
                    try:
                        return value(*args, **kwargs)
                    except Exception as err:
                        if not unreachable(err):
                            raise
                        self._go_offline(err)
                return self._kept(name, args, kwargs)

        return call

    def _go_offline(self, err: BaseException) -> None:
        self.backlog = Backlog(backlog_folder() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-"
                                                  f"{uuid.uuid4().hex[:4]}.jsonl", self.uri)
        self._probed = time.monotonic()
        _say(f"{self.uri} does not answer ({reason(err)}); training goes on, its tracking is kept in "
             f"{self.backlog.path} and sent when the server is back (tried every {PROBE_EVERY_S:.0f} s)")

    def _kept(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An offline call: a read empty; a write recorded, stamped with its time (``STAMPED``), a new run or
        experiment answered with a stand-in id that the replay maps to the server's."""
        if name not in WRITES:
            return EMPTY[name]()
        assert self.backlog is not None
        if name in STAMPED:
            kwargs = {STAMPED[name]: int(time.time() * 1000), **kwargs}
        made = f"kept-{uuid.uuid4().hex}" if name in ("create_run", "create_experiment") else None
        self.backlog.record(name, args, kwargs, made)
        if name != "create_run":
            return made
        from mlflow.entities import Run, RunData, RunInfo

        return Run(RunInfo(run_id=made, experiment_id=str(args[0]), user_id="", status="RUNNING",
                           start_time=kwargs["start_time"], end_time=None, lifecycle_stage="active",
                           run_name=kwargs.get("run_name")), RunData())

    def send(self) -> bool:
        """Try to send the backlog now (whole, or until the store fails again); True when nothing is left."""
        with self._lock:
            if self.backlog is None:
                return True
            self._probed = time.monotonic()
            try:
                with one_try():  # a server still away costs the job one refused (or timed-out) request
                    replay(self.backlog, self._client)
            except Exception as err:
                if not unreachable(err):
                    raise
                return False
            self.backlog.remove()
            self.backlog = None
            _say(f"{self.uri} answers again: the kept tracking is sent")
            return True


def keeping(client: Any, uri: str) -> KeepingClient:
    """``client`` of a store other than a sqlite file, as this process's :class:`KeepingClient` of ``uri`` (one per
    store: one backlog in call order). The first also sends the backlogs earlier commands left in the folder."""
    if uri not in _clients:
        _clients[uri] = KeepingClient(client, uri)
        send_kept(backlogs(backlog_folder()), uri, client)
    return _clients[uri]


# ---------------------------------------------------------------------------------------------- sending
def backlogs(path: Path) -> list[Path]:
    """The backlog files at ``path``: the file itself, or those under a folder (a job's, ``tracking-backlog``)."""
    if path.is_file():
        return [path]
    found = {*path.glob("*.jsonl"), *path.rglob(f"{FOLDER}/*.jsonl")} if path.is_dir() else set()
    return sorted(found)


def send_kept(found: list[Path], uri: str | None, client: Any = None) -> int:
    """Each backlog of ``found`` sent whole to ``uri``, else to the store it was kept for (MLflow's HTTP retries
    bounded first); how many are left. With ``client``, a command's first write to ``uri``: only the backlogs of
    ``uri``, and one whose store fails again waits for ``fltune sync`` unsaid."""
    from mlflow.tracking import MlflowClient

    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)
    left = len(found)
    for path in found:
        try:
            backlog = Backlog(path)
        except BlockingIOError:
            _say(f"{path} is being written by a running command; left for later")
            continue
        target = uri or backlog.uri
        try:
            if client is not None and backlog.uri != uri:
                continue  # another store's, left for a command that writes there or for fltune sync
            calls, sender = backlog.waiting, client or MlflowClient(target)
            replay(backlog, sender)
            ended = end_left_running(backlog, sender)
            backlog.remove()
            left -= 1
            _say(f"sent {counted(calls, 'kept tracking call')} from {backlog.path} to {target}"
                 + (f"; ended {counted(ended, 'run')} its command left RUNNING as KILLED" if ended else ""))
        except Exception as err:
            if not unreachable(err):
                raise
            if client is None:
                _say(f"{target} does not answer ({reason(err)}); {counted(backlog.waiting, 'call')} of "
                     f"{backlog.path} left for later")
        finally:
            backlog.handle.close()
    return left


def sync(path: str, uri: str | None = None) -> int:
    """``fltune sync``: send the backlogs at ``path`` to the store each was kept for (``uri``: another one). 0 when
    all are sent (or none was there), ``TEMPFAIL`` when a store still does not answer or a file is in use."""
    from fltune.errors import FLTuneError

    if not Path(path).exists():
        raise FLTuneError(f"sync {path}: no such file or folder; allowed: a backlog file or a folder holding one")
    found = backlogs(Path(path))
    if not found:
        _say(f"no tracking backlog at {path}: nothing to send")
    return TEMPFAIL if send_kept(found, uri) else 0


def outcome(code: int) -> int:
    """A command's exit status once its tracking is settled: the backlogs still waiting are tried once more
    (saying so: one request each, ``paths.one_try``); what stays is one line naming the folder and the
    command that sends it, and ``TEMPFAIL`` instead of 0."""
    waiting = [client for client in _clients.values() if client.waiting]
    if not waiting:
        return code
    for client in waiting:
        _say(f"sending {counted(client.waiting, 'kept call')} to {client.uri} (giving up after "
             f"{QUICK['MLFLOW_HTTP_REQUEST_TIMEOUT']} s without an answer)")
    left = [client for client in waiting if not client.send()]
    if not left:
        return code
    folders = sorted({str(client.backlog.path.parent) for client in left if client.backlog is not None})
    calls = sum(client.waiting for client in left)
    print(f"fltune: tracking interrupted: {counted(calls, 'call')} the server did not take are kept in "
          f"{', '.join(folders)}; send them with `fltune sync {folders[0]}` once "
          f"{left[0].uri} answers", file=sys.stderr, flush=True)
    return TEMPFAIL if code == 0 else code
