"""Search-space files: every shipped file validates and trains as its paper's authors did; bad input is one line,
exit 2, no MLflow run."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from fltune.cli import main
from fltune.errors import FLTuneError
from fltune.methods import METHODS, get_method
from fltune.reproduce.papers import fedalign, fedsol, man, simfafl
from fltune.search_spaces import SPACES, space_path
from fltune.tune.search import DefineByRun
from fltune.tune.space import parse_space
from fltune.tune.command import StudyRequest
from fltune.tune.search import new_spec
from tests.tune.helpers import REPO, TINY_BASE, write_space

SPACE_FILES = sorted((REPO / "fltune" / "search_spaces").glob("*.yaml"))
AUTHORS_OPTIMISER = {
    **dict.fromkeys(("simfafl", "fedcr", "fedsr", "fedbabu", "fedper", "fedrep", "lg_fedavg", "fedpac_fedcr"),
                    simfafl.CODE_SETTINGS),
    "ditto": {**simfafl.CODE_SETTINGS, "method.first_personal": "initial"},  # FedCR's model_local
    **dict.fromkeys(("fedalign", "gradaug", "mixup"), fedalign.OPTIMISER),
    "stochdepth": {**fedalign.OPTIMISER, "method.schedule": "code"},  # FedAlign's survival schedule
    "moon": {**fedalign.OPTIMISER, "method.anchors": "train", "method.first_prev": "initial"},  # FedAlign's MOON
    **dict.fromkeys(("man", "fedsam", "fedasam", "fedspeed", "feddyn", "feddc"), man.OPTIMISER),
    **dict.fromkeys(("fedsol", "fedntd", "fednova", "scaffold", "perfedavg", "knnper", "local_only"),
                    fedsol.OPTIMISER),
    "fedpac": {"training.momentum": 0.5, "training.weight_decay": 5e-4},  # JianXu95/FedPAC's client SGD
}
"""The client optimiser of the code each space's comment names (the reproduce tables' settings); local epochs,
rounds and the tuned parameters are the space's own. FedAvg and FedProx are tuned on fltune's defaults."""


@pytest.mark.parametrize("path", SPACE_FILES, ids=[p.name for p in SPACE_FILES])
def test_every_shipped_space_validates(path: Path, tmp_path: Path) -> None:
    spec = new_spec(StudyRequest(space=str(path), storage=str(tmp_path)))
    fields = get_method(spec.method).Params.model_fields
    for name in spec.space.params:
        if name.startswith("method."):
            assert name.removeprefix("method.") in fields
    assert path.stem == spec.method or path.stem.startswith(f"{spec.method}_")


@pytest.mark.parametrize("stem", sorted(AUTHORS_OPTIMISER))
def test_a_space_in_a_papers_setting_trains_with_its_authors_optimiser(stem: str, tmp_path: Path) -> None:
    """The SimFAFL-family spaces trained with momentum 0.9 and no clipping where FedCR's code (and Table 2) uses
    plain SGD clipped at 10; FedAlign's without Nesterov; MAN's and FedSOL's without their lr decay."""
    spec = new_spec(StudyRequest(space=str(REPO / "fltune" / "search_spaces" / f"{stem}.yaml"), storage=str(tmp_path)))
    config = spec.config.model_dump()
    for key, value in AUTHORS_OPTIMISER[stem].items():
        section, field = key.split(".")
        if key not in spec.space.params and field != "local_epochs":
            assert config[section][field] == value, f"{stem}: {key} = {config[section][field]}, the authors' {value}"


@pytest.mark.parametrize("path", SPACE_FILES, ids=[p.name for p in SPACE_FILES])
def test_no_shipped_space_selects_on_test_data(path: Path) -> None:
    """Selecting on a test metric, best over rounds, peeks at the test data every round: the score is optimistic."""
    space = parse_space(path)
    assert space.on_validation, f"{path.name}: objective {space.objective.metric} is a test metric; use val_*"
    assert space.objective.reduce != "best", f"{path.name}: reduce best picks the luckiest round; use final"


def test_every_registered_method_has_a_space() -> None:
    covered = {parse_space(p).method for p in SPACE_FILES}
    assert set(METHODS) <= covered, f"no search_spaces/<method>.yaml for {sorted(set(METHODS) - covered)}"


def test_overrides_and_flags_reach_the_spec(tmp_path: Path) -> None:
    space = write_space(tmp_path, overrides=["training.batch_size=16"])
    spec = new_spec(StudyRequest(space=str(space), storage=str(tmp_path), overrides=("federation.rounds=5",),
                                 num_samples=7, max_concurrent=1, seeds=3, name="s1"))
    assert (spec.rounds, spec.config.training.batch_size) == (5, 16)
    assert (spec.space.num_samples, spec.space.max_concurrent, spec.space.seeds) == (7, 1, 3)
    assert spec.path == f"{tmp_path}/s1" and spec.config.method.name == "fedprox"


def test_search_settings_are_set_like_any_field(tmp_path: Path) -> None:
    """``--set scheduler.*`` (and sampler, objective, num_samples) edits the space; the rest the experiment.
    Naming the scheduler starts its section afresh: ``none`` has no grace period."""
    space = write_space(tmp_path, scheduler={"name": "asha", "grace_period": 2})
    sets = ("federation.rounds=2", "scheduler.grace_period=1", "sampler.name=tpe", "objective.reduce=best",
            "num_samples=3")
    spec = new_spec(StudyRequest(space=str(space), storage=str(tmp_path), overrides=sets))
    assert (spec.rounds, spec.space.scheduler.grace_period, spec.space.sampler.name) == (2, 1, "tpe")
    assert (spec.space.objective.reduce, spec.space.num_samples) == ("best", 3)
    unscheduled = new_spec(StudyRequest(space=str(space), storage=str(tmp_path),
                                        overrides=("federation.rounds=2", "scheduler.name=none")))
    assert unscheduled.space.scheduler.name == "none"


@pytest.mark.parametrize(("sets", "expected"), [
    (["federation.rounds=2"], "scheduler.grace_period: 2 ≥ federation.rounds 2; allowed: 1 "
     "(--set scheduler.grace_period=1), or no early stopping (--set scheduler.name=none)"),
    (["scheduler.grace_perod=1"], "scheduler.grace_perod: unknown field; did you mean scheduler.grace_period?"),
    (["scheduler.grace_period=0"], "scheduler.asha.grace_period: Input should be greater than or equal to 1"),
])
def test_a_refused_search_setting_names_the_flag_that_fixes_it(sets: list[str], expected: str, tmp_path: Path) -> None:
    space = write_space(tmp_path, scheduler={"name": "asha", "grace_period": 2})
    with pytest.raises(FLTuneError) as err:
        new_spec(StudyRequest(space=str(space), storage=str(tmp_path), overrides=tuple(sets)))
    assert expected in str(err.value)


def test_conditions_sample_only_when_they_hold(tmp_path: Path) -> None:
    space = parse_space(write_space(tmp_path, params={
        "training.optimizer": {"type": "choice", "values": ["sgd", "adam"]},
        "training.momentum": {"type": "uniform", "low": 0.0, "high": 0.95, "when": {"training.optimizer": "sgd"}},
    }))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(12):
        trial = study.ask()
        DefineByRun(space)(trial)
        seen.append(trial.params)
    assert all(("training.momentum" in p) == (p["training.optimizer"] == "sgd") for p in seen)
    assert {p["training.optimizer"] for p in seen} == {"sgd", "adam"}


BAD_SPACES = {
    "unknown distribution": ({"params": {"method.mu": {"type": "normal", "low": 0, "high": 1}}}, "normal"),
    "not a Params field": ({"params": {"method.nu": {"type": "uniform", "low": 0, "high": 1}}},
                           "params.method.nu: not a parameter of fedprox; allowed: mu"),
    "empty range": ({"params": {"method.mu": {"type": "loguniform", "low": 1.0, "high": 1.0e-3}}}, "empty range"),
    "value out of bounds": ({"params": {"method.mu": {"type": "uniform", "low": -1.0, "high": 1.0}}},
                            "params.method.mu = -1.0"),
    "unknown config field": ({"params": {"training.lrr": {"type": "uniform", "low": 0.1, "high": 1}}},
                             "training.lrr: unknown field"),
    "condition on a later parameter": ({"params": {
        "method.mu": {"type": "uniform", "low": 0, "high": 1, "when": {"training.lr": 0.1}},
        "training.lr": {"type": "choice", "values": [0.1]}}}, "not a parameter listed above it"),
    "personalized without held-out data": ({"objective": {"metric": "acc_personalized"},
                                            "overrides": ["metrics.protocols=[global, personalized]"]},
                                           "partition.eval_fraction > 0"),
    "metric not evaluated": ({"objective": {"metric": "acc_all_model"}}, "metrics.protocols to include all_model"),
    "fine-tuned metric under ASHA": ({"objective": {"metric": "acc_personalized_ft"},
                                      "scheduler": {"name": "asha", "grace_period": 1},
                                      "overrides": ["metrics.protocols=[personalized]", "partition.eval_fraction=0.2",
                                                    "training.finetune_epochs=1"]}, "it needs scheduler: none"),
    "fine-tuned metric without fine-tuning": ({"objective": {"metric": "acc_personalized_ft"}, "overrides": [
        "metrics.protocols=[personalized]", "partition.eval_fraction=0.2"]}, "needs training.finetune_epochs > 0"),
    "target on a metric not evaluated": ({"objective": {"metric": "rounds_to_target", "reduce": "final"},
                                          "overrides": ["metrics.target=0.5", "metrics.target_metric=acc_all_model"]},
                                         "metrics.target_metric: acc_all_model is never measured here"),
    "unknown objective.reduce": ({"objective": {"metric": "acc_global", "reduce": "last3"}},
                                 "objective.reduce: Input should be 'final', 'last_3', 'best', 'mean' or 'at_target' "
                                 "(got 'last3')"),
    "grace period past the last round": ({"scheduler": {"name": "asha", "grace_period": 3}}, "allowed: 1..2 "
                                         "(--set scheduler.grace_period=2), or no early stopping"),
    "ASHA over one round": ({"scheduler": {"name": "asha", "grace_period": 1}, "overrides": ["federation.rounds=1"]},
                            "ASHA needs federation.rounds ≥ 2"),
    "dataset not here": ({"base": {**TINY_BASE, "data": {"dataset": "cifar10", "root": "/nonexistent-fltune-data"}}},
                         "data.dataset: cifar10 not found in /nonexistent-fltune-data"),
    "a split holding nothing out": ({"overrides": ["partition.val_fraction=0.0001"]},
                                    "partition.val_fraction: 0.0001 holds out no sample of any client"),
}


@pytest.mark.parametrize("case", list(BAD_SPACES))
def test_bad_space_is_one_line_exit_2(case: str, tmp_path: Path, mlflow_uri: str, capsys) -> None:
    changes, expected = BAD_SPACES[case]
    space = write_space(tmp_path, **changes)
    assert_user_error(["tune", "--space", str(space), "--storage", str(tmp_path)], expected, mlflow_uri, capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["space.yaml"]  # no study folder


def test_malformed_yaml_and_bad_flags(tmp_path: Path, mlflow_uri: str, capsys) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("method: fedprox\nparams: {method.mu: [1, 2\n")
    assert_user_error(["tune", "--space", str(broken)], "malformed YAML at line", mlflow_uri, capsys)
    space = write_space(tmp_path)
    assert_user_error(["tune", "--space", str(space), "--num-samples", "0"], "num_samples", mlflow_uri, capsys)
    assert_user_error(["tune", "--space", str(space), "--method", "fedavg"], "is for fedprox", mlflow_uri, capsys)
    assert_user_error(["tune", "--space", str(space), "--set", "federation.rounds=0"], "federation.rounds",
                      mlflow_uri, capsys)
    assert_user_error(["tune", "--resume", "--storage", str(tmp_path), "--name", "nope"], "no fltune job",
                      mlflow_uri, capsys)
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "fltune_study.json").write_text('{"name": "cut", "stor')  # stopped as an older fltune wrote it
    assert_user_error(["tune", "--resume", "--storage", str(tmp_path), "--name", "cut"],
                      "fltune_study.json is empty or cut short", mlflow_uri, capsys)


def test_trials_that_cannot_fit_the_cluster_or_train_in_their_own_process(ray_session, tmp_path: Path,
                                                                           mlflow_uri: str, capsys) -> None:
    space = write_space(tmp_path)
    argv = ["tune", "--space", str(space), "--storage", str(tmp_path), "--set", "resources.workers=3"]
    assert_user_error(argv, "resources.workers: 3 workers", mlflow_uri, capsys)
    assert_user_error([*argv[:-1], "resources.driver_worker=true"],
                      "resources.driver_worker: a Tune trial's own process", mlflow_uri, capsys)


def assert_user_error(argv: list[str], expected: str, mlflow_uri: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fltune: ") and expected in err[0], err
    db = Path(mlflow_uri.removeprefix("sqlite:///"))
    assert not db.exists() or not MlflowClient(mlflow_uri).search_runs(
        [e.experiment_id for e in MlflowClient(mlflow_uri).search_experiments()]
    )


def test_a_study_can_maximise_a_validation_accuracy_once_there_is_a_validation_split(tmp_path: Path) -> None:
    objective = {"metric": "val_acc_global", "reduce": "final"}  # no mode: maximised, as an accuracy
    space = write_space(tmp_path, objective=objective)
    with pytest.raises(FLTuneError, match=r"objective.metric: val_acc_global needs partition.val_fraction > 0"):
        new_spec(StudyRequest(space=str(space), storage=str(tmp_path)))
    spec = new_spec(StudyRequest(space=str(space), storage=str(tmp_path), overrides=("partition.val_fraction=0.1",)))
    assert spec.space.objective.direction == "max" and spec.config.partition.val_fraction == 0.1


def test_the_shipped_spaces_are_found_from_any_folder(tmp_path, monkeypatch, capsys) -> None:
    """Outside the checkout, ``--space search_spaces/fedprox.yaml``, ``--space fedprox`` and ``--method fedprox``
    alone name the space fltune ships (package data); a file of that name here wins."""
    monkeypatch.chdir(tmp_path)
    shipped = str(SPACES / "fedprox.yaml")
    named = [("search_spaces/fedprox.yaml", None), ("fedprox", None), (None, "fedprox"), ("fedprox", "fedprox")]
    assert [space_path(space, method) for space, method in named] == [shipped] * 4
    storage = ["--set", "data.dataset=synthetic", "--plan", "--storage", str(tmp_path / "jobs")]
    for flags in (["--method", "fedprox"], ["--space", "search_spaces/fedprox.yaml"]):
        assert main(["tune", *flags, *storage]) == 0
        assert "plan: tune fedprox" in capsys.readouterr().out
    with pytest.raises(FLTuneError, match=r"^--method nosuch: no search space \(.*nosuch.yaml\); allowed: --space FILE"):
        space_path(None, "nosuch")
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "fedprox.yaml").write_text("method: fedprox\n")
    assert space_path("search_spaces/fedprox.yaml", None) == "search_spaces/fedprox.yaml"
