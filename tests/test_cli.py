"""The command line as a user runs it: real Ray, real MLflow sqlite store, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fltune.api import start_federation
from fltune.cli import main
from fltune.config import build_config
from fltune.data.datasets import load_dataset
from tests.conftest import storages
from tests.tune.helpers import write_space
from tests.tune.test_cluster import free_port

REPO = Path(__file__).resolve().parents[1]
TINY = ["--dataset", "synthetic", "--model", "mlp", "--clients", "8", "--fraction", "0.5", "--rounds", "2",
        "--local-epochs", "1", "--set", "partition.eval_fraction=0.2", "--workers", "2"]


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "cli.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def wait_for(proc: subprocess.Popen, log: Path, marker: str, timeout: float = 600) -> None:
    """Until ``marker`` is in the process's output (however slow the machine), failing if it exits first."""
    deadline = time.monotonic() + timeout
    while marker not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.2)


def session_processes(sid: int) -> list[int]:
    """Processes still alive in session ``sid`` (the CLI and every Ray process it started)."""
    alive = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.getsid(pid) == sid:
                alive.append(pid)
        except ProcessLookupError:
            continue
    return alive


@pytest.mark.slow
def test_sigterm_ends_a_run_like_ctrl_c(tmp_path, mlflow_uri):
    """What ``kill``, Kubernetes and schedulers do: one line, exit 143, run KILLED, nothing from Ray in the whole
    output. Rounds long enough that the signal lands while the actor trains: its call is cancelled, not killed and
    retried (``(raylet) Task … failed … retried``), and the driver leaves Ray before its raylet stops (else Ray's
    core worker ends it with status 1 and ``core_worker.cc … lost objects``)."""
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "cli.py", "run", *TINY, "--set", "federation.rounds=50",
                             "--local-epochs", "30"], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    wait_for(proc, log, "round 1/50")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, log.read_text()[-3000:]
    lines = log.read_text().splitlines()
    assert lines[-1] == "fltune: interrupted (SIGTERM)", lines[-10:]
    assert sum(line.startswith("fltune:") for line in lines) == 1
    noise = ("***", "Traceback", "retries remaining", "Token auth", "raylet", "core_worker", "lost objects")
    assert not any(m in line for line in lines for m in noise), lines[-10:]
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["KILLED"] and runs[0].data.tags["fltune.status"] == "killed"
    deadline = time.monotonic() + 60  # the workers and the Ray it started go with it
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_processes(proc.pid)


def test_print_config_round_trips_into_run_config(tmp_path, capsys):
    assert main(["run", "--method", "fedprox", "--rounds", "4", "--print-config"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "exp.yaml").write_text(text)
    assert main(["run", "--config", str(tmp_path / "exp.yaml"), "--print-config"]) == 0
    assert capsys.readouterr().out == text


def test_an_unknown_flag_shows_its_commands_usage(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--bogus"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "usage: fltune run [-h]" in err
    assert "fltune run: error: unrecognized arguments: --bogus" in err


def test_methods_lists_registered_methods_with_defaults(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "fedprox" in out and "mu" in out


def test_methods_shows_one_methods_card(capsys):
    """``fltune methods fedprox`` was refused: it shows the method's paper, parameters and costs."""
    assert main(["methods", "fedprox"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fedprox — Li et al., 2020" and "  mu = 1.0 (float)  proximal weight μ; default FedSOL's " \
        "1.0 (FedAlign uses 1e-4)" in lines
    assert "cost: 2 model-sized tensor(s) held by a training client, 1 forward+backward pass(es) per local step" in lines
    assert main(["methods", "fedproz"]) == 2
    assert capsys.readouterr().err.strip() == ("fltune: method.name: unknown method 'fedproz'; "
                                               "did you mean fedprox or fedper?")


def test_every_methods_card_shows_and_names_its_costs(capsys) -> None:
    """GradAug's and Proximal's cards were a TypeError: their passes per step follow their parameters (a
    property), which the card read off the class."""
    from fltune.methods import METHODS

    assert main(["methods"]) == 0
    for name in sorted(METHODS):
        assert main(["methods", name]) == 0, name
        assert "forward+backward pass(es) per local step" in capsys.readouterr().out, name


def test_a_users_method_without_a_class_docstring_has_a_card_without_an_empty_paragraph(capsys) -> None:
    assert main(["methods", f"{REPO / 'docs' / 'examples' / 'ditto.py'}:Ditto"]) == 0  # the docs' Ditto
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("my_ditto — ") and lines[1:3] == ["", "parameters (default):"], lines


@pytest.mark.parametrize(("method", "batched"), [
    ("stochdepth", "client by client on its resnet56 (BatchNorm); yes on a model without"),  # once "yes"
    ("fedcr", "yes (its vib_cnn has no BatchNorm)"), ("fedprox", "yes (on a model without BatchNorm)"),
    ("perfedavg", "client by client")])
def test_a_methods_card_says_whether_its_default_model_batches(method: str, batched: str, capsys) -> None:
    assert main(["methods", method]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"batched executor: {batched}")


@pytest.mark.parametrize(("args", "message"), [
    (["--method", "nope"], "method.name: unknown method"),
    (["--method", "fedprox", "--set", "method.mu=-1"], "method.mu:"),
    (["--fraction", "0"], "federation.fraction:"),
    (["--set", "federation.roundz=3"], "federation.roundz: unknown field"),
    (["--set", "resources.driver_worker=maybe"], "resources.driver_worker:"),
    (["--config", "/nonexistent/exp.yaml"], "exp.yaml: no such file"),
    (["--set", "tracking.experiment="], "tracking.experiment: String should have at least 1 character"),
    (["--json-out", "/dev/null/run.json"], "--json-out /dev/null: Not a directory; allowed:"),
    (["--json-out", "/"], "--json-out /: is a folder; allowed: a file path"),
    (["--set", "tracking.uri=sqlite:////dev/null/mlflow.db"], "tracking.uri sqlite:////dev/null/mlflow.db: its "
     "folder /dev/null: Not a directory"),
    (["--address", "127.0.0.1:abc"], "--address 127.0.0.1:abc: the port is not a number"),
    (["--set", "metrics.target=0.5", "--set", "metrics.target_metric=acc_personalized", "--set",
      "metrics.protocols=[global]"], "metrics.target_metric: acc_personalized is never measured here: it needs "
     "metrics.protocols to include personalized"),
])
def test_bad_input_is_one_line_exit_2(args, message, capsys):
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", [["run"], ["reproduce", "table2"], ["compare", "--methods", "fedavg,fedprox"]])
def test_an_unreachable_tracking_server_is_one_line_before_any_work(command, tmp_path, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    storage = [] if command == ["run"] else ["--storage", str(tmp_path / "jobs")]
    assert main([*command, *storage, "--set", f"tracking.uri={uri}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fltune: tracking.uri {uri}: Connection refused; allowed:") and len(err.splitlines()) == 1
    assert not (tmp_path / "jobs").exists()  # checked before the job folder is written or Ray starts


@pytest.mark.parametrize("command", [["run"], ["tune"], ["reproduce", "table2"],
                                     ["compare", "--methods", "fedavg,fedprox"]])
def test_a_store_that_is_no_database_is_one_line_before_any_work(command, tmp_path, capsys):
    """A text file where ``mlruns/mlflow.db`` should be (a crash of another tool, a bad copy): ``run``
    printed its header, then two tracebacks ending in "file is not a database", status 1."""
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    db.write_text("not a database\n")
    space = ["--space", str(write_space(tmp_path))] if command == ["tune"] else []
    storage = [] if command == ["run"] else ["--storage", str(tmp_path / "jobs")]
    assert main([*command, *space, *storage, "--set", f"tracking.uri=sqlite:///{db}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fltune: tracking.uri sqlite:///{db}: {db} is not an SQLite database (file is not a database); "
                   f"move it aside (mv {db} {db}.bad) or point --set tracking.uri=sqlite:///<other folder>/mlflow.db "
                   "elsewhere")
    assert not (tmp_path / "jobs").exists() and db.read_text() == "not a database\n"


def test_a_cluster_address_where_no_ray_listens_is_one_line_at_once(capsys):
    """``ray.init`` would retry it for many minutes (over 5 measured), a warning every few seconds."""
    address = f"127.0.0.1:{free_port()}"
    assert main(["run", "--address", address, "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fltune: --address {address}: no Ray cluster answers there (Connection refused); allowed:")
    assert len(err.splitlines()) == 1


def test_missing_dataset_says_where_it_looked(tmp_path, capsys):
    assert main(["run", "--dataset", "cifar10", "--data-root", str(tmp_path), "--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cifar10" in err and str(tmp_path) in err and len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["tune", "--space", "/nonexistent/space.yaml"],
    ["run", "--dataset", "cifar10", "--data-root", "/nonexistent-fltune-data"],
    ["compare", "--methods", "fedavg,fedprox", "--dataset", "mnist", "--data-root", "/nonexistent-fltune-data"],
    ["tune", "--space", "search_spaces/fedprox.yaml", "--set", "data.root=/nonexistent-fltune-data"],
], ids=["space file", "run's dataset", "compare's dataset", "a study's dataset"])
def test_a_missing_file_is_refused_before_torch_or_ray_load(args):
    """What makes the line come in a second or two, not the 7–20 s that importing torch and starting Ray take:
    the command checks files first (``python -X importtime`` lists every module the process imported)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "cli.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.splitlines()
    said = [line for line in lines if not line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    assert proc.returncode == 2 and len(said) == 1 and said[0].startswith("fltune: "), said
    assert not imported & {"torch", "ray", "mlflow", "torchvision"}
    assert "download=True" not in said[0]  # fltune's words and flag, not torchvision's


def test_impossible_partition_and_unplaceable_workers(ray_session, capsys, mlflow_uri):
    assert main(["run", "--dataset", "synthetic", "--clients", "100000", "--rounds", "1"]) == 2
    assert "federation.clients" in capsys.readouterr().err
    assert main(["run", *TINY[:-2], "--workers", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert "resources.workers" in err and len(err.splitlines()) == 1
    assert not MlflowClient(mlflow_uri).search_runs(
        [e.experiment_id for e in MlflowClient(mlflow_uri).search_experiments()], "attributes.status = 'RUNNING'")


def test_a_started_run_keeps_no_private_copy_of_its_dataset(ray_session):
    """Once the workers hold the dataset, the driver reads their shared copy and the loader's cached one is
    released (a later load reads the files again): 55 MB of the driver's memory for Fashion-MNIST."""
    cfg = build_config(overrides=["data.dataset=synthetic", "federation.clients=8", "federation.rounds=1",
                                  "resources.workers=2"])
    loaded = load_dataset(cfg.data.dataset)
    fed, pool = start_federation(cfg)
    try:
        assert load_dataset(cfg.data.dataset) is not loaded
        assert not storages(fed.data) & storages(loaded)
    finally:
        fed.close()
        pool.shutdown()


def test_a_plan_refuses_a_warm_start_folder_without_a_study(tmp_path, capsys) -> None:
    """``tune --plan`` checks ``--warm-start`` as the study would, in one line, exit 2."""
    assert main(["tune", "--method", "fedprox", "--warm-start", str(tmp_path), "--plan"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"fltune: --warm-start {tmp_path}: no Optuna study")
