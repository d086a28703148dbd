"""The user's own method, model and dataset by reference and by installed plug-in; bad ones are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import fltune
from fltune.cli import main
from fltune.data.datasets import load_dataset
from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.models import build_model
from fltune.plugins import label, shipped
from fltune.tune.command import StudyRequest
from fltune.tune.search import resolve_space
from tests.plugin_helpers import DATA, SMOOTH, TINY, write_method, write_package, write_space
from tests.tune.helpers import study_runs


@pytest.fixture()
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A method file and a data file in a folder of the user's, which is the working folder; each test
    gets its modules afresh (a file is imported as the module named after it)."""
    folder = tmp_path / "mine"
    write_method(folder)
    (folder / "mydata.py").write_text(DATA)
    monkeypatch.chdir(folder)
    for name in ("smooth", "mydata"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return folder


def test_a_method_in_a_file_is_a_method_like_the_built_ins(user_code: Path) -> None:
    cfg = fltune.Config(method="./smooth.py:LabelSmooth", **{"method.eps": 0.2})
    assert cfg.method.name == f"{user_code / 'smooth.py'}:LabelSmooth"  # absolute: workers load the same file
    method = get_method(cfg.method.name)
    assert method.__name__ == "LabelSmooth" and issubclass(method, fltune.Method)
    assert cfg.method.params.eps == 0.2 and "eps: 0.2" in cfg.to_yaml()
    assert get_method(f"{cfg.method.name}+man").__name__.startswith("LabelSmooth")  # modifiers compose with it
    assert shipped() and str(user_code / "smooth.py") in shipped()  # what joining a cluster sends along


def test_a_module_reference_and_its_package_shipped(user_code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = user_code / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "smooth.py").write_text((user_code / "smooth.py").read_text())
    monkeypatch.syspath_prepend(str(user_code))
    cfg = fltune.Config(method="mypkg.smooth:LabelSmooth")
    assert cfg.method.name == "mypkg.smooth:LabelSmooth"
    assert sys.modules["mypkg"] in shipped()


@pytest.mark.parametrize(("reference", "expected"), [
    ("./smooth.py:Nope", "smooth.py has no 'Nope'; expected package.module:Name or path/to/file.py:Name naming "
                         "a subclass of fltune.Method"),
    ("./absent.py:Mine", "absent.py:Mine': no such file; expected"),
    ("no_such_package.mod:Mine", "cannot import no_such_package.mod (ModuleNotFoundError"),
    ("json:dumps", "'json:dumps' is the function dumps; expected a subclass of fltune.Method"),
    ("json:JSONDecoder", "'json:JSONDecoder' is the class JSONDecoder; expected a subclass of fltune.Method"),
    ("./smooth.py:F", "smooth.py:F': F is a module; expected"),
])
def test_a_bad_method_reference_is_one_line_and_exit_2(user_code, reference, expected, capsys) -> None:
    assert main(["run", "--method", reference, "--dataset", "synthetic", "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fltune: method.name: ") and expected in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_a_method_without_cost_declarations_runs_without_those_figures(
        ray_session, user_code: Path, tmp_path: Path, capsys) -> None:
    """Issue 77: ``stored_models`` and ``passes_per_step`` are optional; undeclared, the figures resting on them
    are left out, said in one line, never a silent 1 (the rest of the cost figures stay)."""
    (user_code / "nocost.py").write_text(SMOOTH.replace("    stored_models = 1.0\n    passes_per_step = 1.0\n", ""))
    tiny = [f"--set={key}={value}" for key, value in {**TINY, "federation.rounds": 1, "resources.workers": 1}.items()]
    out = tmp_path / "out.json"
    assert main(["run", "--method", "./nocost.py:LabelSmooth", *tiny, "--no-mlflow", "--json-out", str(out)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("not measured")]
    assert said == ["not measured: cost/cost_cum_tflops, cost_stored_params: LabelSmooth declares no "
                    "passes_per_step; LabelSmooth declares no stored_models"]
    figures = json.loads(out.read_text())
    assert "cost_cum_up_gbit" in figures and "cost_cum_tflops" not in figures, sorted(figures)


def test_a_hook_with_the_wrong_signature_is_refused_at_resolution(user_code: Path, capsys) -> None:
    """Issue 74: ``local_loss(self, ctx, x, y)`` (an older contract) ended in a traceback from a worker; now
    ``run`` refuses it in one line with the signature ``Method`` declares."""
    (user_code / "oldsig.py").write_text((user_code / "smooth.py").read_text().replace(
        "def local_loss(self, batch):", "def local_loss(self, ctx, x, y):"))
    assert main(["run", "--method", "./oldsig.py:LabelSmooth", "--dataset", "synthetic", "--no-mlflow"]) == 2
    assert capsys.readouterr().err == (
        f"fltune: method.name: '{user_code / 'oldsig.py'}:LabelSmooth': LabelSmooth.local_loss(self, ctx, x, y) "
        "does not take the hook's arguments; expected local_loss(self, batch: Batch) -> tuple[torch.Tensor, "
        "torch.Tensor]\n")


@pytest.mark.parametrize("hook", ["client_model_state", "local_model"])
def test_a_hook_an_earlier_contract_had_is_refused_not_ignored(user_code: Path, hook: str, capsys) -> None:
    """Issue 77 folded these two into one rule of the engine's; a method overriding one would train without it."""
    (user_code / f"{hook}.py").write_text((user_code / "smooth.py").read_text().replace(
        "    def local_loss(self, batch):", f"    def {hook}(self, *args):\n        return None\n\n"
                                           "    def local_loss(self, batch):"))
    assert main(["run", "--method", f"./{hook}.py:LabelSmooth", "--dataset", "synthetic", "--no-mlflow"]) == 2
    assert capsys.readouterr().err == (
        f"fltune: method.name: '{user_code / f'{hook}.py'}:LabelSmooth': LabelSmooth.{hook} is no longer a hook, "
        "so it would never be called; a client's weights are the global ones overridden by its state['personal']\n")


@pytest.mark.parametrize(("slip", "meant"), [("def locl_loss(self, batch):", "local_loss"),
                                             ("stored_model = 1.0", "stored_models")])
def test_a_hook_or_setting_misspelt_is_refused_not_ignored(user_code: Path, slip: str, meant: str, capsys) -> None:
    """A misspelt hook left the method training as FedAvg, silently."""
    file = user_code / f"{meant}_slip.py"  # a module name of each case's own
    file.write_text((user_code / "smooth.py").read_text().replace(
        "    def local_loss(self, batch):", f"    {slip}\n        return super().local_loss(batch)\n\n"
                                           "    def local_loss(self, batch):" if slip.startswith("def") else
        f"    {slip}\n\n    def local_loss(self, batch):"))
    assert main(["run", "--method", f"./{file.name}:LabelSmooth", "--dataset", "synthetic", "--no-mlflow"]) == 2
    typed = slip.split()[1].split("(")[0] if slip.startswith("def") else slip.split()[0]
    assert capsys.readouterr().err == (
        f"fltune: method.name: '{file}:LabelSmooth': LabelSmooth.{typed} is no hook or setting of "
        f"fltune.Method, so it would never be read; did you mean {meant}?\n")


def test_a_space_naming_a_parameter_the_method_lacks_is_one_line(user_code: Path) -> None:
    space = write_space(user_code, "./smooth.py:LabelSmooth", params={"method.mu": {"type": "choice", "values": [1]}})
    with pytest.raises(FLTuneError, match=r"params.method.mu: not a parameter of .*smooth.py:LabelSmooth; "
                                          r"allowed: eps"):
        resolve_space(StudyRequest(space=str(space)))


def test_a_space_beside_its_method_names_it_relative_to_itself(user_code: Path, tmp_path, monkeypatch) -> None:
    space = write_space(user_code, "./smooth.py:LabelSmooth")
    monkeypatch.chdir(tmp_path)  # elsewhere: the reference is read from the space file's folder
    _, method, tree = resolve_space(StudyRequest(space=str(space)))
    assert fltune.Config(**tree).method.name == f"{user_code / 'smooth.py'}:LabelSmooth"


@pytest.mark.slow
def test_a_study_of_a_method_one_folder_down_finds_it_and_fails_when_a_trial_did(
        ray_session, user_code: Path, tmp_path: Path, mlflow_uri: str, monkeypatch, capsys) -> None:
    """Issues 74 and 78: ``method: ./mine/smooth.py:…`` in a space, run from elsewhere. Its trials once looked for
    the file in Tune's working folders ("no such file") and a study with a failed trial exited 0 naming the
    survivor best. The reference is made absolute as the study is created (the saved study keeps it); a trial that
    raises (here eps > 0.2: the seeded sampler draws 0.1646, then 0.2146) ends the study with a line naming it,
    exit 1 and its MLflow parent FAILED."""
    fails = "        if self.params.eps > 0.2:\n            raise ValueError('too smooth')\n"
    (user_code / "smooth.py").write_text(SMOOTH.replace(
        "    def local_loss(self, batch):\n", "    def local_loss(self, batch):\n" + fails))
    space = write_space(tmp_path, "./mine/smooth.py:LabelSmooth")
    monkeypatch.chdir(tmp_path.parent)
    args = ["tune", "--space", str(space), "--storage", str(tmp_path), "--name", "s", "--set", "tracking.enabled=true"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "no such file" not in err and "best " in err
    saved = json.loads((tmp_path / "s" / "fltune_study.json").read_text())
    assert saved["method"] == f"{user_code / 'smooth.py'}:LabelSmooth"
    parent, children = study_runs(mlflow_uri)
    failed = [c.data.tags["fltune.trial_id"] for c in children if c.data.tags["fltune.status"] == "failed"]
    # the failed trial's run says why, as a run's does (tag and description)
    assert ["ValueError: too smooth" in c.data.tags.get("fltune.error", "") for c in children] == \
        [c.data.tags["fltune.status"] == "failed" for c in children]
    assert err.splitlines()[-1] == f"fltune: 1 of 2 trials failed ({failed[0]}); their errors are above", err
    assert parent.info.status == "FAILED" and parent.data.tags["fltune.trials_failed"] == "1"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["worker", pytest.param("driver", marks=pytest.mark.extended)])
def test_a_bug_in_the_users_loss_is_one_line_naming_their_file(
        ray_session, user_code: Path, where: str, mlflow_uri: str, capsys) -> None:
    """Issue 78: per-sample losses from ``local_loss`` ended in torch's 53-line traceback ("grad can be implicitly
    created only for scalar outputs") without the user's file; an error raised in their code likewise. Now one line
    with their file:line, exit 1, the run FAILED, whether a Ray worker or the driver's own share trained it."""
    (user_code / f"persample_{where}.py").write_text(SMOOTH.replace("return per_sample, logits",
                                                           "return per_sample[:, None], logits"))
    (user_code / f"raises_{where}.py").write_text(SMOOTH.replace(
        "        logits = batch.forward", "        raise KeyError('oops')\n        logits = batch.forward"))
    tiny = [f"--set={key}={value}" for key, value in {**TINY, "federation.rounds": 1}.items()]
    share = ["--set=resources.workers=2", "--set=resources.driver_worker=true"] if where == "driver" else []
    for file, line, error in [
            (f"persample_{where}.py", 19, "LabelSmooth.local_loss returned a loss of shape [64, 1], not one number "
                                          "(grad can be implicitly created only for scalar outputs)"),
            (f"raises_{where}.py", 20, "KeyError: 'oops'")]:
        assert main(["run", "--method", f"./{file}:LabelSmooth", *tiny, *share]) == 1, capsys.readouterr().err
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == f"fltune: {user_code / file}:{line}: {error}", err[-5:]
        assert "Traceback" not in "\n".join(err)
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("fltune").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"]


def test_compare_takes_references_and_names_their_files_safely(user_code: Path) -> None:
    from fltune.compare.spec import parse_methods

    # made absolute where the comparison is created: its cells run in Tune's working folders (issue 74)
    assert parse_methods(["./smooth.py:LabelSmooth", "fedavg"]) == [f"{user_code / 'smooth.py'}:LabelSmooth", "fedavg"]
    assert label(f"{user_code / 'smooth.py'}:LabelSmooth") == "smooth.LabelSmooth"
    with pytest.raises(FLTuneError, match="--methods: unknown method 'nope'"):
        parse_methods(["nope", "fedavg"])


def test_a_dataset_and_a_model_of_the_users(user_code: Path) -> None:
    cfg = fltune.Config(**{"data.dataset": "./mydata.py:blobs", "model.name": "./mydata.py:small",
                           "model.options": {"hidden": 8}})
    data = load_dataset(cfg.data.dataset)
    assert (data.name, data.num_classes, data.augment) == ("mydata.blobs", 3, "none")
    assert data.train_x.shape == (180, 1, 6, 6) and data.train_x.dtype.is_floating_point is False
    assert len(data.mean) == len(data.std) == 1  # computed from the train split: none were given
    model = build_model(cfg.model.name, (1, 6, 6), 3, hidden=8)
    assert isinstance(model, fltune.SplitModel) and model.feature_dim == 8


def test_a_torchvision_style_dataset_becomes_uint8_splits(user_code: Path) -> None:
    (user_code / "pairs.py").write_text('''import numpy as np
import fltune

class Pairs:
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i): return np.full((4, 5, 3), i, dtype=np.uint8), i % 2

def load(root, download):
    return fltune.UserDataset(Pairs(6), Pairs(4), num_classes=2, mean=(0.5,) * 3, std=(0.25,) * 3)
''')
    data = load_dataset(fltune.Config(**{"data.dataset": "./pairs.py:load"}).data.dataset)
    assert data.train_x.shape == (6, 3, 4, 5) and int(data.train_x[5].max()) == 5
    assert data.train_y.tolist() == [0, 1, 0, 1, 0, 1] and data.mean == (0.5,) * 3


def test_a_dataset_whose_labels_exceed_its_classes_is_one_line(user_code: Path) -> None:
    (user_code / "wide.py").write_text("import torch\nimport fltune\n\ndef load(root, download):\n"
                                       "    x, y = torch.zeros(8, 1, 4, 4), torch.arange(8) % 4\n"
                                       "    return fltune.UserDataset((x, y), (x, y), num_classes=3)\n")
    with pytest.raises(FLTuneError, match=r"data.dataset: '.*wide.py:load': its train labels lie in \[0, 3\]; "
                                          r"expected integers in \[0, 3\) \(its num_classes\)"):
        load_dataset(fltune.Config(**{"data.dataset": "./wide.py:load"}).data.dataset)


def test_a_model_that_is_no_split_model_is_refused(user_code: Path) -> None:
    (user_code / "flat.py").write_text("from torch import nn\n\ndef flat(in_shape, num_classes):\n"
                                       "    return nn.Linear(3, num_classes)\n")
    with pytest.raises(FLTuneError, match=r"model.name: '.*flat.py:flat' built a Linear; expected a model builder"):
        build_model(fltune.Config(**{"model.name": "./flat.py:flat"}).model.name, (1, 6, 6), 3)


@pytest.fixture()
def installed(tmp_path: Path) -> Iterator[None]:
    """The plug-in package pip-installed into this environment (its own pyproject with entry points), where
    Ray's worker processes find it too, and uninstalled after."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(write_package(tmp_path / "pkg"))],
                   check=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    try:
        yield
    finally:
        subprocess.run([*pip, "uninstall", "--yes", "fltune-smooth"], check=True,
                       env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})


@pytest.mark.slow
def test_an_installed_plug_in_is_listed_and_runs(installed: None, capsys) -> None:
    assert main(["methods"]) == 0
    listing = "".join(capsys.readouterr())  # stderr's console today; stdout is where listings belong
    assert "smoothed" in listing and "fltune-smooth 0.1.0 (fltune_smooth.methods:LabelSmooth)" in listing
    cfg = fltune.Config(**{**TINY, "method": "smoothed", "data.dataset": "blobs", "model.name": "blob_net",
                           "federation.rounds": 1, "resources.workers": 1, "tracking.enabled": False})
    result = fltune.run(cfg, progress=False)
    assert result.status == "finished" and 0 < result.metrics["acc_global"] <= 1
