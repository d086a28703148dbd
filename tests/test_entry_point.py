"""The installed ``fltune`` command (``[project.scripts]`` in pyproject.toml) and where it keeps its runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

from fltune.cli import entry
from fltune.tracking.paths import default_uri, mlruns_dir
from fltune.tune.storage import storage_root

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


def test_fltune_command_runs_from_any_folder_and_logs_there(tmp_path) -> None:
    helped = fltune("--help", cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: fltune")

    proc = fltune("run", "--dataset", "synthetic", "--model", "mlp", "--clients", "4", "--fraction", "0.5",
                  "--rounds", "1", "--local-epochs", "1", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
