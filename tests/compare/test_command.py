"""`cli.py compare` as a user runs it: real Ray, Tune, Optuna and MLflow, on the tiny synthetic setting."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.compare.report import curves
from fltune.compare.spec import CompareSpec, parse_cell
from fltune.config import build_config
from fltune.engine.builders import load_data
from fltune.engine.rng import round_clients
from fltune.tracking.mlflow_log import mlflow_key

TINY = ["--dataset", "synthetic", "--model", "mlp", "--clients", "4", "--fraction", "0.5", "--rounds", "2",
        "--workers", "1", "--set", "metrics.protocols=[global]", "--set", "training.batch_size=64"]
"""Two clients a round on the synthetic data, one client worker per trial: seconds per cell."""

SHARED = ("data.", "partition.", "federation.", "model.", "metrics.")
TEST_METRICS = ("acc_global", "loss", "acc_all_model", "loss_all_model", "acc_personalized", "loss_personalized")


def runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def children(all_runs: list, parent) -> list:
    return [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def check_fair_and_reported(storage: Path, out: Path, printed: str, uri: str, rounds: int) -> None:
    """A finished tuned comparison ``c`` of fedavg and fedprox over two seeds (tune budget 1): it was fair,
    never tuned on test data, and its table, files and plot are what MLflow holds. ``printed``: its output,
    whitespace collapsed (the console wraps long lines). Called by ``test_resume``, whose comparison is
    stopped twice on its way: one comparison's start-up for both."""
    assert "same client-sampling sequence" in printed and "Welch's p over seeds" in printed
    assert "α = 0.05" in printed

    all_runs = runs(uri)
    [parent] = [r for r in all_runs if r.data.tags.get("fltune.kind") == "compare"]
    studies = [r for r in all_runs if r.data.tags.get("fltune.kind") == "study"]
    assert parent.info.status == "FINISHED" and len(studies) == 2
    assert all(r.info.status == "FINISHED" for r in all_runs)

    # tuning: every study trial scored on the validation split, held no test data and measured nothing on it
    # (a probe reading the test split of such a run raises, which would fail the trial and this test)
    for study in studies:
        [trial] = children(all_runs, study)
        assert trial.data.params["metrics.test"] == "False" and float(trial.data.params["partition.val_fraction"]) > 0
        assert mlflow_key("val_acc_global") in trial.data.metrics
        assert not {mlflow_key(key) for key in TEST_METRICS} & set(trial.data.metrics)
        assert trial.data.params["federation.seed"] == "1000"  # reported seeds 0 and 1 are fresh

    # the cells: per seed, every method has the same setting, hence the same partition and client samples
    cells = children(all_runs, parent)
    assert sorted(c.data.params["cell"] for c in cells) == ["fedavg/seed0", "fedavg/seed1", "fedprox/seed0",
                                                           "fedprox/seed1"]
    for seed in ("0", "1"):
        pair = [c.data.params for c in cells if c.data.params["federation.seed"] == seed]
        assert len(pair) == 2
        assert {k: v for k, v in pair[0].items() if k.startswith(SHARED)} == {
            k: v for k, v in pair[1].items() if k.startswith(SHARED)}
    spec = CompareSpec.load(str(storage / "c"))
    a, b = (build_config(spec.cell_tree(f"{m}/seed1")) for m in spec.methods)
    assert all(np.array_equal(x, y) for x, y in zip(load_data(a).client_train, load_data(b).client_train))
    assert [round_clients(a.federation, r) for r in (1, 2)] == [round_clients(b.federation, r) for r in (1, 2)]

    # the table's numbers are the child runs' metrics
    with (out / "compare.csv").open() as f:
        table = {row["method"]: row for row in csv.DictReader(f)}
    client = MlflowClient(uri)
    for method, row in table.items():
        mine = [c for c in cells if parse_cell(c.data.params["cell"])[0] == method]
        final = [c.data.metrics[mlflow_key("acc_global")] for c in mine]
        best = [max(m.value for m in client.get_metric_history(c.info.run_id, mlflow_key("acc_global"))) for c in mine]
        assert math.isclose(float(row["final_acc_global_mean"]), np.mean(final))
        assert math.isclose(float(row["final_acc_global_std"]), np.std(final, ddof=1), abs_tol=1e-12)
        assert math.isclose(float(row["best_acc_global_mean"]), np.mean(best))
        tflops = [c.data.metrics[mlflow_key("cost_cum_tflops")] for c in mine]
        assert math.isclose(float(row["cost_cum_tflops_mean"]), np.mean(tflops)) and row["seeds_finished"] == "2"
    assert sorted(r["best"] for r in table.values()) == ["0", "1"]

    # the overlay plots every round MLflow holds, even where Tune's files lost rows (those of a trial Tune
    # restarted from a checkpoint keep only the rows synced to the job folder before the restart): round 1's
    # rows go here (result.json: a line per round; progress.csv: a header, then a line per round)
    for name, first in (("result.json", 0), ("progress.csv", 1)):
        for path in (storage / "c").glob(f"*/{name}"):
            lines = path.read_text().splitlines(keepends=True)
            path.write_text("".join(lines[:first] + lines[first + 1:]))
    key = mlflow_key("acc_global")
    logged = {c.data.params["cell"]: {m.step: m.value for m in client.get_metric_history(c.info.run_id, key)}
              for c in cells}
    assert curves(spec) == logged and all(sorted(curve) == list(range(1, rounds + 1)) for curve in logged.values())
    other = next(r for r in table.values() if r["best"] == "0")
    assert 0 <= float(other["welch_p"]) <= 1 and other["beyond_noise"] in ("0", "1")
    assert "method.mu=" in table["fedprox"]["tuned"]
    assert (out / "compare.png").stat().st_size > 0 and "| ★ " in (out / "compare.md").read_text()
    assert build_config_yaml_method(out / "configs" / "fedprox.yaml") == "fedprox"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"compare.csv", "compare.md", "compare.png", "configs"} <= artifacts


def build_config_yaml_method(path: Path) -> str:
    from fltune.config import read_yaml

    return build_config(read_yaml(path)).method.name


@pytest.mark.parametrize("args, message", [
    (["--methods", "fedavg,fedmagic"], "fltune: --methods: unknown method 'fedmagic'; allowed:"),
    (["--methods", "fedavg"], "fltune: --methods: 1 method(s); allowed: at least 2"),
    (["--methods", "fedavg,fedprox,fedavg"], "fltune: --methods: fedavg is named twice"),
    ([], "fltune: --methods is required"),
    (["--methods", "fedavg,fedprox", "--tune-budget", "0"], "fltune: --tune-budget: 0; allowed: ≥ 1"),
    (["--methods", "fedavg,fedprox", "--seeds", "0"], "fltune: --seeds: 0; allowed: ≥ 1"),
    (["--methods", "fedavg,fedprox", "--max-concurrent", "0"], "fltune: --max-concurrent: 0; allowed: ≥ 1"),
    (["--methods", "fedavg,fedavg+man", "--tune-budget", "2"], "fltune: --methods: fedavg+man has no search space"),
    (["--methods", "fedavg,fedprox", "--set", "metrics.protocols=[personalized]"],
     "fltune: metrics.protocols: the ranking accuracy acc_personalized needs partition.eval_fraction > 0"),
    (["--methods", "fedavg,fedprox", "--rounds", "0"], "fltune: config error: federation.rounds"),
    (["--methods", "fedavg,fedprox", "--name", "a b"], "fltune: --name 'a b': allowed:"),
    (["--resume"], "fltune: --resume: no comparison under"),
    (["--methods", "fedavg,fedprox", "--out", "/dev/null/out"],
     "fltune: --out /dev/null/out: Not a directory; allowed:"),
    (["--methods", "fedavg,fedprox", "--set", "data.dataset=cifar10", "--set", "data.root=/nonexistent-fltune-data"],
     "fltune: data.dataset: cifar10 not found in /nonexistent-fltune-data"),
    # data every cell would refuse in its trial (partitioned by the driver, before Ray starts)
    (["--methods", "fedavg,fedprox", "--set", "partition.eval_fraction=0.0001"],
     "fltune: partition.eval_fraction: 0.0001 holds out no sample of any client (the largest has 1500)"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys, tmp_path: Path,
                                          mlflow_uri: str) -> None:
    assert main(["compare", *TINY, *args, "--storage", str(tmp_path / "jobs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())  # nothing half-written
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run at all, so none left RUNNING
