"""A study as a reviewer would accept it: the shipped FedProx space selects on validation, confirms its top 3 on
fresh seeds with the test data beside, says which parameter mattered, keeps its Optuna study where Optuna opens
it, and starts a later study warm; a study of two objectives writes its Pareto front."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.tune.search import JOURNAL
from tests.conftest import needs_fmnist
from tests.tune.helpers import REPO, TINY_BASE, study_runs, write_space

TINY_FMNIST = ["--set", "data.subsample=0.05", "--set", "model.name=mlp", "--clients", "4", "--rounds", "1",
               "--set", "federation.fraction=0.5", "--set", "training.batch_size=64", "--set", "scheduler.name=none"]
"""The shipped FedProx space on 5 % of FMNIST, two clients in one round: its learning rates score apart."""


def artifacts(uri: str, run_id: str, folder: str | None = None) -> set[str]:
    return {a.path for a in MlflowClient(uri).list_artifacts(run_id, folder)}


def optuna_trials(folder: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials as Optuna's own ``load_study`` reads them from the study folder."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(folder / JOURNAL)))
    return optuna.load_study(study_name=name, storage=storage).trials


@needs_fmnist
@pytest.mark.slow
def test_the_shipped_fedprox_space_selects_on_validation_confirms_on_seeds_and_starts_another_warm(
        ray_session, tmp_path: Path, mlflow_uri: str, capsys) -> None:
    space = str(REPO / "fltune" / "search_spaces" / "fedprox.yaml")
    args = ["tune", "--space", space, "--storage", str(tmp_path), *TINY_FMNIST, "--num-samples", "3"]
    assert main([*args, "--name", "a"]) == 0
    out = capsys.readouterr().err
    assert "selects on test data" not in out
    assert "confirmed: top 3 over 3 seed(s), winner by the mean" in out
    assert len(re.findall(r"\d\.\d{4} ± \d\.\d{4} +│ +\d\.\d{4} ± \d\.\d{4} +│ +[+-]\d\.\d{4}", out)) == 3
    assert re.search(r"best val_acc_global = \S+ ± \S+ over 3 seed\(s\); on test \S+ ± \S+ \(gap [+-]", out)
    assert "which parameter mattered (fANOVA over 3 completed trials): " in out

    parent, _ = study_runs(mlflow_uri)
    assert {"importance.md", "confirmed.md", "importance"} <= artifacts(mlflow_uri, parent.info.run_id)
    assert {"importance/importances.png", "importance/slice.png", "importance/contour.png"} <= artifacts(
        mlflow_uri, parent.info.run_id, "importance")
    assert sum(k.startswith("importance.") for k in parent.data.metrics) == 2
    assert MlflowClient(mlflow_uri).get_run(parent.info.run_id).data.metrics["confirmed_test"] > 0.1
    confirmed = MlflowClient(mlflow_uri).search_runs(  # each confirmed configuration's seeds, with their models
        [parent.info.experiment_id], "tags.`fltune.kind` = 'confirmation'")
    assert len({run.info.run_name for run in confirmed}) == 9  # told apart in MLflow's view, like the trials
    assert all(re.fullmatch(r"a/confirm method\.mu=\S+, training\.lr=\S+ · seed [1-3]", run.info.run_name)
               for run in confirmed)
    assert re.search(r"confirming a: \d/3 done.* · method\.mu=\S+, training\.lr=\S+ finished at round 1", out)

    trials = optuna_trials(tmp_path / "a", "a")  # Optuna's own tools open the study
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    assert all(set(t.params) == {"method.mu", "training.lr"} and t.intermediate_values for t in trials)

    assert main([*args, "--name", "b", "--num-samples", "1", "--confirm", "none",
                 "--warm-start", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().err
    assert f"warm start: 3 evaluated configuration(s) carried over from {tmp_path / 'a'}; 1 new trial(s) run" in out
    assert len(list((tmp_path / "b").glob("run_trial_*"))) == 1  # only the new trial ran
    warm = optuna_trials(tmp_path / "b", "b")
    assert len(warm) == 4 and [t.params for t in warm[:3]] == [t.params for t in trials]
    assert "confirming the top 1 configuration(s) with the test data (seed 0)" in out
    assert_the_winner_loads(tmp_path / "b" / "best_config.yaml", mlflow_uri)


def assert_the_winner_loads(best_config: Path, uri: str) -> None:
    """best_config.yaml's first line names the winner's confirmation run; its model scores that run's test
    accuracy, which (one seed) is the study's confirmed test score on its parent."""
    import torch

    import fltune
    from fltune.engine.builders import load_data
    from fltune.engine.evaluation import evaluate

    run_id = re.match(r"# model: runs:/(\w+)/model in ", best_config.read_text())[1]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["fltune.best_run"] == run_id and run.data.tags["fltune.kind"] == "confirmation"
    data = load_data(fltune.Config.from_yaml(best_config))
    correct, _, n = evaluate(fltune.load_model(run_id, uri=uri), data, *data.split("test"), torch.device("cpu"))
    assert correct / n == run.data.metrics["acc/global"] == parent.data.metrics["confirmed_test"]


@pytest.mark.slow
def test_a_study_of_accuracy_against_communication_writes_its_pareto_front(
        ray_session, tmp_path: Path, mlflow_uri: str, capsys) -> None:
    base = {**TINY_BASE, "partition": {**TINY_BASE["partition"], "val_fraction": 0.2},
            "federation": {**TINY_BASE["federation"], "rounds": 1}}
    space = write_space(tmp_path, base=base, num_samples=3, params={
        "method.mu": {"type": "loguniform", "low": 1.0e-4, "high": 1.0},
        "federation.fraction": {"type": "choice", "values": [0.25, 0.5, 1.0]},
    }, objective=[{"metric": "val_acc_global", "mode": "max"}, {"metric": "cost_cum_comm_gbit", "mode": "min"}])
    assert main(["tune", "--space", str(space), "--storage", str(tmp_path), "--name", "p"]) == 0
    out = capsys.readouterr().err
    assert "study p: Pareto front" in out
    front = yaml.safe_load((tmp_path / "p" / "pareto.yaml").read_text())
    assert front and all(set(row["values"]) == {"val_acc_global", "cost_cum_comm_gbit"} for row in front)
    accuracies = [row["values"]["val_acc_global"] for row in front]
    assert accuracies == sorted(accuracies, reverse=True)  # best on the ranking objective first
    parent, _ = study_runs(mlflow_uri)
    assert {"pareto.yaml", "pareto_front.png"} <= artifacts(mlflow_uri, parent.info.run_id)


def test_several_objectives_refuse_asha_in_one_line(tmp_path: Path, capsys) -> None:
    space = write_space(tmp_path, objective=[{"metric": "acc_global"}, {"metric": "cost_cum_comm_gbit"}],
                        scheduler={"name": "asha", "grace_period": 1})
    assert main(["tune", "--space", str(space), "--storage", str(tmp_path), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduler: asha stops trials by one objective's rank" in err[0], err
