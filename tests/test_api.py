"""The Python API as a notebook uses it: ``fltune.run``, ``fltune.tune``, ``fltune.compare``, ``fltune.Config``,
on real Ray and MLflow, with a method of the user's written outside the package."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import fltune
from fltune.errors import FLTuneError
from tests.plugin_helpers import TINY, write_method, write_space


@pytest.fixture(autouse=True)
def _fresh_user_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's ``smooth.py`` is a file of its own: forget the module another test's imported."""
    monkeypatch.delitem(sys.modules, "smooth", raising=False)


def test_config_from_keywords_and_yaml(tmp_path: Path) -> None:
    cfg = fltune.Config(method="fedprox", data={"dataset": "synthetic"}, **{"federation.rounds": 2, "method.mu": 0.1})
    assert (cfg.method.name, cfg.method.params.mu, cfg.federation.rounds, cfg.data.dataset) == ("fedprox", 0.1, 2,
                                                                                               "synthetic")
    path = tmp_path / "exp.yaml"
    path.write_text(cfg.to_yaml())
    again = fltune.Config.from_yaml(path, **{"federation.rounds": 3, "federation": {"clients": 7}})
    assert (again.federation.rounds, again.federation.clients, again.method.params.mu) == (3, 7, 0.1)
    with pytest.raises(FLTuneError, match=r"config error: federation.rounds: Input should be greater than or equal "
                                          r"to 1 \(got 0\)"):
        fltune.Config(**{"federation.rounds": 0})


@pytest.mark.parametrize(("job", "options"), [("tune", "fltune.tune.command:StudyRequest"),
                                              ("compare", "fltune.compare.command:CompareOptions"),
                                              ("reproduce", "fltune.reproduce.command:ReproduceOptions")])
def test_a_jobs_keywords_are_its_commands_flags(job: str, options: str) -> None:
    """``help(fltune.tune)``: the function, its typed keywords and docstring, which lists each keyword with its flag's
    help; each keyword a flag of its command (``set`` is ``--set``) and each of the command's own flags a keyword; and
    ``set=`` takes a mapping or ``field=value`` lines."""
    import argparse
    import inspect
    import pydoc

    from fltune.cli import build_parser

    function = getattr(fltune, job)
    assert inspect.isfunction(function) and function.__module__ == "fltune.api" and "plan" in function.__doc__
    shown = pydoc.render_doc(function, renderer=pydoc.plaintext)
    assert f"{job}(" in shown and function.__doc__.splitlines()[0] in shown and "progress: 'bool' = True" in shown
    keywords = inspect.signature(function).parameters
    assert "overrides" not in keywords and keywords["set"].kind is inspect.Parameter.KEYWORD_ONLY
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    flags = {(action.option_strings[0][2:].replace("-", "_") if action.option_strings else action.dest): action
             for action in commands[job]._actions if action.dest != "help"}
    assert set(keywords) - {"progress"} <= set(flags)
    own = {name for name, action in flags.items() if not action.help.startswith("= --set")}
    assert own <= set(keywords)
    doc = " ".join(function.__doc__.split())
    assert all(f"{name}: {' '.join(flags[name].help.split())}" in doc for name in set(keywords) - {"progress"})
    module, name = options.split(":")
    kind = getattr(importlib.import_module(module), name)
    given = {"table": "table2"} if job == "reproduce" else {}
    for sets in ({"method.mu": 0.1, "federation.rounds": 2}, ["method.mu=0.1", "federation.rounds=2"]):
        assert kind(**given, overrides=sets, seeds=2).overrides == ("method.mu=0.1", "federation.rounds=2")
    with pytest.raises(FLTuneError, match=r"^set: 'method.mu=0.1' is one text; allowed: a mapping"):
        function(*given.values(), set="method.mu=0.1")


def test_dir_of_fltune_is_its_api() -> None:
    import inspect

    import fltune.tune.spec  # noqa: F401  the job's package imported does not hide the function

    assert dir(fltune) == sorted([*fltune.__all__, "__version__"]) and inspect.isfunction(fltune.tune)
    assert not {"Any", "annotations", "importlib", "api", "errors"} & set(dir(fltune))
    assert {"run", "tune", "compare", "reproduce", "Config", "FLTuneError", "CompareResult"} <= set(fltune.__all__)


@pytest.mark.parametrize(("part", "field", "value", "line"), [
    ("method", "mu", -1, "method.mu: Input should be greater than or equal to 0 (got -1)"),
    ("method", "muu", 3, "method.muu: fedprox has no parameter 'muu'; did you mean mu?"),
    ("federation", "rounds", -5, "federation.rounds: Input should be greater than or equal to 1 (got -5)"),
    ("federation", "roundz", 3, "federation.roundz: unknown field; did you mean federation.rounds? (got 3)")])
def test_editing_a_config_checks_the_field_at_once(part: str, field: str, value: object, line: str) -> None:
    cfg = fltune.Config(method="fedprox")
    with pytest.raises(FLTuneError) as err:
        setattr(getattr(cfg, part), field, value)
    assert str(err.value) == f"config error: {line}"
    cfg.method.mu, cfg.federation.rounds = 0.3, 4  # the failed edit left the config as it was
    assert (cfg.method.params.mu, cfg.federation.rounds, cfg.method.model_extra) == (0.3, 4, {"mu": 0.3})


def test_an_edit_that_breaks_a_rule_between_fields_fails_before_ray() -> None:
    cfg = fltune.Config(**TINY)
    cfg.metrics.test = False  # a valid field, but nothing left to evaluate without a validation split
    with pytest.raises(FLTuneError, match=r"^config error: metrics.test: false leaves nothing to evaluate"):
        fltune.run(cfg, progress=False)  # raised by the config's own check, which run makes before Ray starts


@pytest.mark.slow
def test_import_fltune_loads_no_torch_or_ray() -> None:
    code = "import sys, fltune; fltune.Config; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.slow
def test_progress_false_prints_nothing_in_a_users_own_process() -> None:
    """No CLI set fltune's log filters there: the local Ray fltune starts says nothing either."""
    fields = {**TINY, "tracking.enabled": False, "resources.workers": 1}
    code = f"import fltune; fltune.run(fltune.Config(**{fields!r}), progress=False)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (proc.stdout, proc.stderr) == ("", "")


@pytest.mark.slow
def test_five_lines_run_a_federation_and_read_its_history(mlflow_uri: str) -> None:
    import fltune

    cfg = fltune.Config(**TINY)
    result = fltune.run(cfg, progress=False)
    accuracy = [r["acc_global"] for r in result.history]
    assert [r["round"] for r in result.history] == [1, 2] and accuracy[-1] == result.metrics["acc_global"]
    assert MlflowClient(mlflow_uri).get_run(result.run_id).info.status == "FINISHED"
    frame = result.to_pandas()
    assert frame.columns[0] == "round" and list(frame["round"]) == [1, 2] and frame["round"].dtype.kind == "i"
    model = result.model()  # the run's final global model, rebuilt from MLflow
    logged = MlflowClient(mlflow_uri).get_run(result.run_id).data.metrics
    assert list(logged)[0] == "acc/global"  # logged first: MLflow's compare view plots it by default
    assert not model.training and sum(p.numel() for p in model.parameters()) == logged["cost/params"]


def test_the_logged_model_scores_what_the_runs_json_says(ray_session, mlflow_uri: str, tmp_path: Path) -> None:
    """``fltune run --json-out`` then the model MLflow holds: the global one scores ``acc_global`` on the test set,
    each client's own one its share of ``acc_personalized``, whose spread over clients the JSON holds beside it."""
    import numpy as np
    import torch

    from fltune.cli import main
    from fltune.engine.builders import load_data
    from fltune.engine.evaluation import evaluate

    flags = ["--method", "fedper", "--dataset", "synthetic", "--model", "mlp", "--clients", "4", "--fraction", "0.5",
             "--rounds", "2", "--local-epochs", "1", "--set", "partition.eval_fraction=0.2", "--set",
             "metrics.protocols=[global,personalized]", "--workers", "1"]
    assert main(["run", *flags, "--json-out", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    config = MlflowClient(mlflow_uri).download_artifacts(out["mlflow_run_id"], "config.yaml", str(tmp_path))
    data, cpu = load_data(fltune.Config.from_yaml(config)), torch.device("cpu")
    correct, _, n = evaluate(fltune.load_model(out["mlflow_run_id"]), data, *data.split("test"), cpu)
    assert correct / n == out["acc_global"]
    accs = []
    for client, rows in enumerate(data.client_eval):
        idx = torch.from_numpy(rows.astype(np.int64))
        correct, _, n = evaluate(fltune.load_model(out["mlflow_run_id"], client=client), data, data.x[idx],
                                 data.y[idx], cpu)
        accs.append(correct / n)
    assert (out["acc_personalized"], out["acc_personalized_std"]) == (float(np.mean(accs)), float(np.std(accs)))
    assert (out["acc_personalized_worst10"], out["acc_personalized_best10"]) == (min(accs), max(accs))  # 1 of 4


@pytest.mark.slow
def test_a_users_method_runs_alike_on_one_and_two_workers(tmp_path: Path) -> None:
    method = f"{write_method(tmp_path / 'mine')}:LabelSmooth"
    results = [fltune.run(fltune.Config(**{**TINY, "method": method, "method.eps": 0.2, "tracking.enabled": False,
                                           "resources.workers": workers}), progress=False)
               for workers in (1, 2)]
    assert [r.status for r in results] == ["finished", "finished"]
    assert results[0].history[-1]["train_loss"] == results[1].history[-1]["train_loss"]  # bit for bit
    plain = fltune.run(fltune.Config(**{**TINY, "tracking.enabled": False}), progress=False)
    assert plain.history[-1]["train_loss"] != results[0].history[-1]["train_loss"]  # its own objective trained
    with pytest.raises(FLTuneError, match=r"^RunResult.model: this run was not tracked \(tracking.enabled: false\)"):
        plain.model()


@pytest.mark.slow
@pytest.mark.extended
def test_a_users_method_is_tuned_and_compared(tmp_path: Path) -> None:
    import pandas

    folder = tmp_path / "mine"
    write_method(folder)
    space = write_space(folder, "./smooth.py:LabelSmooth")  # beside the method, relative to the space
    study = fltune.tune(space, storage=str(tmp_path / "jobs"), name="study", confirm="2x1", progress=False)
    assert study.code == 0 and len(study.trials) == 2 and {t.status for t in study.trials} == {"finished"}
    assert study.best is not None and study.best.method.name == f"{folder / 'smooth.py'}:LabelSmooth"
    assert {c.params["method.eps"] for c in study.confirmed} == {t.params["method.eps"] for t in study.trials}
    assert study.confirmed[0].mean >= study.confirmed[1].mean  # the winner first, the best config's
    assert study.best.method.eps == study.confirmed[0].params["method.eps"]

    fields = {**TINY, "federation.rounds": 1, "resources.workers": 1, "tracking.enabled": False}
    comparison = fltune.compare([f"{folder / 'smooth.py'}:LabelSmooth", "fedavg"], seeds=2, set=fields,
                                storage=str(tmp_path / "jobs"), name="cmp", out=str(tmp_path / "out"), progress=False)
    assert comparison.code == 0 and len(comparison.trials) == 4
    assert comparison.out == str(tmp_path / "out")  # the folder holding compare.csv, whose rows the table is
    assert comparison.to_pandas().equals(pandas.read_csv(tmp_path / "out" / "compare.csv"))
    assert len(comparison.to_pandas()) == 2  # a row per method
    assert sorted(p.name for p in (tmp_path / "out" / "configs").iterdir()) == ["fedavg.yaml", "smooth.LabelSmooth.yaml"]
    assert "smooth.py:LabelSmooth" in (tmp_path / "out" / "compare.md").read_text()
