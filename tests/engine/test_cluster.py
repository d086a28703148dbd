"""Starting Ray for a command: its workers run the driver's own fltune."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ray.tune import ExperimentAnalysis

import fltune
from fltune.engine.cluster import check_gcs
from fltune.errors import FLTuneError
from tests.plugin_helpers import TINY, write_method
from tests.tune.test_cluster import ISOLATED, free_port, two_nodes  # noqa: F401  (two_nodes: a fixture)

REPO = Path(fltune.__file__).resolve().parents[1]

WHERE = """
import sys
import ray
from fltune.engine.cluster import ensure_ray

ensure_ray()


@ray.remote
def where():
    import fltune
    return fltune.__file__, sys.unraisablehook is not sys.__unraisablehook__


print(*ray.get(where.remote()))
ray.shutdown()
"""


def test_workers_import_the_fltune_of_the_driver_not_the_installed_one(tmp_path: Path):
    """A driver run from another checkout (``python cli.py`` in a clone, a benchmark's older tree) must have
    its workers run that checkout's code, with the quieting hook applied; the hook's module-name form made
    every worker import the installed fltune instead."""
    checkout = tmp_path / "checkout"
    shutil.copytree(Path(fltune.__file__).parent, checkout / "fltune", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "where.py").write_text(WHERE)
    out = subprocess.run([sys.executable, "where.py"], cwd=checkout, capture_output=True, text=True, timeout=180,
                         env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})  # its own Ray
    assert out.returncode == 0, out.stderr[-2000:]
    path, hooked = out.stdout.split()[-2:]
    assert Path(path).resolve() == (checkout / "fltune" / "__init__.py").resolve()
    assert hooked == "True"


def test_check_gcs_asks_host_port_addresses_only() -> None:
    for address in (None, "", "auto", "local", "ray://head:10001"):
        check_gcs(address)  # Ray answers these itself
    with pytest.raises(FLTuneError, match="no Ray cluster answers there"):
        check_gcs(f"127.0.0.1:{free_port()}")


@pytest.mark.slow
@pytest.mark.extended
def test_compare_with_a_method_file_on_a_two_node_cluster(two_nodes: str, tmp_path: Path) -> None:
    """``--methods ./smooth.py:LabelSmooth,fedavg --address`` joins the cluster with the file among Ray's
    ``py_modules``, and each method's cell trains on a node of its own (one 1-CPU worker each)."""
    folder = tmp_path / "mine"
    write_method(folder)
    settings = [f"--set={key}={value}" for key, value in {**TINY, "federation.rounds": 1, "resources.workers": 1,
                                                          "tracking.enabled": False}.items()]
    proc = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "compare", "--methods", "./smooth.py:LabelSmooth,fedavg", "--seeds",
         "1", "--address", two_nodes, "--storage", str(tmp_path / "jobs"), "--name", "cmp", "--out",
         str(tmp_path / "out"), *settings],
        cwd=folder, capture_output=True, text=True, timeout=600, env={**os.environ, **ISOLATED})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = ExperimentAnalysis(str(tmp_path / "jobs" / "cmp")).trials
    assert sorted(t.status for t in trials) == ["TERMINATED", "TERMINATED"]
    assert len({t.last_result["worker_nodes"] for t in trials}) == 2  # both nodes trained a cell
    assert "smooth.py:LabelSmooth" in (tmp_path / "out" / "compare.md").read_text()
