"""The installed ``fltune`` command (``[project.scripts]`` in pyproject.toml) and where it keeps its runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

from mlflow.tracking import MlflowClient

from fltune.cli import entry
from fltune.jobs.storage import storage_root
from fltune.tracking.mlflow_log import mlflow_key
from fltune.tracking.paths import default_uri, mlruns_dir
from tests.test_cli import TINY

REPO = Path(__file__).resolve().parents[1]


def script() -> EntryPoint:
    """The ``fltune`` console script exactly as pip will install it from pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    value = re.search(r'^fltune\s*=\s*"([^"]+)"', section, re.MULTILINE)
    assert value, "pyproject.toml: [project.scripts] has no fltune entry"
    return EntryPoint(name="fltune", value=value.group(1), group="console_scripts")


def test_fltune_script_is_the_cli_entry() -> None:
    assert script().load() is entry


def test_outside_the_checkout_runs_and_studies_go_under_the_current_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert mlruns_dir() == tmp_path.resolve() / "mlruns"
    assert default_uri() == f"sqlite:///{tmp_path.resolve() / 'mlruns' / 'mlflow.db'}"
    assert Path(storage_root(None)) == tmp_path.resolve() / "studies"


def test_inside_the_checkout_runs_stay_at_its_root(monkeypatch) -> None:
    monkeypatch.chdir(REPO / "tests")
    assert mlruns_dir() == REPO / "mlruns" and Path(storage_root(None)) == REPO / "studies"


def fltune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """What pip's generated ``fltune`` script does (argv[0] named fltune, then the entry point), from ``cwd``."""
    ep = script()
    code = f"import sys; sys.argv[0] = 'fltune'; from {ep.module} import {ep.attr}; sys.exit({ep.attr}())"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_fltune_run_from_any_folder_writes_json_and_one_finished_mlflow_run_there(tmp_path) -> None:
    """``fltune run`` outside the checkout, with no MLflow URI set: its run goes to ``./mlruns`` of the folder it
    ran in, one FINISHED run with its tags, parameters, every round's figures and its artifacts."""
    helped = fltune("--help", cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: fltune")

    out = tmp_path / "out.json"
    proc = fltune("run", "--method", "fedprox", "--set", "method.mu=0.01", *TINY, "--seed", "3",
                  "--json-out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Token authentication" not in proc.stderr and "Traceback" not in proc.stderr  # no library chatter
    # piped, a line per round with its pace and the ETA of the rounds left, from round 1 on
    assert re.search(r"^round 1/2 \d+\.\d s/round, ETA 0:\d\d:\d\d global=", proc.stderr, re.M), proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    for key in ("acc_global", "acc_all_model", "acc_personalized", "loss", "rounds_to_target", "rounds",
                "wall_s", "samples_per_s", "mlflow_run_id"):
        assert key in summary
    assert summary["rounds"] == 2 and summary["status"] == "finished"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    # MLflow 3's UI opens the experiment on its training runs, not on the GenAI overview
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.tags["method"] == "fedprox" and run.data.tags["seed"] == "3"
    assert run.data.params["method.mu"] == "0.01" and run.data.params["federation.rounds"] == "2"
    history = client.get_metric_history(run.info.run_id, mlflow_key("acc_global"))
    assert [m.step for m in history] == [1, 2]
    assert abs(history[-1].value - summary["acc_global"]) < 1e-9
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "config.yaml"} <= artifacts
