"""The Python API as a notebook uses it: ``fltune.run``, ``fltune.tune``, ``fltune.compare``, ``fltune.Config``,
on real Ray and MLflow, with a method of the user's written outside the package."""

from __future__ import annotations

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


def test_a_jobs_keywords_are_its_commands_flags() -> None:
    from fltune.api import _args
    from fltune.reproduce.command import add_parsers

    args = _args(add_parsers, "reproduce", table="table2", datasets="fmnist", seeds=2)
    assert (args.table, args.datasets, args.seeds, args.scale, args.resume) == ("table2", "fmnist", 2, "quick", False)
    with pytest.raises(FLTuneError, match="compare: no option 'seedz'; allowed: .*seeds"):
        fltune.compare(["fedavg", "fedprox"], seedz=2)


@pytest.mark.slow
def test_import_fltune_loads_no_torch_or_ray() -> None:
    code = "import sys, fltune; fltune.Config; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


@pytest.mark.slow
def test_five_lines_run_a_federation_and_read_its_history(mlflow_uri: str) -> None:
    import fltune

    cfg = fltune.Config(**TINY)
    result = fltune.run(cfg, progress=False)
    accuracy = [r["acc_global"] for r in result.history]
    assert [r["round"] for r in result.history] == [1, 2] and accuracy[-1] == result.metrics["acc_global"]
    assert MlflowClient(mlflow_uri).get_run(result.run_id).info.status == "FINISHED"
    assert list(result.to_pandas()["round"]) == [1, 2]


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


@pytest.mark.slow
@pytest.mark.extended
def test_a_users_method_is_tuned_and_compared(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    write_method(folder)
    space = write_space(folder, "./smooth.py:LabelSmooth")  # beside the method, relative to the space
    study = fltune.tune(space, storage=str(tmp_path / "jobs"), name="study", progress=False)
    assert study.code == 0 and len(study.trials) == 2 and {t.status for t in study.trials} == {"finished"}
    assert study.best is not None and study.best.method.name == f"{folder / 'smooth.py'}:LabelSmooth"

    overrides = [f"{key}={value}" for key, value in {**TINY, "federation.rounds": 1, "resources.workers": 1,
                                                                 "tracking.enabled": False}.items()]
    comparison = fltune.compare([f"{folder / 'smooth.py'}:LabelSmooth", "fedavg"], seeds=2, overrides=overrides,
                                storage=str(tmp_path / "jobs"), name="cmp", out=str(tmp_path / "out"), progress=False)
    assert comparison.code == 0 and len(comparison.trials) == 4
    assert sorted(p.name for p in (tmp_path / "out" / "configs").iterdir()) == ["fedavg.yaml", "smooth.LabelSmooth.yaml"]
    assert "smooth.py:LabelSmooth" in (tmp_path / "out" / "compare.md").read_text()
