"""A whole study against the real local Ray and a real MLflow store: ASHA stopping, divergence, results."""

from __future__ import annotations

import csv
import pickle
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.tracking.mlflow_log import mlflow_key
from tests.tune.helpers import TINY_BASE, rounds_logged, study_runs, write_space


@pytest.mark.slow
def test_study_stops_poor_trials_and_survives_divergence(ray_session, tmp_path: Path, mlflow_uri: str, capsys):
    # random sampler, seed 2, draws lr = 1e6 (diverges), 0.05 (learns), 1e-4 (barely moves): with one trial
    # at a time, ASHA compares the third with the second at round 1 and stops it.
    space = write_space(
        tmp_path, params={"training.lr": {"type": "choice", "values": [0.05, 1.0e-4, 1.0e6]}}, num_samples=3,
        max_concurrent=1, seeds=2, sampler={"name": "random", "seed": 2},
        scheduler={"name": "asha", "grace_period": 1, "reduction_factor": 2},
    )
    code = main(["tune", "--space", str(space), "--storage", str(tmp_path), "--name", "s", "--set",
                 "federation.rounds=2"])
    out = capsys.readouterr().err
    assert code == 0, out
    assert "selects on test data (acc_global, final)" in out  # the header says so, in one line
    parent, children = study_runs(mlflow_uri)
    by_lr = {float(c.data.params["training.lr"]): c for c in children}  # the tuned value, logged once
    assert not [k for c in children for k in c.data.params if k.startswith("tuned.")]
    assert sorted(by_lr) == [1.0e-4, 0.05, 1.0e6]
    status = {lr: c.data.tags["fltune.status"] for lr, c in by_lr.items()}
    assert status == {1.0e6: "diverged", 0.05: "finished", 1.0e-4: "stopped"}
    assert by_lr[1.0e6].info.status == "FAILED"
    assert rounds_logged(mlflow_uri, by_lr[0.05].info.run_id) == [1, 2]
    assert rounds_logged(mlflow_uri, by_lr[1.0e-4].info.run_id) == [1]
    assert by_lr[0.05].data.metrics["objective_std"] >= 0.0  # two seeds: mean and std
    logged = {key for c in children for key in c.data.metrics}  # fltune's metrics, the round as the step
    assert {mlflow_key("acc_global"), mlflow_key("train_loss"), "objective"} <= logged
    assert not logged & {"round", "time_this_iter_s", "time_total_s", "time_since_restore", "training_iteration"}
    assert parent.info.status == "FINISHED" and parent.data.tags["best.training.lr"] == "0.05"
    client = MlflowClient(mlflow_uri)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "trials.csv", "sensitivity.png", "trials_curves.png", "best_config.yaml", "base_config.yaml", "space"}
    table = list(csv.DictReader(open(client.download_artifacts(parent.info.run_id, "trials.csv", str(tmp_path)))))
    assert "acc_global" in table[0] and "acc_personalized" not in table[0]  # not measured: no empty column
    assert [r["status"] for r in table] == ["finished", "stopped", "diverged"]
    assert "finished" in out and "stopped" in out and "diverged" in out  # the ranking in the terminal
    # stderr is a pipe here, as in a log: no live table, a line per trial as it ends
    ended = [line for line in out.splitlines() if line.startswith("study s: ")]
    heads = [line.split(" · ")[0] for line in ended]  # how many are done, and the ETA once one has ended
    assert [re.fullmatch(r"study s: (\d)/3 trials done, ETA ~\d+ min", head)[1] for head in heads] == ["1", "2", "3"]
    assert {re.search(r"\(training\.lr=(\S+)\) (\w+) at round", line).groups() for line in ended} == {
        ("0.05", "finished"), ("0.0001", "stopped"), ("1e+06", "diverged")}
    # Optuna was told the diverged trial FAILED, not given a score
    state = next((tmp_path / "s").glob("searcher-state-*.pkl"))
    study = pickle.loads(state.read_bytes())["_ot_study"]  # OptunaSearch saves its __dict__
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE", "FAIL"]
    # the best configuration is a config `cli.py run --config` accepts unchanged
    assert main(["run", "--config", str(tmp_path / "s" / "best_config.yaml"), "--print-config"]) == 0
    assert "lr: 0.05" in capsys.readouterr().out


@pytest.mark.slow
def test_a_refused_setting_fails_its_trial_once_in_one_line(ray_session, tmp_path: Path, mlflow_uri: str, capsys):
    """A sampled ``partition.alpha`` that leaves clients empty fails the same way on every attempt: the trial
    ends failed at once (no restart, no traceback), Optuna hears FAIL, the reason is one line, and a study
    that scored nothing exits 1 with its parent run FAILED."""
    base = {**TINY_BASE, "partition": {"kind": "dirichlet", "alpha": 0.5, "min_size": 10},
            "federation": {"clients": 40, "fraction": 0.1, "rounds": 2}}
    space = write_space(tmp_path, base=base, params={"partition.alpha": {"type": "choice", "values": [1.0e-4]}},
                        num_samples=2)
    assert main(["tune", "--space", str(space), "--storage", str(tmp_path), "--name", "s"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Trial task failed" not in err and "restarting" not in err
    lines = [line for line in err.splitlines() if line.startswith("fltune: ")]
    assert lines[0].startswith("fltune: 2 trial(s) failed: partition.alpha/partition.min_size: no split with every "
                               "client ≥ 10 samples") and "trace:" not in lines[0]
    assert lines[1:] == ["fltune: no trial produced a score (all diverged or failed)"]
    parent, children = study_runs(mlflow_uri)
    assert parent.info.status == "FAILED" and parent.data.tags["fltune.trials_failed"] == "2"
    assert [(c.info.status, c.data.tags["fltune.status"]) for c in children] == [("FAILED", "failed")] * 2
    assert not list((tmp_path / "s").glob("*/error.txt"))  # Tune saw no error: nothing to restart
    state = next((tmp_path / "s").glob("searcher-state-*.pkl"))
    assert [t.state.name for t in pickle.loads(state.read_bytes())["_ot_study"].trials] == ["FAIL", "FAIL"]
