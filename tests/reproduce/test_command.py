"""`cli.py tables` and `cli.py reproduce` as a user runs them: real Ray, real MLflow, real FMNIST."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.tracking.mlflow_log import mlflow_key
from tests.conftest import needs_fmnist

TINY = ["--datasets", "fmnist", "--rows", "FedAvg,SimFAFL", "--set", "federation.rounds=2",
        "--set", "data.subsample=0.05", "--set", "training.local_epochs=1", "--set", "metrics.every=2"]
"""Four FMNIST cells of Table 2, two rounds on 5 % of the data: seconds per cell."""


def test_tables_lists_the_registry_with_data_status(capsys) -> None:
    assert main(["tables"]) == 0
    out = capsys.readouterr().out  # a listing: stdout, for `| grep` and `> file`
    assert "simfafl:table2" in out and "= table2" in out and "FMNIST" in out


def reproduce_runs(uri: str) -> tuple[object, list]:
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if r.data.tags.get("fltune.kind") == "reproduce"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], children


@needs_fmnist
@pytest.mark.slow
def test_reproduce_prints_paper_beside_measured_writes_files_and_resumes(ray_session, tmp_path: Path,
                                                                         mlflow_uri: str, capsys) -> None:
    out = tmp_path / "out"
    args = ["reproduce", "table2", *TINY, "--storage", str(tmp_path / "jobs"), "--name", "t2", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().err
    assert "paper 96.74" in printed and "SimFAFL" in printed and "Kendall τ-b" in printed and "Δ" not in printed
    for cell in (f"{m} | FMNIST {p}" for m in ("FedAvg", "SimFAFL") for p in ("non-IID1", "non-IID2")):
        assert f" · {cell} finished at round " in printed  # a log's line per cell as it ends
    with (out / "table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["dataset"], r["partition"]) for r in rows] == [
        ("FedAvg", "FMNIST", "non-IID1"), ("FedAvg", "FMNIST", "non-IID2"),
        ("SimFAFL", "FMNIST", "non-IID1"), ("SimFAFL", "FMNIST", "non-IID2")]
    for r in rows:
        assert r["status"] == "finished" and r["scale"] == "quick" and r["seeds"] == "1"
        assert 0 < float(r["measured"]) <= 100
        assert r["delta"] == "" and r["rank"] in ("1", "2") and r["paper_rank"] in ("1", "2")  # quick: ranks
        assert float(r["kendall_tau"]) in (-1.0, 1.0)
    assert "| SimFAFL |" in (out / "table.md").read_text()

    parent, children = reproduce_runs(mlflow_uri)
    assert parent.info.status == "FINISHED" and parent.data.params["table"] == "simfafl:table2"
    assert parent.data.metrics["kendall_tau/FMNIST non-IID1"] in (-1.0, 1.0)
    assert sorted(c.data.params["cell"] for c in children) == sorted(
        f"{m} | FMNIST {p}" for m in ("FedAvg", "SimFAFL") for p in ("non-IID1", "non-IID2"))
    assert all(c.info.status == "FINISHED" for c in children)
    simfafl = next(c for c in children if c.data.params["cell"] == "SimFAFL | FMNIST non-IID1")
    assert simfafl.data.params["paper_value"] == "96.74" and mlflow_key("acc_personalized_ft") in simfafl.data.metrics
    client = MlflowClient(mlflow_uri)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"table.csv", "table.md"}

    # resuming (without --name: the newest job of the table, as for `tune`) a finished job redoes nothing:
    # same table, still one child run per cell; a setting flag given with --resume is named and ignored
    assert main(["reproduce", "table2", "--storage", str(tmp_path / "jobs"), "--resume", "--seeds", "3",
                 "--out", str(tmp_path / "again")]) == 0
    printed = " ".join(capsys.readouterr().err.split())
    assert "keeps the settings it started with; ignored: --seeds" in printed
    assert " finished at round " not in printed  # the cells ended before: their log lines are not repeated
    assert (tmp_path / "again" / "table.csv").read_text() == (out / "table.csv").read_text()
    assert len(reproduce_runs(mlflow_uri)[1]) == 4


@pytest.mark.parametrize("args, message", [
    (["reproduce", "table9"], "fltune: table: unknown table 'table9'; did you mean table4 or"),
    (["reproduce", "table2", "--scale", "huge"], "fltune: --scale: simfafl:table2 has no scale 'huge'"),
    (["reproduce", "table2", "--datasets", "svhn"], "fltune: --datasets: 'svhn' is not a dataset"),
    (["reproduce", "table2", "--seeds", "0"], "fltune: --seeds: 0; allowed: ≥ 1"),
    (["reproduce", "table2", "--max-concurrent", "0"], "fltune: --max-concurrent: 0; allowed: ≥ 1"),
    (["reproduce", "table2", "--checkpoint-every", "0"], "fltune: --checkpoint-every: 0; allowed: ≥ 1"),
    (["reproduce", "table2", "--checkpoint-seconds", "-5"], "fltune: --checkpoint-seconds: -5; allowed: > 0"),
    (["reproduce", "table2", "--resume"], "fltune: --resume: no job of simfafl:table2 under"),
    (["reproduce", "table2", "--out", "/dev/null/out"], "fltune: --out /dev/null/out: Not a directory; allowed:"),
    # a cell's data that can't be fetched (a root that can't be made): the job's data check, before Ray starts
    (["reproduce", "table2", "--datasets", "cifar10", "--rows", "FedAvg", "--set", "data.download=true", "--set",
      "data.root=/dev/null/fltune-data"], "fltune: data.dataset: cifar10 not found in /dev/null/fltune-data"),
    (["reproduce", "table2", "--datasets", "fmnist", "--rows", "FedAvg", "--set", "partition.eval_fraction=0.0001"],
     "fltune: partition.eval_fraction: 0.0001 holds out no sample of any client"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys, tmp_path: Path) -> None:
    assert main([*args, "--storage", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing half-written
