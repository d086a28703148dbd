"""Tracking that survives its server (``fltune.tracking.backlog``): a real ``mlflow server`` on loopback is
stopped while a run or a study logs to it; the job goes on, keeps what the server did not take on disk, ends
with one line and exit 75, and the backlog reaches the server once it is back: every round, the real status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.config import TrackingConfig
from fltune.tracking import backlog
from fltune.tracking.backlog import TEMPFAIL, backlogs, keep_in, outcome, sync
from fltune.tracking.mlflow_log import Tracker, mlflow_key
from tests.test_cli import TINY, wait_for
from tests.tracking.conftest import TrackingServer
from tests.tune.helpers import REPO, finished, study_runs, write_space
from tests.tune.test_cluster import free_port


def steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    """The rounds at which fltune's metric ``key`` reached MLflow."""
    return sorted(m.step for m in client.get_metric_history(run_id, mlflow_key(key)))


def fltune_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("fltune:")]


@pytest.mark.slow
def test_what_a_stopped_server_missed_reaches_it_once_it_is_back(mlflow_server: TrackingServer, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A study's parent and a child created while the server is away (a stand-in id, mapped when sent, its
    parent tag too): the command's end says where the backlog is and exits 75; once the server is back the
    same call sends it all, in order, with the runs' real statuses, and the file is gone."""
    keep_in(str(tmp_path / "job"))
    tracker = Tracker(TrackingConfig(uri=mlflow_server.uri))
    parent = tracker.start("study", {"fltune.kind": "study"})
    tracker.log_round(parent, {"round": 1, "objective": 0.5})
    mlflow_server.stop()
    child = tracker.start("trial", {"fltune.kind": "trial"}, parent=parent)
    for round_ in (1, 2):
        tracker.log_round(child, {"round": round_, "acc_global": 0.25 * round_})
    tracker.log_text(child, "method: fedavg\n", "config.yaml")
    tracker.end(child, "finished")
    assert tracker.find({"fltune.kind": "trial"}) == []  # a read answers empty while the server is away
    tracker.end(parent, "killed")
    [kept] = backlogs(tmp_path / "job")
    assert len(kept.read_text().splitlines()) == 1 + 8  # the header, then each call the server did not take

    assert outcome(0) == TEMPFAIL
    [line] = fltune_lines(capsys.readouterr().err)
    assert line.startswith("fltune: tracking interrupted: 8 calls") and str(tmp_path / "job") in line

    mlflow_server.start()
    assert outcome(0) == 0 and backlogs(tmp_path / "job") == []
    client = MlflowClient(mlflow_server.uri)
    runs = {r.info.run_name: r for r in client.search_runs([tracker.experiment_id])}
    assert {name: r.info.status for name, r in runs.items()} == {"study": "KILLED", "trial": "FINISHED"}
    trial = runs["trial"].info.run_id
    assert runs["trial"].data.tags["mlflow.parentRunId"] == parent
    assert steps(client, trial, "acc_global") == [1, 2] and steps(client, parent, "objective") == [1]
    assert [a.path for a in client.list_artifacts(trial)] == ["config.yaml"]


@pytest.mark.slow
def test_sync_sends_a_backlog_its_command_left_and_ends_its_run(tmp_path: Path, mlflow_uri: str, fresh_backlog: None,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that never answered (the experiment itself is kept, found or made by name when sent); the
    command died before ending its run. ``sync`` leaves a backlog a live command still writes, then sends it to
    the store named by ``--uri`` and ends the run KILLED: nothing stays RUNNING."""
    keep_in(str(tmp_path / "job"))
    tracker = Tracker(TrackingConfig(uri=f"http://127.0.0.1:{free_port()}"))
    run = tracker.start("lost", {"method": "fedavg"})
    tracker.log_round(run, {"round": 1, "loss": 2.0})
    assert sync(str(tmp_path / "job"), mlflow_uri) == TEMPFAIL  # its command still holds it
    assert "being written by a running command" in capsys.readouterr().err
    tracker.client.backlog.handle.close()  # the command is gone, and its process's clients with it
    monkeypatch.setattr(backlog, "_clients", {})

    assert main(["sync", str(tmp_path / "job"), "--uri", mlflow_uri]) == 0
    assert backlogs(tmp_path / "job") == []
    client = MlflowClient(mlflow_uri)
    [sent] = client.search_runs([client.get_experiment_by_name("fltune").experiment_id])
    assert (sent.info.run_name, sent.info.status, sent.data.tags["method"]) == ("lost", "KILLED", "fedavg")
    assert steps(client, sent.info.run_id, "loss") == [1]
    assert main(["sync", str(tmp_path / "nothing")]) == 2


def test_a_commands_first_write_to_a_server_turns_off_mlflows_url_lines(fresh_backlog: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow prints "View run …" and "View experiment …" at every run a server ends: two lines per trial in a
    study's output and two before a stop's one line. Where the user did not ask for them, fltune turns them off
    when a command first writes to a server; a user's own setting wins."""
    from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT as SUPPRESS

    monkeypatch.delenv(SUPPRESS.name, raising=False)
    backlog.keeping(object(), "http://127.0.0.1:1")  # object(): no backlog to send, never called
    assert SUPPRESS.get() is True
    monkeypatch.setenv(SUPPRESS.name, "false")
    backlog.keeping(object(), "http://127.0.0.1:2")
    assert SUPPRESS.get() is False


def test_a_commands_first_write_leaves_another_stores_backlog(tmp_path: Path, fresh_backlog: None) -> None:
    """What a command sends when it first writes to a store (``keeping``) is that store's backlogs only: another
    store's stays on disk, counted as left, for a command that writes there or ``fltune sync``."""
    other = backlog.Backlog(tmp_path / "other.jsonl", "http://127.0.0.1:1")
    other.record("set_terminated", ("run",), {})
    other.handle.close()
    assert backlog.send_kept([other.path], "http://127.0.0.1:2", client=object()) == 1  # object(): never called
    assert backlogs(tmp_path) == [other.path]


@pytest.mark.extended
def test_a_run_outlives_its_tracking_server(mlflow_server: TrackingServer, tmp_path: Path) -> None:
    """Issue 74's case 1: the server stopped after round 2 of a run. Training goes on to its last round,
    ``--json-out`` is written, one line says where the backlog is, exit 75, no traceback; ``fltune sync``
    once the server is back leaves MLflow holding the whole run, FINISHED."""
    log, out = tmp_path / "run.log", tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "run", *TINY, "--set", "federation.rounds=8",
                             "--local-epochs", "5", "--json-out", str(out)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_for(proc, log, "round 2/8")
    mlflow_server.stop()
    assert finished(proc, log, 600) == TEMPFAIL, log.read_text()[-3000:]
    text = log.read_text()
    assert "round 8/8" in text and "Traceback" not in text and "Retrying" not in text
    [line] = fltune_lines(text)
    folder = tmp_path / "mlruns" / "tracking-backlog"
    assert line.startswith("fltune: tracking interrupted:") and f"fltune sync {folder}`" in line
    summary = json.loads(out.read_text())
    assert summary["rounds"] == 8 and summary["status"] == "finished"
    assert len(backlogs(folder)) == 1

    mlflow_server.start()
    synced = subprocess.run([sys.executable, str(REPO / "cli.py"), "sync", str(folder)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert backlogs(folder) == []
    client = MlflowClient(mlflow_server.uri)
    [run] = client.search_runs([client.get_experiment_by_name("fltune").experiment_id])
    assert (run.info.status, run.data.tags["fltune.status"]) == ("FINISHED", "finished")
    assert steps(client, run.info.run_id, "round_s") == list(range(1, 9))
    assert run.data.metrics[mlflow_key("wall_s")] == pytest.approx(summary["wall_s"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml", "curves.png"}


@pytest.mark.extended
def test_a_two_trial_study_logs_to_a_tracking_server(ray_session, mlflow_server: TrackingServer,
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The study's parent and its two trials on the server, each FINISHED with its rounds; nothing kept; no MLflow
    "View run" line among the study's output."""
    space = write_space(tmp_path)
    assert main(["tune", "--space", str(space), "--storage", str(tmp_path), "--name", "s"]) == 0
    assert "View run" not in capsys.readouterr().out
    parent, children = study_runs(mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri)
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert all(c.info.status == "FINISHED" and steps(client, c.info.run_id, "round_s") == [1, 2, 3]
               for c in children)
    assert backlogs(tmp_path / "s") == []
