"""The job folder's filesystem: a write cut short by a kill leaves the file as it was (Tune's own in-place
copies left ``tuner.pkl`` empty, and the job unable to resume: ray-project/ray#58179), and a checkpoint
Tune prunes stays until the job folder holds a state saved after the prune."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs
import pytest

from fltune.errors import FLTuneError
from fltune.jobs.storage import job_filesystem, storage_root, tuner_whole, write_whole
from fltune.jobs.tuner import run_config
from fltune.tune.spec import SPEC_FILE, SavedSpec
from fltune.workarounds import PRUNES
from tests.tune.helpers import STALE_CLASS, STALE_MODULE

KILLED_MID_WRITE = """
import os, signal, sys
from fltune.jobs.storage import job_filesystem
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


def copy_state(fs: pyarrow.fs.FileSystem, job: Path, text: str) -> None:
    """One copy of Tune's job state into the job folder, as its syncer makes it."""
    with fs.open_output_stream(str(job / "experiment_state-1.json")) as out:
        out.write(text.encode())


def test_a_pruned_checkpoint_stays_until_a_state_saved_after_the_prune_is_in_the_job_folder(
        tmp_path: Path) -> None:
    """Tune prunes ``checkpoint_000001`` as ``checkpoint_000003`` registers, during a copy of its state. The
    next copy, opened after the prune, may still carry a state saved before it (Tune's driver thread saves,
    then waits for the copy under way before it starts the next). The copy that opens after that one ended
    was started, so saved, after the prune: only when it ends does the checkpoint go. Pruning goes through
    the filesystem each checkpoint came back with (an unpickled copy), copies through the storage's own; a
    folder that is not a checkpoint goes at once."""
    job, trial = tmp_path / "job", tmp_path / "job" / "trial"
    for name in ("checkpoint_000001", "checkpoint_000003", "other"):
        (trial / name).mkdir(parents=True)
    storage, returned = job_filesystem(str(tmp_path)), pickle.loads(pickle.dumps(job_filesystem(str(tmp_path))))
    under_way = storage.open_output_stream(str(job / "experiment_state-1.json"))
    returned.delete_dir(str(trial / "other"))
    returned.delete_dir(str(trial / "checkpoint_000001"))
    assert not (trial / "other").exists()
    under_way.write(b"names 1")
    under_way.close()
    copy_state(storage, job, "saved before or after the prune")
    assert (trial / "checkpoint_000001").is_dir()
    copy_state(storage, job, "saved after the prune")
    assert sorted(p.name for p in trial.iterdir()) == ["checkpoint_000003"]


def test_a_job_whose_run_ended_lets_go_of_what_it_held(tmp_path: Path) -> None:
    """After ``Tuner.fit`` returns, Tune's last save (made after its loop, stopped or not) came after every
    prune: what is still held goes (``TuneJob.run``)."""
    held = tmp_path / "trial" / "checkpoint_000002"
    held.mkdir(parents=True)
    job_filesystem(str(tmp_path)).delete_dir(str(held))
    assert held.is_dir()
    PRUNES.release()
    assert not held.exists()


def test_every_job_writes_local_folders_through_it_and_leaves_uris_to_tune(tmp_path: Path) -> None:
    local = run_config(SimpleNamespace(name="s", storage=str(tmp_path)), [])
    assert local.storage_filesystem.type_name == job_filesystem(str(tmp_path)).type_name
    assert run_config(SimpleNamespace(name="s", storage="s3://bucket/jobs"), []).storage_filesystem is None


def test_a_stop_as_fltune_writes_its_own_file_leaves_the_old_one_or_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_whole``: the stop (SIGTERM is ``KeyboardInterrupt`` in the driver) lands as the file would be
    moved into place; nothing of the new file shows, and nothing is left beside it."""
    kept, absent = tmp_path / "best_config.yaml", tmp_path / "fltune_study.json"
    kept.write_text("old")

    def stopped(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", stopped)
    for path in (kept, absent):
        with pytest.raises(KeyboardInterrupt):
            write_whole(str(path), b"new")
    assert kept.read_text() == "old" and not absent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best_config.yaml"]
    monkeypatch.undo()
    write_whole(str(absent), b"new")
    assert absent.read_text() == "new"


def test_a_spec_saved_again_as_a_stop_lands_still_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's failure: a comparison stopped just as a study saved its spec found an empty file on resume
    ("holds a different kind of fltune job"); the file was opened, so truncated, before its text was made."""
    spec = SavedSpec(name="s", storage=str(tmp_path))
    spec.save()

    def stopped(*_: object, **__: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(SavedSpec, "model_dump_json", stopped)
    with pytest.raises(KeyboardInterrupt):
        spec.save()
    monkeypatch.undo()
    assert SavedSpec.load(spec.path) == spec
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [SPEC_FILE]


def test_a_storage_uri_that_cannot_be_reached_is_one_line_naming_storage(tmp_path: Path) -> None:
    with pytest.raises(FLTuneError, match=r"^--storage nosuchfs://bucket/x: Unrecognized filesystem .*; allowed: "):
        storage_root("nosuchfs://bucket/x")
    # a local folder as a URI is that folder (its job files are written whole, as a plain path's are)
    assert storage_root(f"file://{tmp_path}/jobs") == str(tmp_path / "jobs")
    with pytest.raises(FLTuneError, match=r"^--storage file://rel/x: Unsupported hostname .*; allowed: "):
        storage_root("file://rel/x")
    assert storage_root(str(tmp_path / "rel" / ".." / "jobs")) == str(tmp_path / "jobs")


def test_a_saved_tuner_that_is_missing_empty_cut_or_from_an_older_fltune_is_not_whole(tmp_path: Path) -> None:
    assert not tuner_whole(str(tmp_path))
    saved = pickle.dumps({"_tune_config": list(range(100))})
    for data, whole in ((saved, True), (b"", False), (saved[: len(saved) // 2], False),
                        (STALE_CLASS, False), (STALE_MODULE, False)):
        (tmp_path / "tuner.pkl").write_bytes(data)
        assert tuner_whole(str(tmp_path)) == whole
