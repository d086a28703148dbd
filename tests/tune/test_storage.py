"""The job folder's filesystem: a write cut short by a kill leaves the file as it was (Tune's own in-place
copies left ``tuner.pkl`` empty, and the job unable to resume: ray-project/ray#58179)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs

from fltune.tune.storage import job_filesystem
from fltune.tune.study import run_config

KILLED_MID_WRITE = """
import os, signal, sys
from fltune.tune.storage import job_filesystem
stream = job_filesystem(sys.argv[1]).open_output_stream(sys.argv[2])
stream.write(b"half of the new")
stream.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_file_leaves_the_old_file_whole(tmp_path: Path) -> None:
    state = tmp_path / "tuner.pkl"
    state.write_bytes(pickle.dumps({"old": "state"}))
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path), str(state)], check=False)
    assert killed.returncode == -9
    assert pickle.loads(state.read_bytes()) == {"old": "state"}
    # Tune's listings (``*.json``, ``*.pkl``, ``experiment_state-*``) pass over what the writer left
    assert [p.name for p in tmp_path.iterdir() if p != state][0].endswith(".part")


def test_a_finished_write_replaces_the_file_and_the_filesystem_travels_to_trials(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    (staging / "trial").mkdir(parents=True)
    (staging / "experiment_state-1.json").write_text("{}")
    (staging / "trial" / "model.pt").write_bytes(bytes(range(256)) * 4096)
    job = tmp_path / "job"
    job.mkdir()
    (job / "experiment_state-1.json").write_text('{"stale": true}')
    fs = pickle.loads(pickle.dumps(job_filesystem(str(tmp_path))))  # as Ray ships it inside the storage
    pyarrow.fs.copy_files(str(staging), str(job), destination_filesystem=fs)  # how Tune syncs a job up
    assert (job / "experiment_state-1.json").read_text() == "{}"
    assert (job / "trial" / "model.pt").read_bytes() == (staging / "trial" / "model.pt").read_bytes()
    assert sorted(p.name for p in job.rglob("*")) == ["experiment_state-1.json", "model.pt", "trial"]


def test_every_job_writes_local_folders_through_it_and_leaves_uris_to_tune(tmp_path: Path) -> None:
    local = run_config(SimpleNamespace(name="s", storage=str(tmp_path)), [])
    assert local.storage_filesystem.type_name == job_filesystem(str(tmp_path)).type_name
    assert run_config(SimpleNamespace(name="s", storage="s3://bucket/jobs"), []).storage_filesystem is None
